#include "plan/plan_flags.h"

#include "fsdp/comm/backend_registry.h"
#include "fsdp/comm/world.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <vector>

#include "fsdp/common/check.h"
#include "train/value_bounds.h"

namespace apps::plan {
namespace fp = fsdp::planner;

namespace {

// "7e9", "7B", "1.3B", "350M", "124439808" -> a count.
int64_t parse_count(const std::string& text) {
  size_t i = 0;
  double v = 0;
  try {
    v = std::stod(text, &i);
  } catch (const std::exception&) {
    throw UsageError("--params '" + text + "' is not a count like 7e9, 7B or 350M");
  }
  const std::string unit = text.substr(i);
  double mult = 1;
  if (unit == "K" || unit == "k") mult = 1e3;
  else if (unit == "M" || unit == "m") mult = 1e6;
  else if (unit == "B" || unit == "b" || unit == "G") mult = 1e9;
  else if (unit == "T" || unit == "t") mult = 1e12;
  else if (!unit.empty()) throw UsageError("--params '" + text + "' is not a count like 7e9, 7B or 350M");
  const double n = std::round(v * mult);
  if (!(n >= 1)) throw UsageError("--params must be at least 1, got '" + text + "'");
  if (n > 1e15) throw UsageError("--params '" + text + "' is above 1e15 parameters");
  return static_cast<int64_t>(n);
}

bool is_llama(const std::string& model) {
  for (const auto& n : fp::llama_preset_names()) {
    if (n == model) return true;
  }
  return false;
}

}  // namespace

int launcher_rank() { return fsdp::comm::launcher_rank(); }

std::optional<PlanFlags> parse_plan_flags(int argc, char** argv, int rank, int* exit_code) {
  PlanFlags f;
  CLI::App app{
      "fsdp-plan: memory, traffic and step time per rank of every sharding strategy (DDP, ZeRO-1, "
      "ZeRO-2, ZeRO-3, hybrid), and which one to use.\n"
      "  fsdp-plan --model llama2-13b --world-size 64 --mixed-precision bf16 --profile h100\n"
      "  mpirun -n 2 fsdp-plan --calibrate --out PROFILE.json   (measures this machine)"};
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::vector<std::string> models = fp::model_preset_names();
  // Bounds wide enough for any real plan, with fsdp-train's validators: readable limits (CLI11's
  // PositiveNumber prints the largest double), "not an integer" for text, nan and inf refused.
  using apps::train::int_in;
  using apps::train::real_in;
  const CLI::Validator positive = int_in(1, int64_t(1) << 40), non_negative = int_in(0, int64_t(1) << 40);

  app.add_option("--model", f.model, "Model preset: fsdp-train's GPTs or the Llama-2 decoders")
      ->check(CLI::IsMember(models))->group("Model");
  app.add_option("--params", f.params,
                 "A model known only by its parameter count (7e9, 7B, 350M): model state and traffic, "
                 "no activations. Replaces --model")
      ->group("Model");
  app.add_option("--units", f.units, "--params: block units the parameters are split into")
      ->check(positive)->group("Model");
  app.add_option("--n-layer", f.n_layer, "Override the preset's number of blocks (0: keep)")->check(non_negative)->group("Model");
  app.add_option("--n-head", f.n_head, "Override the preset's attention heads (0: keep)")->check(non_negative)->group("Model");
  app.add_option("--n-kv-head", f.n_kv_head, "Llama-2: override the key/value heads (0: keep)")->check(non_negative)->group("Model");
  app.add_option("--n-embd", f.n_embd, "Override the preset's width in channels (0: keep)")->check(non_negative)->group("Model");
  app.add_option("--ffn-hidden", f.ffn_hidden, "Llama-2: override the MLP's intermediate size (0: keep)")
      ->check(non_negative)->group("Model");
  app.add_option("--block-size", f.block_size, "Override the context length in tokens (0: keep)")
      ->check(non_negative)->group("Model");
  app.add_option("--vocab-size", f.vocab_size,
                 "Vocabulary size in tokens (0: the preset's, as --dry-run: GPT-2's 50257 for gpt2*, 32000 for llama2-*, "
                 "8192 (fsdp-train's default tokenizer) for nano, micro and llama-tiny)")
      ->check(non_negative)->group("Model");
  app.add_option("--attention", f.attention, "GPT attention kernel, as fsdp-train's --attention")
      ->check(CLI::IsMember({"auto", "flash", "math"}))->group("Model");

  apps::train::add_lora_flags(app, &f.lora_rank, &f.lora_target_modules, "Model");
  // fsdp-train's other LoRA flags change no byte and no FLOP: taken, so that its command line plans as it is.
  app.add_option("--lora-alpha", f.lora_alpha, "As fsdp-train's; it changes neither memory nor time")
      ->check(apps::train::real_in(0.0, 1e12, /*lo_open=*/true))->group("Model");
  app.add_option("--lora-dropout", f.lora_dropout, "As fsdp-train's; it changes neither memory nor time")
      ->check(apps::train::real_below(0.0, 1.0))->group("Model");
  app.add_option("--world-size", f.world_size, "Ranks (GPUs or processes) in the data-parallel group")
      ->check(int_in(1, int64_t(1) << 20))->group("Parallelism");
  app.add_option("--ranks-per-node", f.ranks_per_node, "Ranks per node (0: the profile's)")
      ->check(non_negative)->group("Parallelism");
  app.add_option("--strategy", f.strategy,
                 "all, or one of no_shard (DDP), zero1, shard_grad_op (ZeRO-2), full_shard (ZeRO-3), hybrid_shard")
      ->check(CLI::IsMember({"all", "no_shard", "zero1", "shard_grad_op", "full_shard", "hybrid_shard"}))
      ->group("Parallelism");
  app.add_option("--hybrid-shard-group-size", f.hybrid_shard_group_size,
                 "hybrid_shard: ranks per shard group (must divide the world size; 0 = all ranks, as "
                 "fsdp-train; unset: the ranks per node). An error with another strategy")
      ->check(non_negative)->group("Parallelism");
  app.add_option("--mixed-precision", f.mixed_precision,
                 "Unsharded param and gradient-reduction dtype (master weights and optimizer state stay fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))->group("Parallelism");
  app.add_option("--optimizer", f.optimizer, "adamw (8 B/param of state; adam: the same state and update cost, planned as adamw), sgd-momentum (4), sgd (0)")
      ->check(CLI::IsMember({"adamw", "adam", "sgd-momentum", "sgd"}))->group("Parallelism");
  app.add_option("--forward-prefetch", f.forward_prefetch, "Issue the next unit's all-gather at each pre-forward (true|false)")
      ->check(apps::train::boolean_word())
      ->group("Parallelism");
  app.add_option("--max-unsharded-units", f.max_unsharded_units,
                 "Units (root excluded) holding full params at once, prefetch included")
      ->check(positive)->group("Parallelism");
  app.add_option("--bucket-cap-mb", f.bucket_cap_mb, "no_shard: gradient all-reduce bucket size in MiB (default 25)")
      ->check(real_in(1e-6, 1e6))->group("Parallelism");
  app.add_option("--all-gather-codec", f.all_gather_codec,
                 "What the all-gathers carry: none (param dtype) or int8 (blocks of 256 with an fp32 scale, "
                 "as fsdp-train's --all-gather-codec). An error with --strategy no_shard")
      ->check(CLI::IsMember({"none", "int8"}))->group("Parallelism");
  app.add_option("--reshard-after-forward", f.reshard_after_forward,
                 "full_shard, hybrid_shard: keep each unit's params sharded over this many ranks (or host: "
                 "the ranks per node) from forward to backward, whose all-gathers then stay there (as "
                 "fsdp-train's --reshard-after-forward; 0 = off); with --strategy all, applied where it "
                 "divides the shard group (labels say node=g)")
      ->check(apps::train::ranks_or_host(/*zero_allowed=*/true))
      ->group("Parallelism");
  app.add_option("--reduce-scatter-codec", f.reduce_scatter_codec,
                 "What the reduce-scatters carry: none (reduce dtype) or int8 (blocks quantised by their "
                 "sender, averaged in fp32 by their owner; with --host-aware-collectives only across hosts; as "
                 "fsdp-train's --reduce-scatter-codec). An error with --strategy no_shard")
      ->check(CLI::IsMember({"none", "int8"}))->group("Parallelism");
  app.add_option("--host-aware-collectives", f.host_aware_collectives,
                 "All-gathers across hosts then inside, reduce-scatters inside then across, with this many "
                 "ranks per host (or host: the ranks per node; as fsdp-train's --host-aware-collectives; "
                 "0 = off); with --strategy all, applied where it divides the shard group (labels say host=h)")
      ->check(apps::train::ranks_or_host(/*zero_allowed=*/true))
      ->group("Parallelism");

  app.add_option("--global-batch-size", f.global_batch_size,
                 "Sequences per optimizer step, all ranks together (0: micro-batch x world size)")
      ->check(non_negative)->group("Step");
  app.add_option("--micro-batch-size", f.micro_batch_size,
                 "Sequences per forward per rank (0: global / world size, or 1)")
      ->check(non_negative)->group("Step");
  app.add_option("--seq-len", f.seq_len,
                 "Tokens per sequence (0: 128 for the GPTs, fsdp-train's default; the context for Llama-2)")
      ->check(non_negative)->group("Step");
  app.add_flag("--activation-checkpointing", f.activation_checkpointing,
               "Keep only each block's input in forward and recompute the block in backward")
      ->group("Step");
  app.add_option("--checkpoint-every", f.checkpoint_every,
                 "With --activation-checkpointing: checkpoint only blocks k, 2k, ... (per-block selective; 1: all)")
      ->check(positive)->group("Step");

  app.add_option("--profile", f.profile, "Device profile: h100, a100 (datasheet figures) or a file from --calibrate")
      ->group("Machine");
  app.add_option("--memory-per-rank", f.memory_per_rank, "Memory per rank, e.g. 80GB, 80GiB (default: the profile's)")
      ->group("Machine");
  app.add_option("--headroom", f.headroom,
                 "Share of the memory per rank kept free: a strategy fits when its peak <= (1 - headroom) x memory")
      ->check(real_in(0.0, 0.99))->group("Machine");
  app.add_option("--compute-efficiency", f.compute_efficiency,
                 "Fraction of the profile's matmul peak a step's hardware FLOPs (recompute included) reach "
                 "(default: the profile's; h100 and a100: the published training efficiency at the model's "
                 "width for bf16/fp16, docs/planner.md \"Profiles\"; 1 for fp32)")
      ->check(real_in(fp::kMinComputeEfficiency, 1.0))->group("Machine");
  app.add_option("--reduce-scatter-route", f.reduce_scatter_route,
                 "What a reduce-scatter holds while it runs: all_to_all (fsdp-train over MPI or Gloo: the "
                 "received blocks, and for bf16/fp16 a float32 shard and the block being widened) or in_place "
                 "(NCCL's ring). Default: in_place for a profile with NCCL's network model (h100, a100, or "
                 "--nics-per-node given), else all_to_all")
      ->check(CLI::IsMember({"all_to_all", "in_place"}))->group("Machine");
  app.add_option("--nics-per-node", f.nics_per_node,
                 "Network adapters per node for collectives across nodes (default: the profile's; h100 and a100: "
                 "8). Turns on NCCL's network model, and with it NCCL's in-place reduce-scatter unless "
                 "--reduce-scatter-route says otherwise")
      ->check(positive)->group("Machine");
  app.add_option("--inter-node-bandwidth", f.inter_node_bandwidth,
                 "Rate of the network between nodes, each direction, e.g. 200Mbit, 10Gbit/s, 3GB/s: one network "
                 "adapter's where the profile has several (h100, a100: 8; --nics-per-node 1 for one link per "
                 "node), else the node's one link, shared by the groups that cross it at once (default: the "
                 "profile's; a --calibrate profile measured one node and repeats its own links)")
      ->group("Machine");
  app.add_option("--rank", f.rank, "Whose bytes to report (rank 0 holds the most real rows)")
      ->check(non_negative)->group("Machine");

  app.add_flag("--json", f.json, "Print the plan as JSON (for scripts) instead of tables")->group("Output");

  app.add_flag("--calibrate", f.calibrate,
               "Measure this machine under mpirun -n N: collective times over the MPI group (at the model's own "
               "message sizes too) and their cost beside compute, "
               "matmul FLOP rates of the model's shapes, a training forward + backward of the model, the "
               "step update per tensor size; writes --out")
      ->group("Calibration");
  app.add_option("--out", f.out, "--calibrate: the profile file to write")->group("Calibration");
  app.add_option("--backend", f.backend, "--calibrate: the collectives measured: " + fsdp::comm::backend_flag_help())
      ->check(apps::train::world_backend_name("fsdp-plan"))->group("Calibration");
  app.add_option("--threads", f.threads, "--calibrate: intra-op threads per rank")->check(positive)->group("Calibration");
  app.add_option("--name", f.name, "--calibrate: the profile's name")->group("Calibration");

  try {
    apps::train::reject_empty_values(app, std::vector<std::string>(argv + (argc > 0 ? 1 : 0), argv + argc));
    app.parse(argc, argv);
    f.profile_given = app.count("--profile") > 0;
    if (f.calibrate && f.out.empty()) throw CLI::ValidationError("--calibrate", "needs --out PROFILE.json");
    if (!f.calibrate && (!f.out.empty() || !f.name.empty())) {
      throw CLI::ValidationError("--out/--name", "apply to --calibrate only");
    }
  } catch (const CLI::CallForHelp& e) {
    std::ostringstream none;
    *exit_code = rank == 0 ? app.exit(e) : app.exit(e, none, none);
    return std::nullopt;
  } catch (const CLI::CallForAllHelp& e) {
    std::ostringstream none;
    *exit_code = rank == 0 ? app.exit(e) : app.exit(e, none, none);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    if (rank == 0) std::cerr << "fsdp-plan: error: " << e.what() << " (see --help)" << std::endl;
    *exit_code = 2;
    return std::nullopt;
  }
  return f;
}

namespace {

// The preset or shape of f, before any LoRA adapters.
fp::ModelSpec base_model(const PlanFlags& f);

}  // namespace

fp::ModelSpec resolve_model(const PlanFlags& f) {
  if (f.lora_rank == 0) {
    if (!f.lora_target_modules.empty() || f.lora_alpha || f.lora_dropout) {
      throw UsageError(std::string(!f.lora_target_modules.empty() ? "--lora-target-modules"
                                   : f.lora_alpha                   ? "--lora-alpha"
                                                                    : "--lora-dropout") +
                       " needs --lora-rank R");
    }
    return base_model(f);
  }
  if (!f.params.empty()) {
    throw UsageError("--lora-rank needs a model with layers to adapt (--model), not --params");
  }
  try {
    return fp::with_lora(base_model(f), f.lora_rank, fp::split_lora_targets(f.lora_target_modules));
  } catch (const fsdp::Error& e) {
    throw UsageError("--lora-target-modules: " + e.message());
  }
}

namespace {

fp::ModelSpec base_model(const PlanFlags& f) {
  if (!f.params.empty()) {
    if (f.n_layer || f.n_head || f.n_kv_head || f.n_embd || f.ffn_hidden || f.block_size || f.vocab_size) {
      throw UsageError("--params describes a model by its count alone: shape overrides do not apply");
    }
    const int64_t n = parse_count(f.params);
    return fp::params_only_model(n, f.units, "params-" + f.params);
  }
  if (is_llama(f.model)) {
    fp::LlamaShape s = fp::llama_shape(f.model);
    if (f.n_layer) s.n_layer = f.n_layer;
    if (f.n_head) s.n_head = f.n_head;
    if (f.n_kv_head) s.n_kv_head = f.n_kv_head;
    if (f.n_embd) s.n_embd = f.n_embd;
    if (f.ffn_hidden) s.ffn_hidden = f.ffn_hidden;
    if (f.block_size) s.context = f.block_size;
    if (f.vocab_size) s.vocab_size = f.vocab_size;
    if (f.attention != "auto") throw UsageError("--attention applies to the GPT presets (Llama-2 is planned with flash attention)");
    return fp::llama_model(s, f.model);
  }
  if (f.n_kv_head || f.ffn_hidden) {
    throw UsageError("--n-kv-head and --ffn-hidden apply to the Llama-2 presets (fsdp-train's GPT has "
                     "n_head key/value heads and a 4 x n_embd MLP)");
  }
  fp::GptShape s = fp::gpt_shape(f.model, f.vocab_size ? f.vocab_size : fp::preset_vocab_size(f.model));
  if (f.n_layer) s.n_layer = f.n_layer;
  if (f.n_head) s.n_head = f.n_head;
  if (f.n_embd) s.n_embd = f.n_embd;
  if (f.block_size) s.block_size = f.block_size;
  s.attention = f.attention;
  if (s.n_embd % s.n_head != 0) {
    throw UsageError("--n-embd " + std::to_string(s.n_embd) + " is not divisible by --n-head " + std::to_string(s.n_head));
  }
  return fp::gpt_model(s, f.model);
}

}  // namespace

fp::PlanInputs resolve_inputs(const PlanFlags& f) {
  fp::PlanInputs in;
  in.model = resolve_model(f);
  in.world_size = f.world_size;
  in.ranks_per_node = f.ranks_per_node;
  if (f.strategy != "all") in.strategy = fsdp::parse_sharding_strategy(f.strategy);
  if (f.hybrid_shard_group_size) {
    if (f.strategy != "hybrid_shard") {
      throw UsageError("--hybrid-shard-group-size applies to --strategy hybrid_shard only, not " + f.strategy);
    }
    const int64_t g = *f.hybrid_shard_group_size;
    if (g > 0 && f.world_size % g != 0) {
      throw UsageError("--hybrid-shard-group-size " + std::to_string(g) + " does not divide --world-size " +
                       std::to_string(f.world_size));
    }
    in.hybrid_shard_group_size = g == 0 ? f.world_size : g;
  }
  fp::StepSetup& st = in.step;
  st.precision = fp::parse_precision(f.mixed_precision);
  st.optimizer = fp::parse_optimizer(f.optimizer);
  st.forward_prefetch = f.forward_prefetch;
  st.max_unsharded_units = f.max_unsharded_units;
  st.loss_scaling = st.precision == fp::Precision::kFp16;  // fsdp-train's fp16 loss scaler
  if (f.bucket_cap_mb) {
    if (f.strategy != "no_shard" && f.strategy != "all") {
      throw UsageError("--bucket-cap-mb applies to --strategy no_shard only, not " + f.strategy);
    }
    st.bucket_cap_bytes = static_cast<int64_t>(*f.bucket_cap_mb * 1024 * 1024);
  }
  st.all_gather_codec = fsdp::parse_wire_codec(f.all_gather_codec);
  if (st.all_gather_codec != fsdp::WireCodec::kNone && f.strategy == "no_shard") {
    throw UsageError("--all-gather-codec " + f.all_gather_codec +
                     " applies to strategies that all-gather params, not no_shard (every rank keeps every param)");
  }
  if (f.reshard_after_forward && *f.reshard_after_forward != "0") {  // 0: off
    if (f.strategy != "all" && f.strategy != "full_shard" && f.strategy != "hybrid_shard") {
      throw UsageError("--reshard-after-forward " + *f.reshard_after_forward +
                       " applies to --strategy full_shard or hybrid_shard, not " + f.strategy +
                       " (it keeps each unit's params from forward to backward)");
    }
    in.reshard_after_forward_group_size = *f.reshard_after_forward == "host" ? -1 : std::stoll(*f.reshard_after_forward);
  }
  st.reduce_scatter_codec = fsdp::parse_wire_codec(f.reduce_scatter_codec);
  if (st.reduce_scatter_codec != fsdp::WireCodec::kNone && f.strategy == "no_shard") {
    throw UsageError("--reduce-scatter-codec " + f.reduce_scatter_codec +
                     " applies to strategies that reduce-scatter gradients, not no_shard (it all-reduces them)");
  }
  if (f.host_aware_collectives && *f.host_aware_collectives != "0") {  // 0: off
    if (f.strategy == "no_shard") {
      throw UsageError("--host-aware-collectives " + *f.host_aware_collectives +
                       " applies to strategies that all-gather params and reduce-scatter gradients, not no_shard");
    }
    in.collective_host_size = *f.host_aware_collectives == "host" ? -1 : std::stoll(*f.host_aware_collectives);
  }
  st.activation_checkpointing = f.activation_checkpointing;
  if (f.checkpoint_every != 1 && !f.activation_checkpointing) {
    throw UsageError("--checkpoint-every " + std::to_string(f.checkpoint_every) +
                     " needs --activation-checkpointing (it picks which blocks are checkpointed)");
  }
  st.checkpoint_every = f.checkpoint_every;
  // Sequence length: as fsdp-train (128) for its GPTs, the full context for Llama-2.
  const fp::Architecture& a = in.model.arch;
  int64_t seq = f.seq_len;
  if (seq == 0) {
    if (a.kind == fp::BlockKind::kGpt) seq = std::min<int64_t>(128, a.context);
    else if (a.kind == fp::BlockKind::kLlama) seq = a.context;
    else seq = 2048;
  }
  if (a.context > 0 && seq > a.context) {
    throw UsageError("--seq-len " + std::to_string(seq) + " exceeds the model's context of " +
                     std::to_string(a.context) + " tokens (raise --block-size)");
  }
  st.seq_len = seq;
  // Batch geometry exactly as fsdp-train resolves it (train/model_setup.cpp: resolve_batch).
  const int64_t N = f.world_size;
  if (f.global_batch_size > 0) {
    if (f.global_batch_size % N != 0) {
      throw UsageError("--global-batch-size " + std::to_string(f.global_batch_size) +
                       " is not divisible by the world size " + std::to_string(N));
    }
    const int64_t rows = f.global_batch_size / N;
    const int64_t micro = f.micro_batch_size > 0 ? f.micro_batch_size : rows;
    if (rows % micro != 0) {
      throw UsageError("--micro-batch-size " + std::to_string(micro) + " does not divide the " + std::to_string(rows) +
                       " sequences per rank (--global-batch-size " + std::to_string(f.global_batch_size) + " / " +
                       std::to_string(N) + " ranks)");
    }
    st.micro_batch_size = micro;
    st.accumulation_steps = rows / micro;
  } else {
    st.micro_batch_size = f.micro_batch_size > 0 ? f.micro_batch_size : 1;
    st.accumulation_steps = 1;
  }
  in.profile = fp::load_profile(f.profile);
  if (f.compute_efficiency) {
    if (!std::isfinite(*f.compute_efficiency)) {  // CLI11's range check lets nan through
      throw UsageError("--compute-efficiency must be a number in [" + fsdp::str_cat(fp::kMinComputeEfficiency) +
                       ", 1], got " + fsdp::str_cat(*f.compute_efficiency));
    }
    if (in.profile.model_flops_per_s(st.precision) > 0) {
      throw UsageError("--compute-efficiency scales a profile's matmul peak; profile '" + in.profile.name +
                       "' has a measured " + fp::to_string(st.precision) +
                       " model rate (from --calibrate), which is already what a step reaches");
    }
    in.profile.compute_efficiency = *f.compute_efficiency;
    // The user's own figure wins over the profile's published ones, and the profile says so.
    in.profile.clear_achieved_efficiency();
    in.profile.sources.push_back("compute efficiency " + std::to_string(*f.compute_efficiency) +
                                 ": --compute-efficiency (replaces any achieved efficiency cited above)");
  }
  if (f.nics_per_node) {
    if (in.profile.nics_per_node == 0) {
      in.profile.collective_base_latency_s = 0;  // a profile without the NCCL model states no fixed cost
    }
    in.profile.nics_per_node = *f.nics_per_node;
  }
  if (!f.inter_node_bandwidth.empty()) {
    double rate = 0;
    try {
      rate = fp::parse_link_rate_bytes_per_s(f.inter_node_bandwidth);
    } catch (const fsdp::Error&) {
      throw UsageError("--inter-node-bandwidth '" + f.inter_node_bandwidth +
                       "' is not a link rate like 200Mbit, 10Gbit/s, 25Gbps or 3GB/s");
    }
    if (rate < 1.0 || rate > fp::kMaxProfileRatePerS) {
      throw UsageError("--inter-node-bandwidth '" + f.inter_node_bandwidth + "' is " + fp::format_bytes(rate) +
                       "/s each direction, outside [1 B/s, 1e18 B/s]");
    }
    if (!in.profile.has_collectives) {
      throw UsageError("--inter-node-bandwidth: profile '" + in.profile.name +
                       "' has no collective figures (calibrated at one rank)");
    }
    for (fp::CollectiveLinks* l : {&in.profile.all_gather, &in.profile.reduce_scatter, &in.profile.all_reduce}) {
      l->inter_node.bandwidth_bytes_per_s = rate;
    }
    in.profile.sources.push_back("link between nodes " + f.inter_node_bandwidth + " (" + fp::format_bytes(rate) +
                                 "/s each direction): --inter-node-bandwidth");
  }
  if (!f.memory_per_rank.empty()) {
    try {
      in.memory_per_rank_bytes = fp::parse_bytes(f.memory_per_rank);
    } catch (const fsdp::Error& e) {
      throw UsageError("--memory-per-rank '" + f.memory_per_rank + "' is not a byte count like 80GB, 80GiB or 512MiB");
    }
    if (in.memory_per_rank_bytes <= 0) throw UsageError("--memory-per-rank must be more than 0 bytes");
  }
  if (f.ranks_per_node > 0 && N % f.ranks_per_node != 0) {
    throw UsageError("--ranks-per-node " + std::to_string(f.ranks_per_node) + " does not divide --world-size " +
                     std::to_string(N) + " (every node holds the same number of ranks)");
  }
  in.headroom = f.headroom;
  if (!f.reduce_scatter_route.empty()) in.reduce_scatter_route = fp::parse_reduce_scatter_route(f.reduce_scatter_route);
  if (f.rank >= N) throw UsageError("--rank " + std::to_string(f.rank) + " is not below --world-size " + std::to_string(N));
  in.rank = f.rank;
  return in;
}

}  // namespace apps::plan
