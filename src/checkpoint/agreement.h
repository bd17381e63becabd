// Error agreement across the ranks of a group (internal to the checkpoint subsystem).
//
// [Note: error agreement] Every phase that can fail locally (I/O, validation) runs inside
// Agreement::run: one all-reduce of "who failed", then, only on failure, an all-gather of the
// failing rank's message. Every rank then throws fsdp::Error (the failing rank its own message,
// the others "failed on rank R during <phase>: <R's message>"), so a local failure never leaves
// the other ranks blocked in the next collective, and a load writes nothing unless every rank has
// read and verified everything it needs.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"

namespace fsdp::checkpoint {

class Agreement {
 public:
  Agreement(comm::ProcessGroup& g, std::string op) : g_(g), op_(std::move(op)) {}

  template <typename Fn>
  void run(const char* phase, Fn&& fn) {
    std::string msg;
    try {
      fn();
    } catch (const std::exception& e) {
      msg = e.what();
      if (msg.empty()) msg = "unknown error";
    } catch (...) {
      msg = "unknown non-standard exception";
    }
    if (!msg.empty() && msg.rfind("[fsdp", 0) != 0) {
      msg = str_cat("[fsdp rank ", g_.rank(), "] ", op_, " (", phase, "): ", msg);
    }
    at::Tensor who = at::tensor({msg.empty() ? int64_t(-1) : int64_t(g_.rank())}, at::kLong);
    g_.all_reduce(who, comm::ReduceOp::kMax)->wait();
    const int64_t failed = who.item<int64_t>();
    if (failed < 0) return;
    constexpr int64_t kMsg = 1024;
    at::Tensor mine = at::zeros({kMsg}, at::kByte);
    std::memcpy(mine.data_ptr(), msg.data(), std::min<size_t>(msg.size(), kMsg - 1));
    at::Tensor all = at::empty({g_.size() * kMsg}, at::kByte);
    g_.all_gather_into_tensor(all, mine)->wait();
    if (!msg.empty()) throw Error(msg);
    std::string theirs(reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + failed * kMsg);
    throw Error(str_cat("[fsdp rank ", g_.rank(), "] ", op_, " failed on rank ", failed, " during ",
                        phase, ": ", theirs));
  }

 private:
  comm::ProcessGroup& g_;
  std::string op_;
};

}  // namespace fsdp::checkpoint
