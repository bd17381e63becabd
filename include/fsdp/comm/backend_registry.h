// The world backends a job can name (--backend of fsdp-train and fsdp-plan, world_from_env): one
// list, read by world setup and both apps, of what each is and whether this build has it.
#pragma once

#include <string>
#include <vector>

namespace fsdp::comm {

/// One backend a world group can run over.
struct WorldBackend {
  std::string name;         ///< what --backend takes: "mpi", "gloo", "nccl"
  bool built = false;       ///< whether this build has it (its world function is linked in)
  std::string description;  ///< one line: what it runs on and how its jobs are launched
  std::string needs;        ///< what a build needs to have it, for the refusal of one without it
  std::string instead;      ///< what to do in a build without it
  std::string tensors_on = "cpu";  ///< where the tensors of its collectives live: "cpu" or "cuda"
};

/// Every known world backend, in the order help texts list them: mpi (FSDP_WITH_MPI), gloo
/// (always), nccl (only a CUDA build, FSDP_WITH_CUDA, has it). Not collective; the same on every
/// rank of a job launched from one build.
const std::vector<WorldBackend>& world_backends();

/// The entry named `name`, or nullptr for a name no build knows.
const WorldBackend* find_world_backend(const std::string& name);

/// The names a --backend flag accepts: "auto", then every backend this build has.
std::vector<std::string> buildable_backend_names();

/// Help text of a --backend flag: what 'auto' picks, then each known backend's line, those this
/// build lacks marked "not in this build".
std::string backend_flag_help();

/// Why `name` cannot be asked for as a backend in this build, as one line: "" for "auto" and
/// for a backend this build has; "backend 'X' is not in this build (it needs ...): ..." for a
/// known one it lacks; "backend 'X': expected one of auto, mpi, gloo, nccl" for an unknown one.
/// Not collective; throws nothing.
std::string backend_refusal(const std::string& name);

/// backend_refusal(name), and for a program whose tensors live on the CPU (fsdp-train and
/// fsdp-plan today) also a backend whose collectives move device tensors: "backend 'nccl' moves
/// cuda tensors: <program> trains and measures on the CPU ...". Not collective; throws nothing.
std::string backend_refusal_for_cpu_program(const std::string& name, const std::string& program);

}  // namespace fsdp::comm
