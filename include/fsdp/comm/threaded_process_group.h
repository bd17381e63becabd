// In-process ProcessGroup: N ranks as N threads of one process. For fast tests of many ranks.
#pragma once

#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

struct ThreadedWorld;

/// ProcessGroup whose ranks are threads of this process, exchanging tensors through shared memory.
/// Same semantics, call-order rule and validation as the MPI backend; used by the `dist` test tier.
/// Each rank's ops run on that rank's communication thread; a rank is typically driven by one
/// std::thread of the test. Works on CPU tensors.
class ThreadedProcessGroup final : public ProcessGroup {
 public:
  /// Creates a world of world_size ranks; element r is rank r's group. Not collective (one call).
  static std::vector<std::shared_ptr<ProcessGroup>> create_world(int world_size);

  ~ThreadedProcessGroup() override;
  std::string backend_name() const override { return "threaded"; }

  ThreadedProcessGroup(std::shared_ptr<ThreadedWorld> world, int rank,
                       std::shared_ptr<CommStats> stats);

 private:
  void run_all_gather(const at::Tensor& output, const at::Tensor& input) override;
  void run_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  void run_all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  void run_broadcast(const at::Tensor& tensor, int root) override;
  void run_barrier() override;
  std::shared_ptr<ProcessGroup> run_split(int color, int key) override;

  std::shared_ptr<ThreadedWorld> world_;
};

}  // namespace fsdp::comm
