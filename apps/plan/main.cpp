// fsdp-plan: answers "DDP or FSDP, and which stage?" with numbers, from a laptop or on the cluster.
//
//   fsdp-plan --model llama2-13b --world-size 64 --mixed-precision bf16 --profile h100 [--json]
//   mpirun -n N fsdp-plan --calibrate --out PROFILE.json [--model micro --seq-len 128]
//   torchrun --no-python --nproc-per-node N fsdp-plan --calibrate --out PROFILE.json
//   fsdp-plan --profile PROFILE.json --model micro --world-size 2 ...
//
// Contents (apps/plan/)
//   main.cpp        this file: flags, plan or calibrate, exceptions -> exit codes.
//   plan_flags.*    every flag (CLI11) and the planner inputs they resolve to (model preset and
//                   overrides, fsdp-train's batch geometry, profile, memory).
//   report.*        the terminal tables and the recommendation.
//   calibrate.*     --calibrate: collectives over the world group (MPI or Gloo), at::mm rates, the profile file.
// The formulas are the planner library's (include/fsdp/planner/, docs/planner.md).
//
// Exit codes: 0 done (or --help); 2 a bad flag or setting (one line on stderr); 1 any other error
// (under --calibrate, a rank's error aborts the job: its peers may wait in a collective).
#include <unistd.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "fsdp/comm/job_channel.h"
#include "fsdp/comm/world.h"
#include "fsdp/common/check.h"
#include "plan/calibrate.h"
#include "plan/plan_flags.h"
#include "plan/report.h"

namespace {

using apps::plan::launcher_rank;

// This process's rank: the job's once a world group exists (--calibrate), else the launcher's
// (planning runs no collective and starts no MPI or Gloo: under `mpirun -n N` only rank 0 prints).
int this_rank() {
  const fsdp::comm::JobChannel& job = fsdp::comm::job_channel();
  return job.size() > 1 ? job.rank() : launcher_rank();
}

// After a runtime error in a job of more than one rank: the peers may wait in a collective this
// rank will never join, so the job is aborted (exit 1 everywhere).
void abort_peers() {
  if (fsdp::comm::job_channel().size() > 1) fsdp::comm::job_channel().abort_job(1);
}

int run_calibrate(const apps::plan::PlanFlags& flags) {
  fsdp::comm::ProcessGroupPtr world = fsdp::comm::world_from_env(flags.backend);
  {  // --out is checked before anything is measured, on every rank alike (the same path)
    const std::filesystem::path out(flags.out);
    const std::filesystem::path dir = out.parent_path().empty() ? std::filesystem::path(".") : out.parent_path();
    std::error_code ec;
    if (std::filesystem::is_directory(out, ec)) {
      throw apps::plan::UsageError("--out '" + flags.out + "' is a directory, expected a file path");
    }
    if (!std::filesystem::is_directory(dir, ec) || access(dir.c_str(), W_OK | X_OK) != 0) {
      throw apps::plan::UsageError("--out '" + flags.out + "': its directory '" + dir.string() +
                                   "' does not exist or cannot be written");
    }
  }
  const fsdp::planner::DeviceProfile p = apps::plan::calibrate(flags, *world, std::cout);
  if (world->rank() == 0) {
    std::ofstream out(flags.out, std::ios::trunc);
    out << fsdp::planner::profile_to_json(p);
    if (!out) throw std::runtime_error("cannot write profile '" + flags.out + "'");
    std::cout << "wrote " << flags.out << std::endl;
  }
  world->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int exit_code = 0;
  std::optional<apps::plan::PlanFlags> flags = apps::plan::parse_plan_flags(argc, argv, launcher_rank(), &exit_code);
  if (!flags) return exit_code;
  try {
    if (flags->calibrate) return run_calibrate(*flags);
    const fsdp::planner::PlanInputs in = apps::plan::resolve_inputs(*flags);
    const fsdp::planner::Plan plan = fsdp::planner::make_plan(in);
    if (launcher_rank() == 0) {
      std::cout << (flags->json ? fsdp::planner::plan_to_json(plan)
                                : apps::plan::format_plan(plan, {flags->compute_efficiency.has_value(),
                                                                 flags->profile_given, flags->ranks_per_node > 0}));
    }
    return 0;
  } catch (const apps::plan::UsageError& e) {
    if (this_rank() == 0) std::cerr << "fsdp-plan: error: " << e.what() << std::endl;  // same on every rank
    return 2;
  } catch (const fsdp::Error& e) {
    const bool usage = e.kind() == fsdp::ErrorKind::kInvalidArgument;
    // Planning: the same error on every rank, printed once; calibrating: each rank its own.
    if (flags->calibrate || this_rank() == 0) std::cerr << "fsdp-plan: error: " << e.message() << std::endl;
    if (!usage && flags->calibrate) abort_peers();
    return usage || e.kind() == fsdp::ErrorKind::kIo || e.kind() == fsdp::ErrorKind::kCorruptData ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "fsdp-plan: error: " << e.what() << std::endl;
    abort_peers();
    return 1;
  }
}
