#pragma once
#include <memory>

#include "fsdp/comm/process_group.h"

namespace fsdp_test {
/// The MPI world group of the test process (set by mpi_main.cpp).
std::shared_ptr<fsdp::comm::ProcessGroup>& world();
}  // namespace fsdp_test
