// gtest main for the `mpi` and `gloo` tiers: every rank runs the same tests; rank 0 prints
// everything, the others their failures only; the exit code is non-zero on every rank if any rank
// failed. FSDP_TEST_BACKEND (auto, mpi or gloo; default auto: gloo under torchrun, MPI under
// mpirun) chooses the world group's backend, so that the same tests run over both.
#include <gtest/gtest.h>

#include <cstdlib>

#include "fsdp/accounting/memory.h"
#include "fsdp/comm/world.h"
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
  const char* backend = std::getenv("FSDP_TEST_BACKEND");
  auto world = fsdp::comm::world_from_env(backend && *backend ? backend : "auto");
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
