#include "fsdp/comm/simulated_backend.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "fsdp/common/check.h"

namespace fsdp::comm {
namespace {

class SimulatedBackend final : public Backend {
 public:
  SimulatedBackend(int rank, int size) : rank_(rank), size_(size), hosts_(static_cast<size_t>(size), 0) {}

  std::string name() const override { return "simulated"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  c10::DeviceType device_type() const override { return c10::DeviceType::Meta; }
  int64_t max_elements() const override { return std::numeric_limits<int64_t>::max(); }
  bool simulated() const override { return true; }
  // One host: a dry run accounts bytes per rank, not where they travel.
  const std::vector<int>& host_of_ranks() const override { return hosts_; }

  void all_gather(const at::Tensor& output, const at::Tensor& input) override {
    if (output.is_meta()) return;
    // Metadata of this process: every simulated rank holds the same (see simulated_world).
    at::NoGradGuard no_grad;
    at::Tensor in = input.is_meta() ? at::Tensor() : input.reshape({1, -1});
    FSDP_CHECK(in.defined(), ErrorKind::kUnsupported, where("all_gather"),
               "a cpu output cannot be gathered from a meta input");
    output.view({size_, -1}).copy_(in.expand({size_, in.size(1)}));
  }
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp) override {
    refuse_values("reduce_scatter", output, input);
  }
  void all_reduce(const at::Tensor& tensor, ReduceOp) override { refuse_values("all_reduce", tensor, tensor); }
  void all_to_all(const at::Tensor& output, const at::Tensor& input) override {
    refuse_values("all_to_all", output, input);
  }
  void broadcast(const at::Tensor& tensor, int) override { refuse_values("broadcast", tensor, tensor); }
  void barrier() override {}
  std::unique_ptr<Backend> split(int, int) override {
    throw Error(ErrorKind::kUnsupported, where("split"),
                "a simulated group cannot split by arbitrary colors (the other ranks' colors are "
                "unknown); use ProcessGroup::split_blocks");
  }
  std::unique_ptr<Backend> split_blocks(int block, bool strided) override {
    if (strided) return std::make_unique<SimulatedBackend>(rank_ / block, size_ / block);
    return std::make_unique<SimulatedBackend>(rank_ % block, block);
  }
  // Another simulated rank: its all-gather of a CPU tensor (the collective check's signatures)
  // returns this rank's input in every block, so the check passes as in a job of alike ranks.
  std::unique_ptr<Backend> make_control_channel() override { return std::make_unique<SimulatedBackend>(rank_, size_); }
  [[noreturn]] void abort_job(int code) override { std::_Exit(code); }

 private:
  ErrorContext where(const char* op) const { return ErrorContext{rank_, "", op}; }
  // Meta tensors: nothing to move. CPU tensors: the result depends on the other ranks' values.
  void refuse_values(const char* op, const at::Tensor& a, const at::Tensor& b) const {
    if (a.is_meta() && b.is_meta()) return;
    throw Error(ErrorKind::kUnsupported, where(op),
                str_cat(op, " of a ", a.device(), " tensor needs the values of the other ", size_ - 1,
                        " ranks, which a simulated group (dry run) does not have; only meta tensors "
                        "can be reduced"));
  }

  int rank_;
  int size_;
  std::vector<int> hosts_;  // all on host 0
};

}  // namespace

std::unique_ptr<Backend> simulated_backend(int world_size, int rank) {
  FSDP_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, ErrorKind::kInvalidArgument,
             (ErrorContext{rank, "", "simulated_world"}),
             expected_actual("rank", str_cat("in [0, ", world_size, ") with world_size >= 1"), rank));
  return std::make_unique<SimulatedBackend>(rank, world_size);
}

ProcessGroupPtr simulated_world(int world_size, int rank, ProcessGroupOptions options) {
  return std::make_shared<ProcessGroup>(simulated_backend(world_size, rank), options, "simulated");
}

}  // namespace fsdp::comm
