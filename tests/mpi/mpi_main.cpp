// gtest main for the `mpi` tier: every rank runs the same tests; rank 0 prints everything, the
// others their failures only; the exit code
// is non-zero on every rank if any rank failed.
#include <gtest/gtest.h>

#include "fsdp/accounting/memory.h"
#include "fsdp/comm/mpi_backend.h"
#include "mpi_world.h"

namespace fsdp_test {
std::shared_ptr<fsdp::comm::ProcessGroup>& world() {
  static std::shared_ptr<fsdp::comm::ProcessGroup> w;
  return w;
}
}  // namespace fsdp_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  fsdp::accounting::install_counting_allocator();
  fsdp::comm::init_mpi();
  auto world = fsdp::comm::mpi_world();
  fsdp_test::world() = world;
  at::set_num_threads(1);
  if (world->rank() != 0) ::testing::GTEST_FLAG(brief) = true;  // other ranks print failures only
  int rc = RUN_ALL_TESTS();
  at::Tensor failed = at::tensor({static_cast<int64_t>(rc != 0)}, at::kLong);
  world->all_reduce(failed, fsdp::comm::ReduceOp::kMax)->wait();
  int any = static_cast<int>(failed.item<int64_t>());
  if (any && rc == 0 && world->rank() == 0) {
    std::fprintf(stderr, "[mpi tests] a test failed on another rank (rerun to see its output)\n");
  }
  if (rc != 0) {
    std::fprintf(stderr, "[mpi tests] rank %d: failures on this rank\n", world->rank());
  }
  fsdp_test::world().reset();
  world.reset();
  return any;
}
