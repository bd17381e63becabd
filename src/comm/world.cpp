#include "fsdp/comm/world.h"

#include <cstdlib>

#include "fsdp/comm/backend_registry.h"
#include "fsdp/comm/gloo_backend.h"
#include "fsdp/common/check.h"
#if FSDP_WITH_MPI
#include "fsdp/comm/mpi_backend.h"
#endif
#if FSDP_WITH_CUDA
#include "fsdp/comm/nccl_backend.h"
#endif

namespace fsdp::comm {

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK"}) {
    if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
  }
  return 0;
}

bool mpi_available() { return FSDP_WITH_MPI != 0; }

void init_launcher() {
#if FSDP_WITH_MPI
  // Only a process an MPI launcher started: a singleton MPI_Init in a process started by hand
  // would set PMIX_RANK and make it look launched by mpirun to the gloo rendezvous (mpi_world
  // initialises MPI itself when the mpi backend is chosen).
  if (mpi_launcher_variable()) init_mpi();
#endif
}

std::string resolve_backend(const std::string& requested) {
  const std::string refusal = backend_refusal(requested);
  FSDP_CHECK(refusal.empty() || find_world_backend(requested) != nullptr, ErrorKind::kInvalidArgument,
             (ErrorContext{-1, "", "world_from_env"}), refusal);
  // RANK without WORLD_SIZE, or the reverse, is a launch half set up by hand: under auto it would
  // train as independent jobs of one rank.
  check_rank_and_world_size_paired();
  // auto: gloo under torchrun; otherwise MPI (mpirun, or a single process), or gloo in a build
  // without MPI (a single process then forms a world of one).
  const std::string chosen =
      requested != "auto" ? requested : (torchrun_environment() || !mpi_available()) ? "gloo" : "mpi";
  // torchrun starts its ranks without an MPI launcher: each would be an MPI job of one rank.
  FSDP_CHECK(chosen != "mpi" || !torchrun_environment(), ErrorKind::kInvalidArgument,
             (ErrorContext{launcher_rank(), "", "world_from_env"}),
             "backend 'mpi' in a torchrun job (RANK, WORLD_SIZE set, no MPI launcher): its ranks would not "
             "form one MPI job; use the gloo backend under torchrun, or launch with mpirun");
  // A known backend this build lacks (mpi without MPI, nccl without CUDA).
  FSDP_CHECK(refusal.empty(), ErrorKind::kUnsupported, (ErrorContext{-1, "", "world_from_env"}), refusal);
  return chosen;
}

ProcessGroupPtr world_from_env(const std::string& backend, const ProcessGroupOptions& options) {
  const std::string chosen = resolve_backend(backend);
  if (chosen == "gloo") return gloo_world(GlooRendezvous::from_env(), options);
#if FSDP_WITH_MPI
  if (chosen == "mpi") return mpi_world(options);
#endif
#if FSDP_WITH_CUDA
  if (chosen == "nccl") {
    // The CPU world of the launcher (mpirun: MPI; otherwise Gloo) bootstraps NCCL and stays alive
    // with the returned group (it installed the job channel that abort_job uses).
    struct Worlds {
      ProcessGroupPtr bootstrap, nccl;  // nccl is destroyed first
    };
    auto worlds = std::make_shared<Worlds>();
    worlds->bootstrap = world_from_env("auto", options);
    worlds->nccl = nccl_world(worlds->bootstrap, device_for_rank(*worlds->bootstrap), options);
    return ProcessGroupPtr(worlds, worlds->nccl.get());
  }
#endif
  // A backend the registry says this build has, without a world function here.
  throw Error(ErrorKind::kUnsupported, ErrorContext{-1, "", "world_from_env"},
              str_cat("backend '", chosen, "' has no world function in this library"));
}

}  // namespace fsdp::comm
