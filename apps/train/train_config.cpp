#include "train/train_config.h"

#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <limits>

#include "fsdp/accounting/budget.h"
#include "fsdp/comm/backend_registry.h"
#include <sstream>
#include <vector>

#include "train/config_file.h"
#include "train/value_bounds.h"

namespace apps::train {

std::optional<TrainConfig> parse_train_config(int argc, char** argv, int rank, int* exit_code) {
  TrainConfig c;
  CLI::App app{
      "fsdp-train: trains a GPT-2-style or Llama-2-style model with Fully Sharded Data Parallel over MPI or Gloo.\n"
      "Launch: mpirun -n N fsdp-train [flags], or torchrun --no-python --nproc-per-node N fsdp-train [flags]. "
      "Rank 0 prints; every rank runs the same flags."};
  // One line per error, like every other failure of fsdp-train (CLI11's default adds a second).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("fsdp-train: error: ") + e.what() + " (see --help)\n";
  });
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  // Bounds: wide enough for any real run, narrow enough to catch a typo (value_bounds.h).
  constexpr int64_t kMaxSize = int64_t(1) << 30;

  // Model
  app.add_option("--model", c.model,
                 "Model preset: GPT-2-style (nano, micro, gpt2*) or Llama-2-style (llama-tiny, llama2-*; "
                 "RMSNorm, rotary positions, grouped-query attention, SwiGLU, untied head), at the tokenizer's "
                 "vocabulary")
      ->check(CLI::IsMember({"nano", "micro", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-tiny",
                             "llama2-7b", "llama2-13b", "llama2-70b"}))
      ->group("Model");
  app.add_flag("--meta-init", c.meta_init,
               "Build the model on the meta device and initialise only this rank's shards, unit by unit "
               "(same values; no rank holds the full model)")
      ->group("Model");
  app.add_flag("--dry-run", c.dry_run,
               "Lay out and account one rank of a --world-size job in this process (meta tensors, "
               "simulated ranks): print its bytes by kind and exit; no data, no mpirun")
      ->group("Dry run");
  app.add_option("--world-size", c.dry_run_world_size, "Ranks of the simulated job (with --dry-run)")
      ->check(int_in(1, kMaxSize))->group("Dry run");
  app.add_option("--dry-run-rank", c.dry_run_rank, "The simulated rank whose bytes are printed (default 0)")
      ->check(int_in(0, kMaxSize))->group("Dry run");
  app.add_option("--n-layer", c.n_layer, "Override the preset's number of blocks (0: keep)")
      ->check(int_in(0, 10000))->group("Model");
  app.add_option("--n-head", c.n_head, "Override the preset's attention heads (0: keep)")
      ->check(int_in(0, 10000))->group("Model");
  app.add_option("--n-embd", c.n_embd, "Override the preset's width in channels (0: keep)")
      ->check(int_in(0, 1 << 20))->group("Model");
  app.add_option("--block-size", c.block_size,
                 "Override the preset's context length in tokens (0: keep)")
      ->check(int_in(0, 1 << 24))->group("Model");
  app.add_option("--n-kv-head", c.n_kv_head,
                 "Llama only: override the key/value heads (grouped-query attention; divides --n-head; 0: keep)")
      ->check(int_in(0, 10000))->group("Model");
  app.add_option("--ffn-hidden", c.ffn_hidden, "Llama only: override the SwiGLU hidden width (0: keep)")
      ->check(int_in(0, 1 << 24))->group("Model");
  app.add_option("--attention", c.attention,
                 "Attention kernel: flash (libtorch's fused kernel), math (two matmuls, fp32 "
                 "softmax), auto (math for bf16/fp16 at seq len <= 256, where it is faster on CPUs; "
                 "flash otherwise)")
      ->check(CLI::IsMember({"auto", "flash", "math"}))->group("Model");
  // Data
  app.add_option("--data-dir", c.data_dir,
                 "Folder prepared by scripts/prepare_data.sh (tokenizer spm_<vocab>.model, corpus/)")
      ->group("Data");
  app.add_option("--data", c.data,
                 "Training text: a folder holding train.txt and val.txt, or one text file whose "
                 "last 5% of tokens is the validation set (default: <data-dir>/corpus). Or token ids "
                 "of any tokenizer, pre-tokenized as nanoGPT writes them (uint16, or --data-dtype): a "
                 "FILE.bin, or a folder holding train.bin and val.bin; no tokenizer is read, the "
                 "vocabulary is --init-from-hf's or --vocab-size")
      ->group("Data");
  app.add_option("--data-dtype", c.data_dtype,
                 "Element type of pre-tokenized .bin ids: uint16 (nanoGPT's) or uint32 (vocabularies past 65536)")
      ->check(CLI::IsMember({"uint16", "uint32"}))->group("Data");
  app.add_option("--tokenizer", c.tokenizer,
                 "A SentencePiece model file to read the text with (e.g. Llama-2's tokenizer.model) "
                 "instead of <data-dir>/spm_<vocab>.model; the vocabulary is the file's")
      ->group("Data");
  app.add_option("--vocab-size", c.vocab_size,
                 "Tokenizer vocabulary size in tokens: selects <data-dir>/spm_<vocab>.model (with "
                 "pre-tokenized --data: the model's vocabulary; every id must be below it)")
      ->check(int_in(1, 1 << 24))->group("Data");
  // Parallelism
  app.add_option("--strategy", c.strategy,
                 "Sharding strategy: full_shard (ZeRO-3), shard_grad_op (ZeRO-2), zero1, no_shard "
                 "(DDP), hybrid_shard (see --hybrid-shard-group-size)")
      ->group("Parallelism");
  app.add_option("--mixed-precision", c.mixed_precision,
                 "Unsharded param and gradient-reduction dtype (master weights and optimizer state "
                 "stay fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))->group("Parallelism");
  app.add_option_function<std::string>(
         "--threads",
         [&c](const std::string& v) {
           if (v == "auto") {
             c.threads = 0;
           } else if (!v.empty() && v.size() < 6 && v.find_first_not_of("0123456789") == std::string::npos &&
                      std::stoi(v) > 0) {
             c.threads = std::stoi(v);
           } else {
             throw CLI::ValidationError("--threads", "expected a positive integer or auto, got '" + v + "'");
           }
         },
         "Intra-op CPU threads per rank (at::set_num_threads): a number, or auto = the CPUs this "
         "rank may run on (its affinity mask: 1 with mpirun --bind-to core, a socket's cores with "
         "--map-by socket --bind-to socket). Default 1, or FSDP_THREADS")
      ->envname("FSDP_THREADS")->group("Parallelism");
  app.add_option("--forward-prefetch", c.forward_prefetch,
                 "Issue the next unit's all-gather at each pre-forward (true|false)")
      ->check(boolean_word())->group("Parallelism");
  app.add_option("--hybrid-shard-group-size", c.hybrid_shard_group_size,
                 "hybrid_shard: ranks per shard group (consecutive ranks); must divide the world "
                 "size; 0 = all ranks (then hybrid_shard equals full_shard); host = one shard "
                 "group per host (every host must hold the same number of consecutive ranks). "
                 "Default 0, or FSDP_HYBRID_SHARD_GROUP_SIZE; an error with another strategy")
      ->check(ranks_or_host(/*zero_allowed=*/true))
      ->envname("FSDP_HYBRID_SHARD_GROUP_SIZE")->group("Parallelism");
  app.add_option("--all-gather-codec", c.all_gather_codec,
                 "What the params are on the wire of the all-gathers: none (param dtype, exact) or "
                 "int8 (blocks of 256 elements with one fp32 scale each, ZeRO++'s qwZ: about 1/4 of "
                 "fp32's bytes, 1/2 of bf16's; master weights, gradients and optimizer state stay "
                 "exact). Default none, or FSDP_ALL_GATHER_CODEC; int8 is an error with no_shard")
      ->check(CLI::IsMember({"none", "int8"}))->envname("FSDP_ALL_GATHER_CODEC")->group("Parallelism");
  app.add_option("--reshard-after-forward", c.reshard_after_forward,
                 "full_shard, hybrid_shard: after each unit's forward keep its params sharded over this "
                 "many consecutive ranks (a number dividing the shard group size), or host (the ranks of "
                 "each host; every host must hold the same number of consecutive ranks), and all-gather "
                 "the backward's params from them only (ZeRO++'s hpZ): the backward's all-gathers stay "
                 "inside the host, for 1/g of each unit's params per rank held from forward to backward "
                 "(g: that many ranks). host where the shard group lies inside one host, or the shard "
                 "group's own size: nothing to do (off). 0 = off (default, or FSDP_RESHARD_AFTER_FORWARD); "
                 "an error with another strategy")
      ->check(ranks_or_host(/*zero_allowed=*/true))
      ->envname("FSDP_RESHARD_AFTER_FORWARD")->group("Parallelism");
  app.add_option("--reduce-scatter-codec", c.reduce_scatter_codec,
                 "What the gradients are on the wire of the reduce-scatters: none (reduce dtype) or int8 "
                 "(ZeRO++'s qgZ: each block of 256 elements quantised with one fp32 scale by its sender, "
                 "moved in one all-to-all, averaged in fp32 by its owner; with --host-aware-collectives "
                 "only the stage across hosts is int8). Sharded gradients and optimizer state stay exact "
                 "sums of what arrives. Default none, or FSDP_REDUCE_SCATTER_CODEC; int8 is an error with "
                 "no_shard")
      ->check(CLI::IsMember({"none", "int8"}))->envname("FSDP_REDUCE_SCATTER_CODEC")->group("Parallelism");
  app.add_option("--host-aware-collectives", c.host_aware_collectives,
                 "Run each all-gather across hosts first (the ranks at the same place on each host), then "
                 "inside the host, and each reduce-scatter inside the host first, then across hosts, so "
                 "that a byte crosses a host link once per host pair instead of once per rank: host (the "
                 "launcher's ranks per host; every host must hold the same number of consecutive ranks) "
                 "or a number of consecutive ranks dividing the shard group size. host where the shard "
                 "group lies inside one host: nothing to do (off). 0 = off (default, or "
                 "FSDP_HOST_AWARE_COLLECTIVES); an error with no_shard")
      ->check(ranks_or_host(/*zero_allowed=*/true))
      ->envname("FSDP_HOST_AWARE_COLLECTIVES")->group("Parallelism");
  app.add_option("--bucket-cap-mb", c.bucket_cap_mb,
                 "no_shard: gradient all-reduce bucket size in MiB (issued during backward). "
                 "Default 25; an error with another strategy")
      ->check(real_in(0, 1 << 20, /*lo_open=*/true))->group("Parallelism");
  app.add_flag("--activation-checkpointing", c.activation_checkpointing,
               "Recompute each block's activations in backward instead of keeping them from the "
               "forward (fsdp::call_checkpointed): less activation memory, one more block forward "
               "per step")
      ->group("Parallelism");
  app.add_option("--memory-budget", c.memory_budget,
                 "Per-rank memory budget for CPU tensors, e.g. 600MB or 1.5GiB (KB/MB/GB: powers of "
                 "1000; KiB/MiB/GiB: of 1024): an allocation past it stops the run with one error "
                 "line naming the rank, unit, phase and bytes (exit 1). Default: none")
      ->group("Parallelism");
  // Optimisation
  app.add_option("--global-batch-size", c.global_batch_size,
                 "Sequences per optimizer step, all ranks together (divisible by the world size)")
      ->check(int_in(1, kMaxSize))->group("Optimisation");
  app.add_option("--micro-batch-size", c.micro_batch_size,
                 "Sequences per forward/backward per rank; gradient accumulation steps = "
                 "G / (N * micro). 0: G/N (no accumulation)")
      ->check(int_in(0, kMaxSize))->group("Optimisation");
  app.add_option("--seq-len", c.seq_len, "Tokens per training sequence (<= context length)")
      ->check(int_in(1, 1 << 24))->group("Optimisation");
  app.add_option("--steps", c.steps, "Optimizer steps")->check(int_in(1, kMaxSize))->group("Optimisation");
  app.add_option("--lr", c.lr, "Peak learning rate (AdamW)")->check(real_in(0, 1e3, /*lo_open=*/true))->group("Optimisation");
  app.add_option("--min-lr", c.min_lr, "Learning rate at the end of the cosine decay (default: --lr / 10)")
      ->check(real_in(0, 1e3))
      ->default_str("")  // the default follows --lr (below); the initial value would mislead
      ->group("Optimisation");
  app.add_option("--warmup-steps", c.warmup_steps,
                 "Steps of linear warmup from lr/warmup to lr, then cosine decay to --min-lr")
      ->check(int_in(0, kMaxSize))->group("Optimisation");
  app.add_option("--weight-decay", c.weight_decay,
                 "AdamW decoupled weight decay, applied to the Linear weight matrices only (not to "
                 "biases, LayerNorm weights or the token/position embeddings)")
      ->check(real_in(0, 1e3))->group("Optimisation");
  app.add_option("--beta1", c.beta1, "AdamW beta1")->check(real_below(0, 1))->group("Optimisation");
  app.add_option("--beta2", c.beta2, "AdamW beta2")->check(real_below(0, 1))->group("Optimisation");
  app.add_option("--adamw-kernel", c.adamw_kernel,
                 "fused: one vectorised pass per tensor (fsdp::optim::FusedAdamW, the kernel of "
                 "torch.optim.AdamW(fused=True)); libtorch: torch::optim::AdamW's chain of element-wise "
                 "ops. The same update to rounding; checkpoints of either resume under the other")
      ->check(CLI::IsMember({"fused", "libtorch"}))->group("Optimisation");
  app.add_option("--grad-clip", c.grad_clip,
                 "Max global L2 norm of the gradient (fsdp::clip_grad_norm); 0: no clipping")
      ->check(real_in(0, 1e12))->group("Optimisation");
  app.add_option("--seed", c.seed, "Seed of model init, data order and sampling")
      ->check(int_in(0, std::numeric_limits<int64_t>::max()))->group("Optimisation");
  app.add_option("--on-nonfinite", c.on_nonfinite,
                 "A NaN or inf loss or gradient norm on any rank: 'stop' (exit 1 naming the step "
                 "and the ranks, before the optimizer step: no checkpoint holds it) or 'skip' (drop "
                 "the step's update, as the fp16 loss scaler does, and go on)")
      ->check(CLI::IsMember({"stop", "skip"}))->group("Optimisation");
  app.add_option("--on-output-error", c.on_output_error,
                 "A write of --metrics or --trace that fails (a full disk): 'warn' (said once, naming "
                 "the file and errno; training goes on) or 'stop' (every rank exits 1 after the "
                 "step whose output failed). A failed checkpoint always stops the run")
      ->check(CLI::IsMember({"warn", "stop"}))->group("Output");
  // Evaluation and output
  app.add_option("--eval-every", c.eval_every,
                 "Steps between validation passes (0: only after the last step)")
      ->check(int_in(0, kMaxSize))->group("Output");
  app.add_option("--eval-batches", c.eval_batches,
                 "Global batches per validation pass (at most the validation set once)")
      ->check(int_in(1, kMaxSize))->group("Output");
  app.add_option("--sample-tokens", c.sample_tokens,
                 "Tokens to generate after training from --sample-prompt (0: no sample)")
      ->check(int_in(0, 1 << 24))->group("Output");
  app.add_option("--sample-prompt", c.sample_prompt, "Prompt of the sample")->group("Output");
  app.add_option("--sample-temperature", c.sample_temperature, "Sampling temperature (> 0)")
      ->check(real_in(0, 1e3, /*lo_open=*/true))->group("Output");
  app.add_option("--sample-top-k", c.sample_top_k, "Sample among the k most likely tokens (0: all)")
      ->check(int_in(0, 65536))->group("Output");
  app.add_option("--progress", c.progress,
                 "Console output of rank 0: 'bar' (one line updated in place), 'lines' (one line "
                 "per step), 'auto' (bar when stdout is a terminal; note that mpirun gives ranks a "
                 "pseudo-terminal even when its own output is redirected: use 'lines' for logs)")
      ->check(CLI::IsMember({"auto", "bar", "lines"}))->group("Output");
  app.add_option("--metrics", c.metrics,
                 "Write JSON lines (config, step, eval, end events) to this path (rank 0)")
      ->group("Output");
  app.add_option("--trace", c.trace,
                 "Write a Chrome trace (chrome://tracing, Perfetto) of all ranks to this path")
      ->group("Output");
  app.add_option("--backend", c.backend, "The world's collectives: " + fsdp::comm::backend_flag_help())
      ->check(world_backend_name("fsdp-train"))->group("Output");
  app.add_option("--collective-timeout", c.collective_timeout_s,
                 "Seconds a collective may take before the job stops with a diagnosis of who is where "
                 "(default: FSDP_COLLECTIVE_TIMEOUT_S, else 600)")
      ->check(real_in(0.001, 1e7))->group("Output");
  app.add_option("--flight-recorder-dir", c.flight_recorder_dir,
                 "Where each rank writes its last collectives on a timeout or a collective error "
                 "(default: FSDP_FLIGHT_RECORDER_DIR, else flight-recorder/ beside --metrics, else "
                 "./flight-recorder); read them with fsdp-diagnose DIR")
      ->group("Output");
  app.add_option("--profile", c.profile,
                 "Record libtorch's operator profile of the last --profile-steps steps: a Chrome "
                 "trace per rank at this path (PATH.rank<R> for R > 0) and a table of operators by "
                 "self time printed by rank 0")
      ->group("Output");
  app.add_option("--profile-steps", c.profile_steps, "Steps recorded by --profile (the last K)")
      ->check(int_in(1, kMaxSize))->group("Output");
  // Checkpoints
  app.add_option("--save", c.save,
                 "Write sharded checkpoints (fsdp::checkpoint::save_sharded) to this directory: "
                 "every --save-every steps and after the last step")
      ->group("Checkpoints");
  app.add_option("--save-every", c.save_every,
                 "Steps between checkpoints (0: only after the last step); needs --save")
      ->check(int_in(0, kMaxSize))->group("Checkpoints");
  app.add_option("--keep", c.keep, "Keep only the newest K checkpoints in --save (0: keep all)")
      ->check(int_in(0, 1 << 20))->group("Checkpoints");
  app.add_option("--resume", c.resume,
                 "Resume from a checkpoint directory, a directory of checkpoints (its latest), "
                 "'latest' (the latest in --save), or 'auto' (the latest in --save, or a fresh start "
                 "when it holds none: for restarts under torchrun --max-restarts). Any world size. "
                 "A missing or bad checkpoint is an error")
      ->group("Checkpoints");
  app.add_option("--export", c.export_path,
                 "After training, write the full state dict to this file (torch.load-able)")
      ->group("Checkpoints");
  app.add_option("--init-from-hf", c.init_from_hf,
                 "Start from a Hugging Face GPT2LMHeadModel or LlamaForCausalLM directory (config.json and "
                 "model.safetensors, or a split checkpoint with model.safetensors.index.json): the model's "
                 "family and shape come from its config.json, its weights are read straight into each "
                 "rank's shards; its vocabulary must be the tokenizer's (--tokenizer) or the ids' (--data FILE.bin)")
      ->group("Checkpoints");
  app.add_option("--export-hf", c.export_hf,
                 "After training, write the model to this directory as a Hugging Face GPT2LMHeadModel or "
                 "LlamaForCausalLM (config.json, model.safetensors, split with an index past 5 GB): "
                 "transformers' from_pretrained loads it")
      ->group("Checkpoints");
  app.add_option("--export-hf-dtype", c.export_hf_dtype,
                 "Dtype of the --export-hf tensors, cast from the fp32 master weights: fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))->group("Checkpoints");
  add_lora_flags(app, &c.lora_rank, &c.lora_target_modules, "LoRA");
  app.add_option("--lora-alpha", c.lora_alpha, "LoRA's alpha: the adapters' update is scaled by alpha / rank (PEFT's "
                                               "default 8)")
      ->check(real_in(0.0, 1e12, /*lo_open=*/true))->group("LoRA");
  app.add_option("--lora-dropout", c.lora_dropout, "Dropout on the adapters' input in training, in [0, 1)")
      ->check(real_below(0.0, 1.0))->group("LoRA");
  app.add_option("--export-adapter", c.export_adapter,
                 "After training, write the adapters alone to this directory in PEFT's format "
                 "(adapter_model.safetensors, adapter_config.json): PeftModel.from_pretrained(base, DIR) loads "
                 "them; --export-hf writes the merged model")
      ->group("LoRA");
  app.add_option("--import", c.import_path,
                 "Before training, load full weights from this file (written by --export or by "
                 "torch.save of a dict of tensors); optimizer state starts fresh (fine-tuning) "
                 "unless --import-optimizer is given")
      ->group("Checkpoints");
  app.add_option("--import-optimizer", c.import_optimizer_path,
                 "With --import: also load the optimizer state of the plain libtorch run that "
                 "saved those weights, from this file (torch::save(optimizer, PATH) of a "
                 "torch::optim::AdamW with fsdp-train's param groups: decay, then no-decay)")
      ->group("Checkpoints");
  app.add_option("--config", c.config_file,
                 "TOML file with the same keys as the long flags (e.g. global_batch_size = 32); "
                 "flags on the command line override it")
      ->group("Output");

  try {
    reject_empty_values(app, std::vector<std::string>(argv + (argc > 0 ? 1 : 0), argv + argc));
    std::vector<std::string> file_args;
    std::string config_path = find_config_flag(argc, argv);
    if (!config_path.empty()) file_args = config_file_args(config_path, app);
    std::vector<std::string> all{argv[0]};
    all.insert(all.end(), file_args.begin(), file_args.end());
    for (int i = 1; i < argc; ++i) all.emplace_back(argv[i]);
    std::vector<char*> ptrs;
    for (auto& s : all) ptrs.push_back(s.data());
    app.parse(static_cast<int>(ptrs.size()), ptrs.data());
    c.vocab_size_given = app.count("--vocab-size") > 0;
    c.model_given = app.count("--model") > 0;
    if (app.count("--min-lr") == 0) c.min_lr = c.lr / 10;
    if (c.min_lr > c.lr) throw CLI::ValidationError("--min-lr", "must not exceed --lr");
    if (!c.tokenizer.empty() && c.vocab_size_given) {
      throw CLI::ValidationError("--vocab-size", "cannot be combined with --tokenizer (the tokenizer file gives the "
                                                 "vocabulary)");
    }
    if (!c.memory_budget.empty()) {
      try {
        c.memory_budget_bytes = fsdp::accounting::parse_bytes(c.memory_budget);
      } catch (const fsdp::Error& e) {
        throw CLI::ValidationError("--memory-budget", e.message());
      }
      if (c.memory_budget_bytes <= 0) {
        throw CLI::ValidationError("--memory-budget", "must be more than 0 bytes, got '" + c.memory_budget + "'");
      }
    }
    if (c.dry_run != (c.dry_run_world_size > 0)) {
      throw CLI::ValidationError("--dry-run/--world-size", "must be given together (--dry-run --world-size N)");
    }
    if (!c.dry_run && c.dry_run_rank != 0) throw CLI::ValidationError("--dry-run-rank", "needs --dry-run");
    if (c.dry_run && c.dry_run_rank >= c.dry_run_world_size) {
      throw CLI::ValidationError("--dry-run-rank", "must be below --world-size");
    }
    if (c.dry_run) {  // a dry run trains nothing and reads no data: flags about that would be ignored
      const std::pair<const char*, bool> ignored[] = {
          {"--save", !c.save.empty()}, {"--resume", !c.resume.empty()}, {"--import", !c.import_path.empty()},
          {"--import-optimizer", !c.import_optimizer_path.empty()}, {"--export", !c.export_path.empty()},
          {"--init-from-hf", !c.init_from_hf.empty()}, {"--export-hf", !c.export_hf.empty()},
          {"--data", !c.data.empty()}, {"--tokenizer", !c.tokenizer.empty()}, {"--memory-budget", !c.memory_budget.empty()},
          {"--activation-checkpointing", c.activation_checkpointing}, {"--metrics", !c.metrics.empty()},
          {"--trace", !c.trace.empty()}};
      for (const auto& [flag, given] : ignored) {
        if (given) {
          throw CLI::ValidationError(flag, "has no effect with --dry-run (which accounts model state only, "
                                           "without data, training or files)");
        }
      }
      if (c.meta_init) {
        throw CLI::ValidationError("--meta-init", "has no effect with --dry-run (a dry run always builds the "
                                                  "model on the meta device and initialises nothing)");
      }
    }
    if (app.count("--export-hf-dtype") > 0 && c.export_hf.empty()) {
      throw CLI::ValidationError("--export-hf-dtype", "needs --export-hf DIR");
    }
    if (c.save.empty() && (c.save_every > 0 || c.keep > 0)) {
      throw CLI::ValidationError("--save-every/--keep", "need --save DIR");
    }
    if ((c.resume == "latest" || c.resume == "auto") && c.save.empty()) {
      throw CLI::ValidationError("--resume", "'" + c.resume + "' means the latest checkpoint in --save DIR: "
                                             "give --save, or a checkpoint path");
    }
    if (!c.import_optimizer_path.empty() && c.import_path.empty()) {
      throw CLI::ValidationError("--import-optimizer", "needs --import (the weights this optimizer "
                                                       "state belongs to)");
    }
    if (!c.init_from_hf.empty()) {
      const std::pair<const char*, bool> conflicting[] = {
          {"--import", !c.import_path.empty()}, {"--vocab-size", c.vocab_size_given},
          {"--model", c.model_given}, {"--n-layer", c.n_layer > 0}, {"--n-head", c.n_head > 0},
          {"--n-embd", c.n_embd > 0}, {"--block-size", c.block_size > 0}, {"--n-kv-head", c.n_kv_head > 0},
          {"--ffn-hidden", c.ffn_hidden > 0}};
      for (const auto& [flag, given] : conflicting) {
        if (given) {
          throw CLI::ValidationError("--init-from-hf", std::string("cannot be combined with ") + flag +
                                                           " (the directory's config.json and weights give the model)");
        }
      }
    }
    if (c.lora_rank == 0) {
      const std::pair<const char*, bool> lora_only[] = {
          {"--lora-alpha", app.count("--lora-alpha") > 0}, {"--lora-dropout", app.count("--lora-dropout") > 0},
          {"--lora-target-modules", app.count("--lora-target-modules") > 0},
          {"--export-adapter", !c.export_adapter.empty()}};
      for (const auto& [flag, given] : lora_only) {
        if (given) throw CLI::ValidationError(flag, "needs --lora-rank R (a LoRA fine-tune)");
      }
    } else if (!c.import_path.empty()) {
      throw CLI::ValidationError("--import", "cannot be combined with --lora-rank: the file holds no adapters; start "
                                             "a LoRA fine-tune from --init-from-hf DIR (or a preset)");
    }
    {  // Directories that would hold two models, or overwrite the one being read.
      namespace fs = std::filesystem;
      auto same = [](const std::string& a, const std::string& b) {
        if (a.empty() || b.empty()) return false;
        std::error_code ec;
        return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
      };
      if (same(c.export_adapter, c.init_from_hf) || same(c.export_hf, c.init_from_hf)) {
        const std::string flag = same(c.export_adapter, c.init_from_hf) ? "--export-adapter" : "--export-hf";
        throw CLI::ValidationError(flag, "is --init-from-hf's directory '" + c.init_from_hf + "': the export would "
                                         "change the model it starts from (transformers would then load the base with "
                                         "the adapter, or the merged weights); give another directory");
      }
      if (same(c.export_adapter, c.export_hf)) {
        throw CLI::ValidationError("--export-adapter", "is --export-hf's directory too: a directory of both a model "
                                                       "and an adapter loads ambiguously; give two directories");
      }
    }
    if (c.dry_run && !c.export_adapter.empty()) {
      throw CLI::ValidationError("--export-adapter", "has no effect with --dry-run (which accounts model state only, "
                                                     "without data, training or files)");
    }
    if (!c.resume.empty() && !c.import_path.empty()) {
      throw CLI::ValidationError("--import", "cannot be combined with --resume (the checkpoint "
                                             "already holds the weights)");
    }
  } catch (const CLI::ParseError& e) {
    std::ostringstream null_out, null_err;
    *exit_code = rank == 0 ? app.exit(e) : app.exit(e, null_out, null_err);
    if (*exit_code != 0) *exit_code = 2;  // CLI11's own codes (105, 106...) -> the documented 2
    return std::nullopt;
  }
  return c;
}

}  // namespace apps::train
