// Tier `mpi`: every collective on the MPI backend, closed-form results; the collective check on
// the MPI control channel.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/collective_cases.h"
#include "../common/counting_backend.h"
#if FSDP_WITH_MPI
#include "fsdp/comm/mpi_backend.h"
#endif
#include "mpi_world.h"

TEST(MpiCollectives, ClosedFormAllOps) {
  fsdp_test::check_all_collectives(*fsdp_test::world());
  fsdp_test::check_validation(*fsdp_test::world());
}

// [Note: control channel] A group over the MPI backend of a duplicate of MPI_COMM_WORLD, as
// mpi_world builds it, with its control channel from MpiBackend::make_control_channel (an
// MPI_Comm_dup): the data communicator carries the user's ops only, the control one the
// signatures; a mismatch is still caught and named.
TEST(MpiControlChannel, TheDataCommunicatorSeesTheUsersOpsOnly) {
#if FSDP_WITH_MPI
  if (fsdp_test::world()->backend_name() != "mpi" || fsdp_test::world()->size() < 2) {
    GTEST_SKIP() << "needs the mpi backend and two or more ranks (world: " << fsdp_test::world()->backend_name()
                 << ", " << fsdp_test::world()->size() << " ranks)";
  }
  MPI_Comm dup;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &dup), MPI_SUCCESS);
  fsdp_test::BackendCounts data, control;
  fsdp::comm::ProcessGroup g(
      std::make_unique<fsdp_test::CountingBackend>(std::make_unique<fsdp::comm::MpiBackend>(dup), data, &control),
      fsdp::comm::ProcessGroupOptions::from_env());
  EXPECT_EQ(data.control_channels.load(), 1);
  EXPECT_EQ(g.control_backend_name(), "mpi");
  fsdp_test::check_control_channel_carries_the_check(g, data, control);
#else
  GTEST_SKIP() << "a build without MPI";
#endif
}

// The host layout the backend reports (ProcessGroup::host_of_ranks) against two independent
// sources: the host names of the ranks (gethostname; test hosts have their own) and the
// launcher's count of ranks on this node (OMPI_COMM_WORLD_LOCAL_SIZE; torchrun:
// LOCAL_WORLD_SIZE). Split groups inherit the layout of their members, and the stats' host split
// follows it. Under plain `mpirun -n N` (or torchrun) every rank is on one host; tests/multi_host
// runs this on 2 test hosts x 2 ranks.
TEST(MpiHosts, LayoutMatchesHostNamesAndTheLauncher) {
  auto& world = *fsdp_test::world();
  char name[256] = {0};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  const std::vector<std::string> names = fsdp::comm::all_gather_strings(world, name);
  const std::vector<int>& hosts = world.host_of_ranks();
  ASSERT_EQ(static_cast<int>(hosts.size()), world.size());
  for (int a = 0; a < world.size(); ++a) {
    for (int b = 0; b < world.size(); ++b) {
      EXPECT_EQ(hosts[a] == hosts[b], names[a] == names[b])
          << "ranks " << a << " (" << names[a] << ") and " << b << " (" << names[b] << ")";
    }
  }
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"}) {  // mpirun, torchrun
    if (const char* local = std::getenv(var)) EXPECT_EQ(world.ranks_on_my_host(), std::atoi(local)) << var;
  }
  // One rank of each host position: {ranks with the same index on their host}.
  int index_on_host = 0;
  for (int r = 0; r < world.rank(); ++r) index_on_host += hosts[r] == world.host();
  auto across = world.split(index_on_host, world.rank());
  std::vector<int> member_hosts;
  for (int r = 0; r < world.size(); ++r) {
    int idx = 0;
    for (int q = 0; q < r; ++q) idx += hosts[q] == hosts[r];
    if (idx == index_on_host) member_hosts.push_back(hosts[r]);
  }
  std::vector<int> order, dense;  // renumbered in order of first appearance
  for (int h : member_hosts) {
    auto it = std::find(order.begin(), order.end(), h);
    if (it == order.end()) it = order.insert(order.end(), h);
    dense.push_back(static_cast<int>(it - order.begin()));
  }
  EXPECT_EQ(across->host_of_ranks(), dense);
  auto inside = world.split(world.host(), world.rank());
  EXPECT_EQ(inside->num_hosts(), 1);
  EXPECT_EQ(inside->size(), world.ranks_on_my_host());
  // Stats: an all-gather of 1000 floats per rank over the world group.
  const auto before = world.stats().snapshot()[static_cast<int>(fsdp::comm::CollectiveKind::kAllGather)];
  auto out = at::zeros({1000 * world.size()}, at::kFloat);
  world.all_gather_into_tensor(out, at::ones({1000}, at::kFloat))->wait();
  const auto after = world.stats().snapshot()[static_cast<int>(fsdp::comm::CollectiveKind::kAllGather)];
  EXPECT_EQ(after.intra_host_bytes - before.intra_host_bytes, 4000 * (world.ranks_on_my_host() - 1));
  EXPECT_EQ(after.inter_host_bytes - before.inter_host_bytes, 4000 * (world.size() - world.ranks_on_my_host()));
}
