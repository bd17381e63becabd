// The world group of a job, over the backend its launcher implies (mpirun: MPI; torchrun: Gloo).
#pragma once

#include <string>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

/// The backend to build the world over for `requested` ("auto" or a name of world_backends(),
/// backend_registry.h): "auto" is "gloo" when torchrun_environment() (RANK and WORLD_SIZE set, no
/// MPI launcher's variables) or when this build has no MPI, else "mpi"; a name is itself.
/// Throws fsdp::Error (kInvalidArgument) for an unknown name (listing the known ones), for "mpi"
/// in a torchrun environment (its ranks would not form one MPI job), and when only one of RANK
/// and WORLD_SIZE is set outside an MPI launcher; (kUnsupported) for a known backend this build
/// lacks ("mpi" without MPI, "nccl" without CUDA), with backend_refusal's line. Not collective.
std::string resolve_backend(const std::string& requested);

/// This process's rank as its launcher numbered it, from the environment (OMPI_COMM_WORLD_RANK,
/// PMIX_RANK, PMI_RANK, then torchrun's RANK); 0 when no launcher set one. Needs no world group.
int launcher_rank();

/// Initialises MPI (init_mpi) when this build has MPI and an MPI launcher started this process
/// (mpi_launcher_variable()), so that MPI_Init comes first there; does nothing otherwise (a
/// process started by hand initialises MPI only if it chooses the mpi backend).
void init_launcher();

/// True when this build has the MPI backend (FSDP_WITH_MPI).
bool mpi_available();

/// The group of all processes over resolve_backend(backend): mpi_world(options),
/// gloo_world(GlooRendezvous::from_env(), options), or (a CUDA build) nccl_world over the CPU
/// world "auto" picks, on the CUDA device device_for_rank gives (one rank per GPU of each host); the
/// returned pointer keeps that CPU world alive with the NCCL one. Collective: every process calls
/// it once, first. Errors: those of resolve_backend and of the chosen world function.
ProcessGroupPtr world_from_env(const std::string& backend = "auto",
                               const ProcessGroupOptions& options = ProcessGroupOptions::from_env());

}  // namespace fsdp::comm
