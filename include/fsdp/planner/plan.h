// The planner's answer (pure math): every strategy's memory, traffic and time for one model and
// cluster, and the recommendation "DDP or FSDP, and which stage?" with its reason.
// docs/planner.md, "Recommendation".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/planner/memory.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/planner/profile.h"
#include "fsdp/planner/setup.h"
#include "fsdp/planner/time_model.h"
#include "fsdp/planner/traffic.h"

namespace fsdp::planner {

/// Default share of the memory per rank kept free (docs/planner.md, "Headroom rule").
constexpr double kDefaultHeadroom = 0.10;

/// What to plan.
struct PlanInputs {
  ModelSpec model;
  int64_t world_size = 1;
  int64_t ranks_per_node = 0;  ///< 0: the profile's (capped at the world size)
  /// One strategy to evaluate; none: all of them (hybrid_shard at each candidate group size).
  std::optional<fsdp::ShardingStrategy> strategy;
  /// hybrid_shard with `strategy` set: ranks per shard group; 0 = the ranks per node when they
  /// divide the world size (else the world size)
  int64_t hybrid_shard_group_size = 0;
  /// Reshard after forward to a node-local group (Parallelism::reshard_after_forward_group_size)
  /// of this many ranks, -1 = the ranks per node, 0 = off: applied to every candidate that reshards
  /// after forward (full_shard, hybrid_shard) whose shard group it divides (its label says
  /// "node=g"); the others are planned without it.
  int64_t reshard_after_forward_group_size = 0;
  /// Host-aware collectives (Parallelism::collective_host_size) with this many ranks per host, -1 =
  /// the ranks per node, 0 = off: applied to every candidate that reduce-scatters whose shard group
  /// it divides and spans more than it (its label says "host=h"); the others are planned without.
  int64_t collective_host_size = 0;
  StepSetup step;
  DeviceProfile profile;
  int64_t memory_per_rank_bytes = 0;  ///< 0: the profile's
  double headroom = kDefaultHeadroom;
  int64_t rank = 0;  ///< whose bytes (rank 0 holds the most real rows)
  /// What a reduce-scatter holds while it runs; none: from the profile (reduce_scatter_route_for).
  /// make_plan and plan_strategy set step.reduce_scatter_route from this, never read it from step.
  std::optional<ReduceScatterRoute> reduce_scatter_route;
};

/// One strategy's numbers.
struct StrategyPlan {
  Parallelism parallelism;
  ModelStateBytes state;        ///< exact, after an optimizer step
  double closed_form_bytes = 0;  ///< the engine's closed form without padding
  double zero_paper_bytes = 0;   ///< ZeRO section 5's formula (zero_paper_bytes_per_param)
  PeakBytes peak;
  StepTraffic traffic;
  StepTime time;
  bool fits = false;  ///< peak.peak_bytes <= usable bytes
};

/// What the planner recommends.
enum class RecommendationKind {
  kDataParallel,  ///< a strategy at the given world size (`choice`)
  kMoreRanks,     ///< none fits; full_shard fits from `min_world_size` ranks
  kModelParallel, ///< no data-parallel world size fits: tensor or pipeline parallelism is needed
};
/// "data_parallel", "more_ranks", "model_parallel".
const char* to_string(RecommendationKind k);

struct Recommendation {
  RecommendationKind kind = RecommendationKind::kDataParallel;
  Parallelism choice;          ///< kDataParallel: the strategy; kMoreRanks: full_shard at min_world_size
  int64_t min_world_size = 0;  ///< kMoreRanks only
  /// The choice needs activation checkpointing, which the inputs did not ask for.
  bool activation_checkpointing = false;
  std::string reason;          ///< why, with the numbers
};

/// The whole answer.
struct Plan {
  PlanInputs inputs;
  int64_t memory_per_rank_bytes = 0;
  int64_t usable_bytes = 0;  ///< memory_per_rank_bytes x (1 - headroom)
  int64_t ranks_per_node = 1;
  BytesPerParam engine_split, zero_paper_split;
  std::vector<StrategyPlan> strategies;
  Recommendation recommendation;
  /// Where a calibrated profile was measured for another setup than this plan's (world size,
  /// model, micro-batch x sequence length): one sentence each, naming both (profile_notes).
  std::vector<std::string> notes;
};

/// The notes of Plan::notes for these inputs: empty for a datasheet profile (nothing calibrated)
/// and where the calibrated setup matches. The world size: the collective fits and shared-core
/// factors were measured over that group; the model and its micro-batch x sequence length: the
/// model rate (and the shared-core factors, measured beside that pass) belong to its shapes.
std::vector<std::string> profile_notes(const PlanInputs& in);

/// Where the recommended strategy all-gathers params over a shard group spanning nodes, or is
/// no_shard over ranks spanning nodes, is bandwidth-bound (communication its compute does not
/// hide is at least a fifth of its step) and the inputs leave a slow-link option off: the same
/// strategy (no_shard: full_shard over the same ranks) planned with the int8 codecs and, where the
/// ranks per node divide its shard group, the node-local reshard and host-aware collectives (each
/// where it applies); when that step is at least 10% shorter and still fits, one sentence naming
/// the fsdp-train flags, both step times and the bytes per rank in collectives that cross nodes
/// before and after. Empty otherwise. Not part of the recommendation itself (which strategy).
/// docs/planner.md, "Traffic".
std::vector<std::string> slow_link_notes(const PlanInputs& in, const Plan& plan);

/// The reduce-scatter's route a plan of `in` uses: in.reduce_scatter_route, else NCCL's in-place
/// ring where the profile has the NCCL model (nics_per_node >= 1), else fsdp-cpp's all-to-all.
ReduceScatterRoute reduce_scatter_route_for(const PlanInputs& in);

/// Evaluates one strategy (the reduce-scatter on reduce_scatter_route_for(in)).
StrategyPlan plan_strategy(const PlanInputs& in, const Parallelism& par, int64_t usable_bytes);
/// Evaluates the strategies and recommends one (docs/planner.md, "Recommendation"):
///  1. no_shard (DDP) when it fits: it needs no gathers and the least traffic;
///  2. else the fitting zero1 / shard_grad_op / hybrid_shard (each candidate G, growing) /
///     full_shard with the smallest estimated step time (a later one in that order must be more
///     than 1% faster to win);
///  3. else rules 1-2 with activation checkpointing, when it was off;
///  4. else the smallest world size beyond the given one (each size up to a node, then multiples
///     of the ranks per node) at which full_shard fits, without and then with checkpointing;
///  5. else model parallelism: what no data-parallel world size shards (the gathered units,
///     their gradients, the activations) does not fit by itself.
/// "Fits": predicted peak <= (1 - headroom) x memory per rank. The reduce-scatter's route (what it
/// holds while it runs) is reduce_scatter_route_for(in); plan.inputs.step says which. Throws
/// fsdp::Error (kInvalidArgument) for bad inputs (world size, hybrid size, headroom outside [0, 1)).
Plan make_plan(const PlanInputs& in);

/// The plan as JSON (docs/planner.md, "JSON output"): inputs, model, split of bytes per param,
/// per strategy the model state by kind, the peak by kind, traffic by collective kind, step time;
/// the recommendation.
std::string plan_to_json(const Plan& plan);

/// Hybrid group sizes the planner tries at world size N: the divisors G of N with 1 < G < N that
/// divide the ranks per node or are a multiple of it.
std::vector<int64_t> hybrid_candidates(int64_t world_size, int64_t ranks_per_node);

/// Parses a byte count: "80GB" (10^9), "80GiB" (2^30), "512MiB", "1.5TB", "1e9", "123" (bytes).
/// Throws fsdp::Error (kInvalidArgument) for anything else.
int64_t parse_bytes(const std::string& text);
/// Parses a link rate into bytes per second: bits per second as "200Mbit", "10Gbit/s", "25Gbps"
/// (k, M, G, T: 10^3, 10^6, 10^9, 10^12; 8 bits a byte) or bytes per second as "500MB/s", "3GB/s".
/// Case-insensitive; a unit is required (a bare number is ambiguous). Throws fsdp::Error
/// (kInvalidArgument) for anything else, for 0 and for a negative or non-finite rate.
double parse_link_rate_bytes_per_s(const std::string& text);
/// "112.0 GB" style (decimal units, as the datasheets write them: B, kB, MB, GB, TB, PB):
/// format_byte_count(bytes, ByteUnits::kDecimalLowerK) (fsdp/common/bytes.h).
std::string format_bytes(double bytes);
/// A count with its digits grouped in threes: 13891584 -> "13,891,584", -1234 -> "-1,234".
std::string format_count(int64_t n);

}  // namespace fsdp::planner
