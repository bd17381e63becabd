// fsdp-plan --calibrate: this machine's profile, measured over the real MPI group.
#pragma once

#include <ostream>

#include "fsdp/comm/process_group.h"
#include "fsdp/planner/profile.h"
#include "plan/plan_flags.h"

namespace apps::plan {

/// Measures, on every rank of `world` at once (collective; every rank calls it with the same
/// flags):
///  - at world size >= 2: all-gather, reduce-scatter and all-reduce of fp32 tensors of 4 KiB ..
///    32 MiB logical bytes and of the model's own message sizes up to 256 MiB ([Note: collective
///    sizes] in calibration/collective_timing.h; the median of several repetitions, the slowest rank's time), kept
///    as points (the time model interpolates them within a node) and fitted to t = alpha + beta x
///    bytes per kind, turned into ring link parameters at this world size (one rank measures
///    none: its profile has has_collectives false and plans N = 1 only);
///  - the fp32, bf16 and fp16 FLOP rates of at::mm over the forward matmul shapes of flags' model,
///    rows = micro-batch x sequence length (each shape weighted by its share of the model's FLOPs;
///    the slowest rank's rate), with flags.threads intra-op threads per rank;
///  - the model rate ([Note: model rate] in calibration/training_pass.h): a training forward + backward of the
///    model's module, fp32 and bf16 (fp16 when flags ask for it);
///  - the step update's seconds per tensor by its size for AdamW, SGD with and without momentum;
///  - the rate of a large tensor copy (the engine's copies on the compute thread);
///  - whether communication can overlap compute (ranks on this node x (threads + 1) <= cores) and,
///    where it cannot, each collective kind's shared-core factor and, where compute oversubscribes
///    the cores, its duration factor ([Note: collectives beside compute] in calibration/beside_compute.h);
///  - memory per rank: physical memory / ranks on this node.
/// Progress lines go to `log` on rank 0. Throws fsdp::Error when a collective fails.
fsdp::planner::DeviceProfile calibrate(const PlanFlags& flags, fsdp::comm::ProcessGroup& world, std::ostream& log);

}  // namespace apps::plan
