#include "fsdp/planner/memory.h"

#include <algorithm>

#include "fsdp/common/check.h"
#include "fsdp/runtime/strategy_traits.h"
#include "fsdp/planner/activations.h"
#include "fsdp/shard/layout.h"

namespace fsdp::planner {
namespace {

using S = fsdp::ShardingStrategy;
const ErrorContext kMemoryWhere{-1, "", "planner memory"};

void check_rank(const Parallelism& par, int64_t rank) {
  par.validate();
  FSDP_CHECK(rank >= 0 && rank < par.world_size, ErrorKind::kInvalidArgument, kMemoryWhere,
             expected_actual("rank", str_cat("in [0, ", par.world_size, ")"), rank));
}

// Per-unit numbers of the model at this rank.
std::vector<UnitNumbers> all_units(const ModelSpec& model, const Parallelism& par, int64_t rank) {
  const int64_t G = par.shard_group_size();
  std::vector<UnitNumbers> v;
  for (const auto& u : model.units) v.push_back(unit_numbers(u, G, rank % G));
  return v;
}

// The moments of a step, each a candidate for the peak.
class Moments {
 public:
  explicit Moments(PeakBytes* best) : best_(best) {}
  void consider(PeakBytes m) {
    m.peak_bytes = m.persistent_bytes + m.sharded_grad_bytes + m.unsharded_param_bytes + m.node_shard_bytes +
                   m.unsharded_grad_bytes + m.activation_bytes + m.loss_transient_bytes +
                   m.optimizer_temp_bytes;
    if (m.peak_bytes > best_->peak_bytes || best_->moment.empty()) *best_ = m;
  }

 private:
  PeakBytes* best_;
};

}  // namespace

UnitNumbers unit_numbers(const UnitSpec& unit, int64_t shard_group_size, int64_t shard_rank) {
  FSDP_CHECK(shard_group_size >= 1 && shard_rank >= 0 && shard_rank < shard_group_size,
             ErrorKind::kInvalidArgument, kMemoryWhere, "shard group size ", shard_group_size, ", shard rank ",
             shard_rank);
  UnitNumbers n;
  for (const auto& p : unit.params) {
    const auto s = fsdp::shard::ParamShardSpec::make(p.shape, shard_group_size);
    n.numel += s.numel();
    n.shard_numel += s.padded_shard_numel();
    if (!p.trainable) continue;
    n.trainable_numel += s.numel();
    n.reduce_shard_numel += s.padded_shard_numel();
    n.real_trainable_numel += s.real_numel(shard_rank);
    n.largest_real_param = std::max(n.largest_real_param, s.real_numel(shard_rank));
  }
  n.gathered_numel = shard_group_size * n.shard_numel;
  n.reduce_numel = shard_group_size * n.reduce_shard_numel;
  return n;
}

ModelStateBytes model_state_bytes(const ModelSpec& model, const Parallelism& par, const StepSetup& setup,
                                  int64_t rank) {
  check_rank(par, rank);
  const int64_t k = optimizer_bytes_per_elem(setup.optimizer);
  const int64_t pb = param_bytes_per_elem(setup.precision);
  ModelStateBytes m;
  for (const auto& n : all_units(model, par, rank)) {
    m.sharded_param_bytes += 4 * n.shard_numel;
    m.sharded_grad_bytes += 4 * n.real_trainable_numel;
    m.optim_state_bytes += k * n.real_trainable_numel;
    if (traits_of(par.strategy).lazy_gather) m.resident_unsharded_param_bytes += pb * n.gathered_numel;
  }
  return m;
}

BytesPerParam engine_bytes_per_param(Precision, OptimizerKind optimizer) {
  return {4.0, 4.0, static_cast<double>(optimizer_bytes_per_elem(optimizer))};
}

BytesPerParam zero_paper_bytes_per_param(Precision precision, OptimizerKind optimizer) {
  const double k = static_cast<double>(optimizer_bytes_per_elem(optimizer));
  if (precision == Precision::kFp32) return {4.0, 4.0, k};
  return {2.0, 2.0, 4.0 + k};  // the fp32 master copy joins the optimizer state: K = 12 for Adam
}

double zero_paper_model_state_bytes(const Parallelism& par, double P, const BytesPerParam& b) {
  par.validate();
  // Stage k shards the first k of (optimizer state, gradients, parameters) over the shard group.
  const int stage = traits_of(par.strategy).zero_stage;
  const double N = static_cast<double>(stage == 0 ? 1 : par.shard_group_size());
  return (stage >= 3 ? b.params / N : b.params) * P + (stage >= 2 ? b.grads / N : b.grads) * P +
         (stage >= 1 ? b.optimizer / N : b.optimizer) * P;
}

double closed_form_model_state_bytes(const Parallelism& par, double P, const StepSetup& setup) {
  par.validate();
  const double state = (8.0 + static_cast<double>(optimizer_bytes_per_elem(setup.optimizer))) * P /
                       static_cast<double>(par.shard_group_size());
  const double full =
      traits_of(par.strategy).lazy_gather ? static_cast<double>(param_bytes_per_elem(setup.precision)) * P : 0.0;
  return state + full;
}

std::vector<int64_t> ddp_bucket_numels(const UnitSpec& unit, int64_t cap_bytes, int64_t reduce_bytes) {
  FSDP_CHECK(cap_bytes >= 1 && reduce_bytes >= 1, ErrorKind::kInvalidArgument, kMemoryWhere,
             "bucket cap ", cap_bytes, " and reduce bytes ", reduce_bytes, " must be >= 1");
  const int64_t cap = cap_bytes / reduce_bytes;
  std::vector<int64_t> buckets;
  for (auto it = unit.params.rbegin(); it != unit.params.rend(); ++it) {
    if (!it->trainable) continue;
    const int64_t n = it->numel();
    if (buckets.empty() || (buckets.back() > 0 && buckets.back() + n > cap)) buckets.push_back(0);
    buckets.back() += n;
  }
  return buckets;
}

// [Note: peak moments] docs/planner.md, "Peak". A step's memory rises through forward (saved
// activations, gathered units), is highest around the start of backward (every activation, the
// loss's logits-sized gradients) or during the first blocks' backward (their gradients and
// reduce-scatter buffers join), falls as backward frees activations, and rises again at the
// optimizer step (all sharded gradients, AdamW temporaries). Each moment's bytes are summed from
// what the engine holds then; the peak is the largest moment.
PeakBytes peak_bytes(const ModelSpec& model, const Parallelism& par, const StepSetup& setup, int64_t rank) {
  check_rank(par, rank);
  setup.validate();
  const ActivationModel act = activation_model(model, setup);
  const std::vector<UnitNumbers> un = all_units(model, par, rank);
  const int64_t L = model.num_blocks();
  const int64_t pb = param_bytes_per_elem(setup.precision), rb = reduce_bytes_per_elem(setup.precision);
  const ModelStateBytes state = model_state_bytes(model, par, setup, rank);
  const S s = par.strategy;
  const StrategyTraits& st = traits_of(s);
  const bool ddp = st.grad_sync == GradSync::kBuckets, gathers_per_phase = st.gathers_params && st.reshard_after_forward;
  const bool once_per_step = gathers_once_per_step(st);
  const bool accumulating = setup.accumulation_steps > 1;
  const int64_t G = par.shard_group_size(), hs = par.host_stage_size(), H = hs > 0 ? G / hs : 1;

  auto full_param = [&](size_t u) -> int64_t {  // transient full params of unit u while in use
    if (st.lazy_gather) return 0;                // resident: part of the model state
    if (ddp) return pb == 4 ? 0 : pb * un[u].numel;  // fp32 aliases the storage; else a cast copy
    // Host-aware: the cross-host stage's output (H of the G blocks) lives until the copy-out.
    return pb * un[u].gathered_numel + (H > 1 ? all_gather_bytes(setup, model.units[u], G) / G * H : 0);
  };
  auto full_grad = [&](size_t u) { return pb * un[u].trainable_numel; };
  // Reduce-scatter buffers: the input (G x the unit's trainable shard) and, with G > 1, the
  // output shard and, on the all-to-all route, what the collective holds while it runs: the
  // blocks its all-to-all receives (as many bytes as the input) and, for bf16/fp16, the float32
  // shard they are added in and the block being widened ([Note: all-to-all reductions] in
  // src/comm/all_to_all_reductions.cpp; NCCL's in-place ring holds none of these);
  // no_shard's bucket buffers (the unit's trainable elements, until backward ends).
  auto reduce_input = [&](size_t u) -> int64_t {
    return rb * (ddp ? un[u].trainable_numel : un[u].reduce_numel);
  };
  const bool scatters = !ddp && par.shard_group_size() > 1;
  // Host-aware (H hosts) and int8 reductions hold more from the backward to the end: the host
  // stage's output (H blocks) and the int8 payloads sent and received (n of them: H, or G when flat).
  const bool int8_reduce = scatters && setup.reduce_scatter_codec == fsdp::WireCodec::kInt8;
  // (A flat int8 reduction lets go of its input once quantised; counted all the same, as at its
  // issue the input, the payloads and the quantising pass's float32 rows are all there.)
  auto reduce_held = [&](size_t u) -> int64_t {  // from the unit's backward until its reduce-scatter ends
    int64_t held = reduce_input(u) + (scatters ? rb * un[u].reduce_shard_numel : 0);
    if (scatters && H > 1) held += rb * H * un[u].reduce_shard_numel;
    if (int8_reduce) held += 2 * int8_reduce_bytes(model.units[u], G, H > 1 ? H : G);
    return held;
  };
  auto reduce_running = [&](size_t u) -> int64_t {  // while the communication thread runs it (one at a time)
    if (!scatters) return int64_t{0};
    // int8: the quantising pass's float32 copy and magnitudes of one block (and the decode's two
    // float32 rows of S'); a flat int8 reduction runs no reduce-scatter.
    const int64_t int8_pass = int8_reduce ? 2 * 4 * un[u].reduce_shard_numel : 0;
    if (int8_reduce && H == 1) return int8_pass;
    if (setup.reduce_scatter_route == ReduceScatterRoute::kInPlace) return int8_pass;
    // The host stage (host-aware) reduces into H blocks: its bf16/fp16 float32 sum is H x S'.
    return reduce_input(u) + (rb < 4 ? 2 * 4 * H * un[u].reduce_shard_numel : 0) + int8_pass;
  };
  auto reduce_buffers = [&](size_t u) { return reduce_held(u) + reduce_running(u); };
  auto sharded_grad = [&](size_t u) { return 4 * un[u].real_trainable_numel; };

  // Full params alive at each moment. full_shard / hybrid_shard: the root (gathered from forward
  // to the end of backward), the block in backward and the previous one its pre-backward
  // prefetches (within max_unsharded_units); at the start of backward the last block was resharded
  // after its forward and no block is gathered yet. shard_grad_op: every block from its forward to
  // the end of its own backward. no_shard: the cast copies of every unit until the end of
  // backward (none in fp32). zero1: none beyond its resident full params.
  const bool prefetch_back = setup.backward_prefetch && setup.max_unsharded_units >= 2;
  auto params_alive = [&](int64_t b) -> int64_t {  // b: the block in backward (0: none)
    int64_t n = full_param(0);
    if (gathers_per_phase) {
      if (b >= 1) n += full_param(b) + (prefetch_back && b >= 2 ? full_param(b - 1) : 0);
    } else if (once_per_step) {
      for (int64_t j = 1; j <= b; ++j) n += full_param(j);
    } else {
      for (int64_t j = 1; j <= L; ++j) n += full_param(j);
    }
    return n;
  };
  // hpZ: the shards kept by blocks 1..b-1 while block b is in backward (b = L + 1: all of them, at
  // the start of backward); the one block b - 1 prefetches is gathered already (among the params).
  const int64_t gn = par.node_group_size();
  auto node_shards_alive = [&](int64_t b) -> int64_t {
    if (gn == 0 || !gathers_per_phase) return 0;
    int64_t n = 0;
    const int64_t prefetched = prefetch_back && b <= L && b >= 2 ? b - 1 : -1;
    for (int64_t j = 1; j < b && j <= L; ++j) {
      if (j != prefetched) n += pb * unit_numbers(model.units[j], gn, rank % gn).shard_numel;
    }
    return n;
  };
  int64_t all_grads = 0;
  for (size_t u = 0; u < un.size(); ++u) all_grads += full_grad(u);
  // [Note: tied head gradient] A tied head's gradient of the token embedding (V x C) is summed
  // with the lookup's gradient by autograd before the embedding's AccumulateGrad runs, at the very
  // end of backward; until then it waits in autograd's input buffer. Without accumulation it
  // stands in for the root's full_grad (no .grad exists yet); with accumulation the .grad of the
  // earlier micro-batches exists beside it. The lookup's backward then holds the waiting gradient,
  // the lookup's dense gradient (V x C) and their sum (a new V x C tensor: libtorch's input buffer
  // adds two dense gradients out of place; measured with the counting allocator).
  const Architecture& arch = model.arch;
  const bool has_lookups = arch.kind != BlockKind::kNone && arch.vocab_size > 0 && arch.n_embd > 0;
  const int64_t lookup_grad = has_lookups ? pb * arch.vocab_size * arch.n_embd : 0;
  const int64_t tied_waiting = arch.tied_head && accumulating ? lookup_grad : 0;
  // At the lookup's backward: its dense gradient, the sum with a tied head's (2 x V x C), and the
  // .grad of the earlier micro-batches (with accumulation; `earlier` of them) beside the new one.
  auto lookup_transient = [&](bool earlier) {
    return (arch.tied_head ? 2 * lookup_grad : 0) + (earlier ? lookup_grad : 0);
  };
  // What block j keeps from its forward to its backward (its input only where it is checkpointed).
  auto saved_by_block = [&](int64_t j) {
    return setup.checkpoints_block(j) ? act.checkpointed_block_bytes
                                      : act.block_bytes - (j == 1 ? act.first_block_frozen_input_bytes : 0);
  };

  PeakBytes best;
  Moments moments(&best);
  PeakBytes base;
  base.persistent_bytes = state.sharded_param_bytes + state.optim_state_bytes + state.resident_unsharded_param_bytes;
  base.activations_known = act.known;

  {  // Start of backward: every activation saved, the loss's gradient buffers.
    PeakBytes m = base;
    m.moment = "start of backward";
    m.unsharded_param_bytes = params_alive(once_per_step ? L : 0);
    m.node_shard_bytes = node_shards_alive(L + 1);
    m.unsharded_grad_bytes = accumulating ? all_grads : 0;
    m.activation_bytes = act.total_saved_bytes;
    m.loss_transient_bytes = act.known ? act.loss_transient_bytes : 0;
    moments.consider(m);
  }
  // Backward of block b (units[b], b = L..1): its activations (recomputed under checkpointing),
  // those of the blocks before it, its gradients and the reduce-scatter input they are packed
  // into, the previous block's reduce-scatter still in flight, the root's gradients (reduced at the
  // end of backward); with accumulation, the earlier blocks' accumulated full gradients.
  int64_t reduced = 0, ddp_buffers = 0;
  for (int64_t b = L; b >= 1; --b) {
    PeakBytes m = base;
    m.moment = "backward of " + model.units[b].name;
    m.unsharded_param_bytes = params_alive(b);
    m.node_shard_bytes = node_shards_alive(b);
    int64_t grads = full_grad(0) + tied_waiting + full_grad(b) + reduce_input(b);
    if (ddp) {
      grads += ddp_buffers;
    } else if (b < L) {
      grads += reduce_buffers(b + 1);
      m.reduce_in_flight_bytes = reduce_running(b + 1);
    }
    if (accumulating) {
      for (int64_t j = 1; j < b; ++j) grads += full_grad(j);
    }
    m.unsharded_grad_bytes = grads;
    m.sharded_grad_bytes = reduced;
    int64_t saved_before = 0;
    for (int64_t j = 1; j < b; ++j) saved_before += saved_by_block(j);
    m.activation_bytes = act.root_lookup_bytes + saved_before + act.block_bytes -
                         (b == 1 ? act.first_block_frozen_input_bytes : 0);
    moments.consider(m);
    if (ddp) {
      ddp_buffers += reduce_buffers(b);
    } else if (b < L) {
      reduced += sharded_grad(b + 1);
    }
  }
  if (has_lookups) {  // Backward of the token embedding, the last of the root's backward.
    PeakBytes m = base;
    m.moment = "backward of the token embedding";
    m.unsharded_param_bytes = params_alive(0);
    int64_t grads = full_grad(0) + lookup_transient(accumulating);
    if (ddp) {
      grads += ddp_buffers;  // every block's bucket, kept until the end of backward
    } else {
      m.sharded_grad_bytes = state.sharded_grad_bytes - sharded_grad(0) - (L >= 1 ? sharded_grad(1) : 0);
      if (L >= 1) {  // the first block's reduce-scatter in flight
        grads += reduce_buffers(1);
        m.reduce_in_flight_bytes = reduce_running(1);
      }
    }
    m.unsharded_grad_bytes = grads;
    m.activation_bytes = act.root_lookup_bytes;
    moments.consider(m);
    if (accumulating) {  // a micro-batch without gradient sync: every unit's full gradients
      PeakBytes n = base;
      n.moment = "backward of the token embedding (no gradient sync)";
      n.unsharded_param_bytes = params_alive(0);
      n.unsharded_grad_bytes = all_grads + lookup_transient(setup.accumulation_steps > 2);
      n.activation_bytes = act.root_lookup_bytes;
      moments.consider(n);
    }
  }
  {  // End of backward: the root's gradient reduced last; no_shard's buckets all land.
    PeakBytes m = base;
    m.moment = "end of backward";
    m.unsharded_param_bytes = params_alive(0);
    if (ddp) {
      int64_t largest_bucket = 0;
      for (const auto& u : model.units) {
        for (int64_t n : ddp_bucket_numels(u, setup.bucket_cap_bytes, rb)) largest_bucket = std::max(largest_bucket, n);
      }
      m.sharded_grad_bytes = state.sharded_grad_bytes;
      m.unsharded_grad_bytes = rb * largest_bucket;
    } else {
      m.sharded_grad_bytes = state.sharded_grad_bytes - sharded_grad(0) - (L >= 1 ? sharded_grad(1) : 0);
      // The first block's reduce-scatter and the root's run one after the other.
      m.unsharded_grad_bytes = full_grad(0) + reduce_input(0) + (L >= 1 ? reduce_held(1) : 0) +
                               std::max(reduce_running(0), L >= 1 ? reduce_running(1) : 0);
      // Had the first block's finished before the root's started: the root's running bytes alone.
      if (L >= 1) m.reduce_in_flight_bytes = std::max(reduce_running(0), reduce_running(1)) - reduce_running(0);
    }
    m.activation_bytes = act.root_lookup_bytes;
    moments.consider(m);
  }
  {  // Optimizer step: every sharded gradient; AdamW's (sqrt(v) / c) + eps makes two temporaries
     // of the parameter being updated.
    PeakBytes m = base;
    m.moment = "optimizer step";
    m.sharded_grad_bytes = state.sharded_grad_bytes;
    if (setup.optimizer == OptimizerKind::kAdamW) {
      int64_t largest = 0;
      for (const auto& n : un) largest = std::max(largest, n.largest_real_param);
      m.optimizer_temp_bytes = 2 * 4 * largest;
    }
    moments.consider(m);
  }
  return best;
}

}  // namespace fsdp::planner
