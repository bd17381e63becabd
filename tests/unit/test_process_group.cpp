// Tier `unit`: ProcessGroup over hand-made backends: an error raised asynchronously on the
// communication thread comes back from Work::wait; validation happens on the calling thread;
// destroying a group drains its queue before the backend goes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"

using fsdp::comm::Backend;
using fsdp::comm::ProcessGroup;
using fsdp::comm::ReduceOp;

namespace {

// Rank 0 of a pretend 2-rank group: all_reduce doubles the tensor after `delay`, or fails with a
// collective error when the tensor's first element is negative. Counts what it ran and whether it
// was destroyed while an op ran.
struct Probe {
  std::atomic<int> ran{0};
  std::atomic<bool> running{false};
  std::atomic<bool> destroyed_while_running{false};
  std::atomic<bool> destroyed{false};
};

class FakeBackend final : public Backend {
 public:
  FakeBackend(Probe& probe, std::chrono::milliseconds delay) : probe_(probe), delay_(delay) {}
  ~FakeBackend() override {
    if (probe_.running) probe_.destroyed_while_running = true;
    probe_.destroyed = true;
  }
  std::string name() const override { return "fake"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
  int64_t max_elements() const override { return 1000; }
  void all_gather(const at::Tensor& out, const at::Tensor& in) override { out.view(-1).copy_(in.view(-1).repeat(2)); }
  void reduce_scatter(const at::Tensor&, const at::Tensor&, ReduceOp) override {}
  void all_reduce(const at::Tensor& t, ReduceOp) override {
    probe_.running = true;
    std::this_thread::sleep_for(delay_);
    const bool fail = t.view(-1)[0].item<double>() < 0;
    probe_.running = false;
    if (fail) {
      throw fsdp::Error(fsdp::ErrorKind::kCollective, fsdp::ErrorContext{0, "", "fake_allreduce"},
                        "the transport lost the peer");
    }
    t.mul_(2);
    probe_.ran++;
  }
  void all_to_all(const at::Tensor& out, const at::Tensor& in) override { out.copy_(in); }
  void broadcast(const at::Tensor&, int) override {}
  void barrier() override {}
  std::unique_ptr<Backend> split(int, int) override { return std::make_unique<FakeBackend>(probe_, delay_); }
  [[noreturn]] void abort_job(int) override { std::abort(); }

 private:
  Probe& probe_;
  std::chrono::milliseconds delay_;
};

}  // namespace

TEST(ProcessGroup, AsyncBackendErrorIsRethrownByWaitAndLaterOpsStillRun) {
  Probe probe;
  ProcessGroup g(std::make_unique<FakeBackend>(probe, std::chrono::milliseconds(20)));
  at::Tensor bad = at::full({4}, -1.0);
  at::Tensor good = at::full({4}, 3.0);
  auto w_bad = g.all_reduce(bad);     // fails on the communication thread, after the call returned
  auto w_good = g.all_reduce(good);   // queued behind it
  EXPECT_FALSE(w_bad->is_completed()) << "the op ran on the calling thread";
  for (int attempt = 0; attempt < 2; ++attempt) {  // every wait() rethrows the same error
    try {
      w_bad->wait();
      ADD_FAILURE() << "the backend's error was swallowed";
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kCollective);
      EXPECT_NE(std::string(e.what()).find("lost the peer"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[fsdp rank 0]"), std::string::npos) << e.what();
    }
  }
  w_good->wait();
  EXPECT_TRUE(at::equal(good, at::full({4}, 6.0)));
  EXPECT_EQ(probe.ran.load(), 1);
}

TEST(ProcessGroup, ValidationHappensOnTheCallingThreadBeforeAnythingIsQueued) {
  Probe probe;
  ProcessGroup g(std::make_unique<FakeBackend>(probe, std::chrono::milliseconds(0)));
  const auto before = g.stats().snapshot();
  auto expect_invalid = [&](auto&& issue, const char* needle) {
    try {
      issue();
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid([&] { g.all_reduce(at::empty({4}, at::TensorOptions().device(c10::kMeta))); }, "device");
  expect_invalid([&] { g.all_reduce(at::empty({1001})); }, "1000");  // the backend's element limit
  expect_invalid([&] { g.all_gather_into_tensor(at::empty({7}), at::empty({3})); }, "6 elements");
  expect_invalid([&] { g.all_to_all(at::empty({3}), at::empty({3})); }, "world size 2");
  expect_invalid([&] { g.all_reduce(at::empty({4, 4}).t()); }, "contiguous");
  const auto after = g.stats().snapshot();
  for (size_t k = 0; k < after.size(); ++k) EXPECT_EQ(after[k].calls, before[k].calls) << "a rejected op was counted";
  EXPECT_EQ(probe.ran.load(), 0);
}

TEST(ProcessGroup, DestructionFinishesQueuedOpsBeforeTheBackendGoes) {
  Probe probe;
  std::vector<at::Tensor> ts;
  std::vector<fsdp::comm::WorkPtr> works;
  {
    ProcessGroup g(std::make_unique<FakeBackend>(probe, std::chrono::milliseconds(15)));
    for (int i = 0; i < 4; ++i) {
      ts.push_back(at::ones({2}));
      works.push_back(g.all_reduce(ts.back()));
    }
  }  // destroyed with ops still queued
  EXPECT_TRUE(probe.destroyed.load());
  EXPECT_FALSE(probe.destroyed_while_running.load()) << "the backend was destroyed under a running op";
  EXPECT_EQ(probe.ran.load(), 4) << "queued ops were dropped";
  for (auto& w : works) {
    EXPECT_TRUE(w->is_completed());
    w->wait();
  }
  for (auto& t : ts) EXPECT_TRUE(at::equal(t, at::full({2}, 2.0)));
}
