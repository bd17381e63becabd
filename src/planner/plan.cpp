#include "fsdp/planner/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "fsdp/common/bytes.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/strategy_traits.h"

namespace fsdp::planner {
namespace {

using S = fsdp::ShardingStrategy;
const ErrorContext kPlanWhere{-1, "", "planner"};
constexpr int64_t kMaxWorldSize = 65536;  // the search for a world size at which full_shard fits

Parallelism make_par(const PlanInputs& in, S s, int64_t world, int64_t rpn, int64_t hybrid) {
  Parallelism p;
  p.strategy = s;
  p.world_size = world;
  p.ranks_per_node = rpn;
  p.hybrid_shard_group_size = traits_of(s).uses_hybrid_shard_group_size ? hybrid : 0;
  const int64_t g = in.reshard_after_forward_group_size < 0 ? rpn : in.reshard_after_forward_group_size;
  if (g > 0 && traits_of(s).reshard_after_forward && p.shard_group_size() % g == 0) p.reshard_after_forward_group_size = g;
  const int64_t h = in.collective_host_size < 0 ? rpn : in.collective_host_size;
  if (h > 0 && traits_of(s).grad_sync == GradSync::kReduceScatter && p.shard_group_size() % h == 0) {
    p.collective_host_size = h;
  }
  return p;
}

std::string gb(double bytes) { return format_bytes(bytes); }

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), s < 0.01 ? "%.2e s" : "%.3g s", s);
  return buf;
}

// Smallest world size > n (each size up to one node, then multiples of a node) at which
// full_shard's peak fits; 0 when none up to kMaxWorldSize does.
int64_t smallest_fitting_world(const PlanInputs& in, int64_t n, int64_t rpn, int64_t usable) {
  std::vector<int64_t> cand;
  for (int64_t w = n + 1; w <= std::min<int64_t>(rpn, kMaxWorldSize); ++w) cand.push_back(w);
  for (int64_t w = (std::max(n, rpn) / rpn + 1) * rpn; w <= kMaxWorldSize; w += rpn) cand.push_back(w);
  auto fits = [&](size_t i) {
    const Parallelism p = make_par(in, S::kFullShard, cand[i], rpn, 0);
    return peak_bytes(in.model, p, in.step, std::min(in.rank, cand[i] - 1)).peak_bytes <= usable;
  };
  // Exponential then binary search (the peak falls as the world grows, up to padding rows).
  if (cand.empty()) return 0;
  constexpr size_t kNone = static_cast<size_t>(-1);
  size_t failed = kNone, probe = 0;
  while (probe < cand.size() && !fits(probe)) {
    failed = probe;
    probe = probe == 0 ? 1 : probe * 2;
  }
  if (probe >= cand.size()) {
    probe = cand.size() - 1;
    if (probe == failed || !fits(probe)) return 0;
  }
  if (failed == kNone) return cand[probe];
  size_t lo = failed, hi = probe;  // fits(lo) false, fits(hi) true
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    (fits(mid) ? hi : lo) = mid;
  }
  return cand[hi];
}


// Every strategy at world size n, in the order ties are broken: no_shard, zero1, shard_grad_op,
// hybrid_shard by growing G, full_shard.
std::vector<StrategyPlan> candidates(const PlanInputs& in, int64_t n, int64_t rpn, int64_t usable) {
  std::vector<StrategyPlan> all;
  all.push_back(plan_strategy(in, make_par(in, S::kNoShard, n, rpn, 0), usable));
  all.push_back(plan_strategy(in, make_par(in, S::kZero1, n, rpn, 0), usable));
  all.push_back(plan_strategy(in, make_par(in, S::kShardGradOp, n, rpn, 0), usable));
  for (int64_t g : hybrid_candidates(n, rpn)) all.push_back(plan_strategy(in, make_par(in, S::kHybridShard, n, rpn, g), usable));
  all.push_back(plan_strategy(in, make_par(in, S::kFullShard, n, rpn, 0), usable));
  return all;
}

// The headroom and ordering rules over one world size's candidates: no_shard when it fits, else
// the fastest fitting sharded strategy (a later one must be more than 1% faster to win). Sets
// *reason; returns null when none fits.
const StrategyPlan* choose(const std::vector<StrategyPlan>& all, const std::string& usable_text, std::string* reason) {
  const StrategyPlan& ddp = all.front();
  const StrategyPlan& fs = all.back();
  if (ddp.fits) {
    bool least = true;  // "the least data" only when no candidate moves less
    for (const auto& s : all) least = least && ddp.traffic.wire_bytes() <= s.traffic.wire_bytes();
    *reason = "no_shard (DDP) fits: peak " + gb(ddp.peak.peak_bytes) + " of " + usable_text +
              ". It needs no all-gathers" + (least ? " and moves the least data (" : " (") +
              gb(ddp.traffic.wire_bytes()) + " sent per rank per step; full_shard " + gb(fs.traffic.wire_bytes()) +
              "), est. " +
              seconds(ddp.time.step_s) + " per step";
    return &ddp;
  }
  const StrategyPlan* best = nullptr;
  std::string fitting;
  for (size_t i = 1; i < all.size(); ++i) {
    if (!all[i].fits) continue;
    fitting += (fitting.empty() ? "" : ", ") + all[i].parallelism.label() + " " + gb(all[i].peak.peak_bytes) + " / " +
               seconds(all[i].time.step_s);
    if (best == nullptr || all[i].time.step_s < best->time.step_s * 0.99) best = &all[i];
  }
  if (best == nullptr) return nullptr;
  *reason = "no_shard (DDP) needs " + gb(ddp.peak.peak_bytes) + " per rank at its peak, more than " + usable_text +
            ". Fitting (peak / est. step): " + fitting + ". " + best->parallelism.label() +
            " is the fastest that fits (ties within 1% go to the lower stage)";
  return best;
}

// What full_shard cannot shard at its peak: gathered units, their gradients and reduce buffers,
// activations and the loss's buffers.
int64_t unshardable_bytes(const PeakBytes& p) {
  return p.unsharded_param_bytes + p.unsharded_grad_bytes + p.activation_bytes + p.loss_transient_bytes;
}

// [Note: recommendation order] docs/planner.md, "Recommendation": at the given N as asked; at N
// with activation checkpointing; more ranks as asked; more ranks with checkpointing; else
// tensor or pipeline parallelism.
Recommendation recommend(const PlanInputs& in, const std::vector<StrategyPlan>& all, int64_t rpn, int64_t usable,
                         const std::string& usable_text) {
  const int64_t N = in.world_size;
  Recommendation rec;
  std::string why;
  if (const StrategyPlan* best = choose(all, usable_text, &why)) {
    rec.choice = best->parallelism;
    rec.reason = why;
    return rec;
  }
  const PeakBytes& fp = all.back().peak;
  const std::string none_text = "no data-parallel strategy fits at N = " + std::to_string(N) +
                                (in.step.activation_checkpointing ? "" : " without activation checkpointing") +
                                ": full_shard needs " + gb(fp.peak_bytes) + " (" + fp.moment + "), more than " + usable_text;
  auto more_ranks = [&](const PlanInputs& x, const PeakBytes& p) -> int64_t {
    return unshardable_bytes(p) <= usable ? smallest_fitting_world(x, N, rpn, usable) : 0;
  };
  const int64_t n_fit = more_ranks(in, fp);
  PlanInputs ck = in;
  ck.step.activation_checkpointing = true;
  std::vector<StrategyPlan> all_ck;
  if (!in.step.activation_checkpointing) {
    all_ck = candidates(ck, N, rpn, usable);
    if (const StrategyPlan* best = choose(all_ck, usable_text, &why)) {
      rec.choice = best->parallelism;
      rec.activation_checkpointing = true;
      rec.reason = none_text + ". With activation checkpointing (each block keeps only its input and recomputes "
                   "its forward in backward, +1/3 of the block FLOPs): " + why +
                   (n_fit > 0 ? "; or, without it, full_shard fits from N = " + std::to_string(n_fit) : "");
      return rec;
    }
  }
  if (n_fit > 0) {
    rec.kind = RecommendationKind::kMoreRanks;
    rec.min_world_size = n_fit;
    rec.choice = make_par(in, S::kFullShard, n_fit, rpn, 0);
    const PeakBytes p = peak_bytes(in.model, rec.choice, in.step, std::min(in.rank, n_fit - 1));
    rec.reason = none_text + (in.step.activation_checkpointing ? "" : ", nor with activation checkpointing") +
                 ". full_shard fits from N = " + std::to_string(n_fit) + " ranks (peak " + gb(p.peak_bytes) + ")";
    return rec;
  }
  const PeakBytes& fck = all_ck.empty() ? fp : all_ck.back().peak;
  const int64_t n_fit_ck = all_ck.empty() ? 0 : more_ranks(ck, fck);
  if (n_fit_ck > 0) {
    rec.kind = RecommendationKind::kMoreRanks;
    rec.min_world_size = n_fit_ck;
    rec.activation_checkpointing = true;
    rec.choice = make_par(ck, S::kFullShard, n_fit_ck, rpn, 0);
    const PeakBytes p = peak_bytes(ck.model, rec.choice, ck.step, std::min(in.rank, n_fit_ck - 1));
    rec.reason = none_text + ", nor with activation checkpointing (" + gb(fck.peak_bytes) +
                 "), and more ranks alone do not help (what full_shard cannot shard, " + gb(unshardable_bytes(fp)) +
                 ", exceeds the usable memory). With activation checkpointing full_shard fits from N = " +
                 std::to_string(n_fit_ck) + " ranks (peak " + gb(p.peak_bytes) + ")";
    return rec;
  }
  const PeakBytes& f = fck;
  rec.kind = RecommendationKind::kModelParallel;
  rec.choice = all.back().parallelism;
  rec.reason = none_text + ". More ranks do not help" +
               std::string(in.step.activation_checkpointing ? "" : ", even with activation checkpointing") +
               ": what data parallelism cannot shard (gathered units " + gb(f.unsharded_param_bytes) +
               ", their gradients and reduce buffers " + gb(f.unsharded_grad_bytes) + ", activations of one micro-batch " +
               gb(f.activation_bytes + f.loss_transient_bytes) + ") needs " + gb(unshardable_bytes(f)) + " by itself" +
               (unshardable_bytes(f) <= usable ? " with the shards of up to " + std::to_string(kMaxWorldSize) + " ranks" : "") +
               ": tensor or pipeline parallelism is needed (or a smaller micro-batch)";
  return rec;
}

}  // namespace

const char* to_string(RecommendationKind k) {
  switch (k) {
    case RecommendationKind::kDataParallel: return "data_parallel";
    case RecommendationKind::kMoreRanks: return "more_ranks";
    case RecommendationKind::kModelParallel: return "model_parallel";
  }
  return "?";
}

std::vector<int64_t> hybrid_candidates(int64_t world_size, int64_t ranks_per_node) {
  std::vector<int64_t> out;
  const int64_t node = ranks_per_node > 0 ? ranks_per_node : world_size;
  for (int64_t g = 2; g < world_size; ++g) {
    if (world_size % g == 0 && (node % g == 0 || g % node == 0)) out.push_back(g);
  }
  return out;
}

ReduceScatterRoute reduce_scatter_route_for(const PlanInputs& in) {
  return in.reduce_scatter_route.value_or(in.profile.nics_per_node > 0 ? ReduceScatterRoute::kInPlace
                                                                       : ReduceScatterRoute::kAllToAll);
}

StrategyPlan plan_strategy(const PlanInputs& in, const Parallelism& par, int64_t usable_bytes) {
  StepSetup step = in.step;
  step.reduce_scatter_route = reduce_scatter_route_for(in);
  StrategyPlan sp;
  sp.parallelism = par;
  const int64_t rank = std::min(in.rank, par.world_size - 1);
  const double P = static_cast<double>(in.model.num_params());
  sp.state = model_state_bytes(in.model, par, step, rank);
  sp.closed_form_bytes = closed_form_model_state_bytes(par, P, step);
  sp.zero_paper_bytes =
      zero_paper_model_state_bytes(par, P, zero_paper_bytes_per_param(step.precision, step.optimizer));
  sp.peak = peak_bytes(in.model, par, step, rank);
  sp.traffic = step_traffic(in.model, par, step);
  sp.time = estimate_step_time(in.model, par, step, in.profile);
  sp.fits = sp.peak.peak_bytes <= usable_bytes;
  return sp;
}

Plan make_plan(const PlanInputs& given) {
  PlanInputs in = given;
  in.step.reduce_scatter_route = reduce_scatter_route_for(given);
  FSDP_CHECK(in.world_size >= 1, ErrorKind::kInvalidArgument, kPlanWhere,
             expected_actual("world size", ">= 1", in.world_size));
  FSDP_CHECK(in.headroom >= 0.0 && in.headroom < 1.0, ErrorKind::kInvalidArgument, kPlanWhere,
             expected_actual("headroom", "in [0, 1)", in.headroom));
  FSDP_CHECK(in.rank >= 0 && in.rank < in.world_size, ErrorKind::kInvalidArgument, kPlanWhere,
             expected_actual("rank", str_cat("in [0, ", in.world_size, ")"), in.rank));
  in.step.validate();
  Plan plan;
  plan.inputs = in;
  const int64_t N = in.world_size;
  const int64_t rpn = std::max<int64_t>(1, in.ranks_per_node > 0 ? in.ranks_per_node : in.profile.ranks_per_node);
  plan.ranks_per_node = rpn;
  plan.memory_per_rank_bytes = in.memory_per_rank_bytes > 0 ? in.memory_per_rank_bytes : in.profile.memory_bytes;
  FSDP_CHECK(plan.memory_per_rank_bytes > 0, ErrorKind::kInvalidArgument, kPlanWhere,
             "no memory per rank: profile '", in.profile.name,
             "' has memory_bytes 0 (not known) and no memory per rank was given");
  plan.usable_bytes = static_cast<int64_t>(std::floor(static_cast<double>(plan.memory_per_rank_bytes) * (1.0 - in.headroom)));
  plan.engine_split = engine_bytes_per_param(in.step.precision, in.step.optimizer);
  plan.zero_paper_split = zero_paper_bytes_per_param(in.step.precision, in.step.optimizer);
  const int64_t usable = plan.usable_bytes;

  // Every candidate, in the order ties are broken.
  const std::vector<StrategyPlan> all = candidates(in, N, rpn, usable);
  if (in.strategy) {
    int64_t g = in.hybrid_shard_group_size;
    if (traits_of(*in.strategy).uses_hybrid_shard_group_size && g == 0) g = (N % rpn == 0 && rpn < N) ? rpn : N;
    const Parallelism par = make_par(in, *in.strategy, N, rpn, g);
    // "host" (-1) with a shard group inside one node is off, as fsdp-train's.
    const int64_t G = par.shard_group_size();
    const int64_t node = in.reshard_after_forward_group_size < 0 ? (rpn >= G ? 0 : rpn) : in.reshard_after_forward_group_size;
    FSDP_CHECK(node == 0 || par.shard_group_size() % node == 0, ErrorKind::kInvalidArgument, kPlanWhere,
               "--reshard-after-forward (reshard_after_forward_group_size) ", node, " must divide the shard group size ",
               par.shard_group_size(),
               " of ", par.label());
    const int64_t host = in.collective_host_size < 0 ? (rpn >= G ? 0 : rpn) : in.collective_host_size;
    FSDP_CHECK(host == 0 || G % host == 0, ErrorKind::kInvalidArgument, kPlanWhere, "--host-aware-collectives (collective_host_size) ",
               host, " must divide the shard group size ", G, " of ", par.label());
    plan.strategies.push_back(plan_strategy(in, par, usable));
  } else {
    plan.strategies = all;
  }
  const std::string usable_text = gb(static_cast<double>(usable)) + " usable (" +
                                  gb(static_cast<double>(plan.memory_per_rank_bytes)) + " per rank less " +
                                  std::to_string(static_cast<int>(std::lround(in.headroom * 100))) + "% headroom)";
  plan.recommendation = recommend(in, all, rpn, usable, usable_text);
  plan.notes = profile_notes(in);
  for (std::string& note : slow_link_notes(in, plan)) plan.notes.push_back(std::move(note));
  // A host-aware size or node-local reshard that applies to no row says so (instead of a silent
  // plan without it).
  bool host_used = false, node_used = false;
  for (const auto& sp : plan.strategies) {
    host_used = host_used || sp.parallelism.host_stage_size() > 0;
    node_used = node_used || sp.parallelism.node_group_size() > 0;
  }
  if (in.collective_host_size != 0 && !host_used) {
    plan.notes.push_back(str_cat("--host-aware-collectives ", in.collective_host_size < 0 ? std::string("host")
                                                                                          : std::to_string(in.collective_host_size),
                                 " applies to no row: it must divide a shard group larger than it (and, for host, a "
                                 "shard group spanning nodes); planned without it"));
  }
  if (in.reshard_after_forward_group_size != 0 && !node_used) {
    plan.notes.push_back(str_cat("--reshard-after-forward ", in.reshard_after_forward_group_size < 0 ? std::string("host")
                                                                                                     : std::to_string(in.reshard_after_forward_group_size),
                                 " applies to no row: it must divide the shard group of full_shard or hybrid_shard "
                                 "and be smaller; planned without it"));
  }
  return plan;
}

std::vector<std::string> slow_link_notes(const PlanInputs& in, const Plan& plan) {
  const Recommendation& rec = plan.recommendation;
  if (rec.kind != RecommendationKind::kDataParallel) return {};
  const Parallelism& par = rec.choice;
  const StrategyTraits& t = traits_of(par.strategy);
  const int64_t rpn = plan.ranks_per_node;
  // no_shard (DDP) across nodes: the alternative is full_shard with the wire options, over the
  // same ranks; a sharded strategy keeps its own and gains the options it lacks.
  const bool replicated = !t.gathers_params;
  if (replicated ? par.world_size <= rpn : !group_crosses_nodes(par, GroupKind::kShard)) return {};
  StrategyPlan now;
  bool found = false;
  for (const StrategyPlan& s : plan.strategies) found = found || s.parallelism.label() == par.label();
  if (!found) return {};
  // The recommendation's own step (it may add activation checkpointing to the inputs').
  PlanInputs as_recommended = in;
  as_recommended.step.activation_checkpointing = in.step.activation_checkpointing || rec.activation_checkpointing;
  now = plan_strategy(as_recommended, par, plan.usable_bytes);
  if (now.time.step_s <= 0 || now.time.exposed_comm_s < 0.2 * now.time.step_s) return {};
  PlanInputs faster = as_recommended;
  Parallelism better = par;
  std::vector<std::string> flags;
  if (replicated) {
    better = Parallelism{};
    better.strategy = fsdp::ShardingStrategy::kFullShard;
    better.world_size = par.world_size;
    better.ranks_per_node = par.ranks_per_node;
    flags.push_back("--strategy full_shard");
  }
  const StrategyTraits& bt = traits_of(better.strategy);
  if (in.step.all_gather_codec == fsdp::WireCodec::kNone) {
    faster.step.all_gather_codec = fsdp::WireCodec::kInt8;
    flags.push_back("--all-gather-codec int8");
  }
  const int64_t G = better.shard_group_size();
  if (bt.reshard_after_forward && better.node_group_size() == 0 && rpn < G && G % rpn == 0) {
    better.reshard_after_forward_group_size = rpn;
    flags.push_back("--reshard-after-forward host");
  }
  if (better.host_stage_size() == 0 && rpn > 1 && rpn < G && G % rpn == 0) {
    better.collective_host_size = rpn;
    flags.push_back("--host-aware-collectives host");
  }
  if (in.step.reduce_scatter_codec == fsdp::WireCodec::kNone && bt.grad_sync == GradSync::kReduceScatter) {
    faster.step.reduce_scatter_codec = fsdp::WireCodec::kInt8;
    flags.push_back("--reduce-scatter-codec int8");
  }
  if (flags.empty()) return {};
  const StrategyPlan then = plan_strategy(faster, better, plan.usable_bytes);
  if (!then.fits || then.time.step_s > 0.9 * now.time.step_s) return {};
  auto cross_node_bytes = [](const StepTraffic& tr) {
    double b = 0;
    for (const auto& c : tr.calls) {
      if (c.crosses_nodes) b += c.wire_bytes;
    }
    return b;
  };
  std::string joined;
  for (const auto& f : flags) joined += (joined.empty() ? "" : " ") + f;
  return {str_cat(par.label(), " is bandwidth-bound here: ", seconds(now.time.exposed_comm_s), " of its ",
                  seconds(now.time.step_s), " step is communication its compute does not hide; with ", joined, " (",
                  then.parallelism.label(), ") the planner predicts ", seconds(then.time.step_s),
                  " per step, bytes per rank in collectives that cross nodes ", gb(cross_node_bytes(now.traffic)),
                  " -> ", gb(cross_node_bytes(then.traffic)), " (docs/planner.md, \"Traffic\")")};
}

std::vector<std::string> profile_notes(const PlanInputs& in) {
  const DeviceProfile& p = in.profile;
  std::vector<std::string> notes;
  if (p.calibration_world_size <= 0) return notes;
  const std::string source = "profile '" + p.name + "' was calibrated ";
  if (p.calibration_world_size != in.world_size) {
    notes.push_back(str_cat(source, "at world size ", p.calibration_world_size, ", this plan is for ", in.world_size,
                            ": its collective fits and shared-core factors were measured over that group "
                            "(a calibration at the planned world size gives the closest step time)"));
  }
  // A calibration measures the model rate of fp32 and bf16 (fp16 only when asked): a plan in a
  // precision it did not measure runs its FLOPs at that precision's at::mm rate instead.
  if (p.model_flops_per_s(in.step.precision) <= 0 &&
      (p.model_flops_per_s_fp32 > 0 || p.model_flops_per_s_bf16 > 0 || p.model_flops_per_s_fp16 > 0)) {
    notes.push_back(str_cat(source, "without a model rate for ", to_string(in.step.precision),
                            ": this plan's compute runs at its at::mm rate, which leaves out a step's other kernels "
                            "(calibrate with --mixed-precision ", to_string(in.step.precision), " to measure it)"));
  }
  if (p.calibration_model.empty()) return notes;  // written before the calibrated setup was recorded
  if (p.calibration_model != in.model.name || p.calibration_model_params != in.model.num_params()) {
    notes.push_back(str_cat(source, "with ", p.calibration_model, " (", format_count(p.calibration_model_params),
                            " params), this plan is for ", in.model.name, " (", format_count(in.model.num_params()),
                            " params): its model FLOP rate is another model's"));
  }
  if (p.calibration_micro_batch_size != in.step.micro_batch_size || p.calibration_seq_len != in.step.seq_len) {
    notes.push_back(str_cat(source, "at micro-batch ", p.calibration_micro_batch_size, " x ", p.calibration_seq_len,
                            " tokens, this plan is for ", in.step.micro_batch_size, " x ", in.step.seq_len,
                            ": its model FLOP rate is for other matmul shapes"));
  }
  return notes;
}

int64_t parse_bytes(const std::string& text) {
  size_t i = 0;
  double v = 0.0;
  try {
    v = std::stod(text, &i);
  } catch (const std::exception&) {
    throw Error(ErrorKind::kInvalidArgument, kPlanWhere, expected_actual("a byte count like 80GB, 80GiB or 512MiB", "", "'" + text + "'"));
  }
  std::string unit = text.substr(i);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char c) { return std::isspace(c); }), unit.end());
  std::string u;
  for (char c : unit) u += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 0.0;
  if (u.empty() || u == "b") mult = 1.0;
  else if (u == "kb") mult = 1e3;
  else if (u == "mb") mult = 1e6;
  else if (u == "gb") mult = 1e9;
  else if (u == "tb") mult = 1e12;
  else if (u == "kib") mult = 1024.0;
  else if (u == "mib") mult = 1024.0 * 1024;
  else if (u == "gib") mult = 1024.0 * 1024 * 1024;
  else if (u == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  FSDP_CHECK(mult > 0.0 && v >= 0.0 && std::isfinite(v), ErrorKind::kInvalidArgument, kPlanWhere,
             expected_actual("a byte count like 80GB, 80GiB or 512MiB", "", "'" + text + "'"));
  return static_cast<int64_t>(std::llround(v * mult));
}

double parse_link_rate_bytes_per_s(const std::string& text) {
  const std::string expected = "a link rate like 200Mbit, 10Gbit/s, 25Gbps or 3GB/s";
  size_t i = 0;
  double v = 0.0;
  try {
    v = std::stod(text, &i);
  } catch (const std::exception&) {
    throw Error(ErrorKind::kInvalidArgument, kPlanWhere, expected_actual(expected, "", "'" + text + "'"));
  }
  std::string u;
  for (char c : text.substr(i)) {
    if (!std::isspace(static_cast<unsigned char>(c))) u += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  // The prefix, then bits ("bit", "bit/s", "bps") or bytes ("b/s").
  double scale = 0.0;
  if (!u.empty()) {
    const char p = u[0];
    scale = p == 'k' ? 1e3 : p == 'm' ? 1e6 : p == 'g' ? 1e9 : p == 't' ? 1e12 : 0.0;
    if (scale > 0) u = u.substr(1);
  }
  double per_byte = 0.0;  // units of the number per byte
  if (u == "bit" || u == "bit/s" || u == "bps") per_byte = 8.0;
  else if (u == "b/s") per_byte = 1.0;
  if (scale == 0.0) scale = 1.0;
  FSDP_CHECK(per_byte > 0.0 && v > 0.0 && std::isfinite(v), ErrorKind::kInvalidArgument, kPlanWhere,
             expected_actual(expected, "", "'" + text + "'"));
  return v * scale / per_byte;
}

std::string format_count(int64_t n) {
  const std::string digits = n < 0 ? std::to_string(n).substr(1) : std::to_string(n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    out += digits[i];
    const size_t left = digits.size() - i - 1;
    if (left > 0 && left % 3 == 0) out += ',';
  }
  return out;
}

std::string format_bytes(double bytes) { return format_byte_count(bytes, ByteUnits::kDecimalLowerK); }

}  // namespace fsdp::planner
