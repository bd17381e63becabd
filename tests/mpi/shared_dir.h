// A temporary directory with the same path on every rank of the MPI world (tier `mpi`).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "mpi_world.h"

namespace fsdp_test {

/// Created by rank 0 under the system temp directory, removed at destruction (collective: every
/// rank constructs and destroys it at the same point).
struct SharedDir {
  explicit SharedDir(const std::string& tag) {
    auto g = world();
    at::Tensor token = at::tensor(
        {static_cast<int64_t>(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007)},
        at::kLong);
    g->broadcast(token, 0)->wait();
    path = (std::filesystem::temp_directory_path() /
            ("fsdp-" + tag + "-" + std::to_string(token.item<int64_t>())))
               .string();
    if (g->rank() == 0) std::filesystem::create_directories(path);
    g->barrier()->wait();
  }
  ~SharedDir() {
    world()->barrier()->wait();
    std::error_code ec;
    if (world()->rank() == 0) std::filesystem::remove_all(path, ec);
  }
  std::string sub(const std::string& name) const { return (std::filesystem::path(path) / name).string(); }
  std::string path;
};

}  // namespace fsdp_test
