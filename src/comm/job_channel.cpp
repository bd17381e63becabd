#include "fsdp/comm/job_channel.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace fsdp::comm {
namespace {

class SingleProcessChannel final : public JobChannel {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::vector<int> gather_ints(int mine, double) override { return {mine}; }
  [[noreturn]] void abort_job(int code) override {
    std::fflush(nullptr);
    std::_Exit(code == 0 ? 1 : code);
  }
};

std::shared_ptr<JobChannel>& installed() {
  static std::shared_ptr<JobChannel> channel = std::make_shared<SingleProcessChannel>();
  return channel;
}

}  // namespace

JobChannel& job_channel() { return *installed(); }

void set_job_channel(std::shared_ptr<JobChannel> channel) { installed() = std::move(channel); }

}  // namespace fsdp::comm
