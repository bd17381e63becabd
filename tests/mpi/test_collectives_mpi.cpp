// Tier `mpi`: every collective on the MPI backend, closed-form results.
#include <gtest/gtest.h>

#include "../common/collective_cases.h"
#include "mpi_world.h"

TEST(MpiCollectives, ClosedFormAllOps) {
  fsdp_test::check_all_collectives(*fsdp_test::world());
  fsdp_test::check_validation(*fsdp_test::world());
}
