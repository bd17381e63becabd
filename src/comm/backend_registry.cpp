#include "fsdp/comm/backend_registry.h"

#include "fsdp/common/check.h"

namespace fsdp::comm {
namespace {

// The CUDA build defines FSDP_WITH_CUDA (and supplies the nccl world); this one may not.
#if defined(FSDP_WITH_CUDA) && FSDP_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

}  // namespace

const std::vector<WorldBackend>& world_backends() {
  static const std::vector<WorldBackend> backends = {
      {"mpi", FSDP_WITH_MPI != 0, "MPI on CPU tensors; launch with mpirun (or srun)",
       "FSDP_WITH_MPI=ON, an MPI library at build time", "launch with torchrun or use --backend gloo"},
      {"gloo", true,
       "Gloo over TCP on CPU tensors; launch with torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT",
       "", ""},
      {"nccl", kWithCuda, "NCCL on CUDA tensors, one GPU per rank", "a CUDA build (FSDP_WITH_CUDA)",
       "use --backend mpi (mpirun) or gloo (torchrun)", "cuda"},
  };
  return backends;
}

const WorldBackend* find_world_backend(const std::string& name) {
  for (const WorldBackend& b : world_backends()) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

std::vector<std::string> buildable_backend_names() {
  std::vector<std::string> names{"auto"};
  for (const WorldBackend& b : world_backends()) {
    if (b.built) names.push_back(b.name);
  }
  return names;
}

std::string backend_flag_help() {
  std::string help = str_cat("'auto': gloo under torchrun, else ", FSDP_WITH_MPI ? "mpi" : "gloo (no MPI in this build)");
  for (const WorldBackend& b : world_backends()) {
    help += str_cat("; '", b.name, "': ", b.description, b.built ? "" : " (not in this build)");
  }
  return help;
}

std::string backend_refusal(const std::string& name) {
  if (name == "auto") return "";
  if (const WorldBackend* b = find_world_backend(name)) {
    return b->built ? "" : str_cat("backend '", name, "' is not in this build (it needs ", b->needs, "): ", b->instead);
  }
  std::string known = "auto";
  for (const WorldBackend& b : world_backends()) known += ", " + b.name;
  return str_cat("backend '", name, "': expected one of ", known);
}

std::string backend_refusal_for_cpu_program(const std::string& name, const std::string& program) {
  std::string refusal = backend_refusal(name);
  if (!refusal.empty()) return refusal;
  const WorldBackend* b = find_world_backend(name);
  if (b == nullptr || b->tensors_on == "cpu") return "";
  return str_cat("backend '", name, "' moves ", b->tensors_on, " tensors: ", program,
                 " runs on the CPU (it has no device flag yet); use --backend mpi (mpirun) or gloo (torchrun). "
                 "A program of one's own reaches it through fsdp::comm::world_from_env(\"", name, "\")");
}

}  // namespace fsdp::comm
