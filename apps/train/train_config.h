// TrainConfig: every setting of fsdp-train, from command-line flags and an optional TOML file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace apps::train {

/// Resolved settings of one fsdp-train run. Defaults here are the flag defaults.
struct TrainConfig {
  // Model
  std::string model = "nano";  ///< preset name (models/causal_lm.h: GPT or Llama)
  int64_t n_layer = 0;         ///< overrides of the preset; 0 keeps the preset's value
  int64_t n_head = 0;
  int64_t n_embd = 0;          ///< width (Llama: d_model)
  int64_t block_size = 0;      ///< context (Llama: max_seq)
  int64_t n_kv_head = 0;       ///< Llama only: key/value heads (grouped-query attention)
  int64_t ffn_hidden = 0;      ///< Llama only: SwiGLU hidden width
  std::string attention = "auto";  ///< models::GPTConfig::attention
  /// Build the model on the meta device, shard it, then write only this rank's rows
  /// (fsdp::materialize): no rank ever holds the full model. Same initial values as without.
  bool meta_init = false;
  // Dry run (apps/train/dry_run.h): no data, no MPI job, no training.
  bool dry_run = false;
  int dry_run_world_size = 0;  ///< --world-size: ranks of the simulated job (needs --dry-run)
  int dry_run_rank = 0;        ///< --dry-run-rank: the rank whose bytes are reported
  // Data
  std::string data_dir = "./data";  ///< holds spm_<vocab>.model and corpus/
  std::string data;                 ///< text file or folder with train.txt + val.txt; "" = data_dir/corpus
  int64_t vocab_size = 8192;        ///< selects data_dir/spm_<vocab_size>.model
  /// A SentencePiece model file (e.g. Llama-2's tokenizer.model) instead of data_dir's
  /// spm_<vocab_size>.model ("" = data_dir's).
  std::string tokenizer;
  /// Element type of pre-tokenized --data .bin files: "uint16" (nanoGPT's) or "uint32".
  std::string data_dtype = "uint16";
  /// --vocab-size was given (on the command line or in --config): a dry run of a gpt2 or llama2
  /// preset then builds it at this vocabulary instead of the public model's (50257, 32000).
  bool vocab_size_given = false;
  // Parallelism
  std::string strategy = "full_shard";
  std::string mixed_precision = "fp32";  ///< fp32 | bf16 | fp16
  /// intra-op threads per rank; 0 (--threads auto) = the CPUs this process may run on (its
  /// affinity mask, as the launcher bound it)
  int threads = 1;
  bool forward_prefetch = true;          ///< FullyShardOptions::forward_prefetch of every unit
  /// hybrid_shard only: ranks per shard group, a number (0 = all ranks; unset: 0) or "host" (one
  /// shard group per host, resolved from the process group's host layout). Set with another
  /// strategy: a usage error.
  std::optional<std::string> hybrid_shard_group_size;
  /// no_shard only: all-reduce bucket size in MiB (unset: 25). Set with another strategy: a usage
  /// error.
  std::optional<double> bucket_cap_mb;
  /// FullyShardOptions::all_gather_codec of every unit: none | int8 (int8 with no_shard: a usage
  /// error).
  std::string all_gather_codec = "none";
  /// FullyShardOptions::reshard_after_forward_group_size of every unit: a number of ranks, or
  /// "host" (the ranks of each host, resolved from the process group's host layout); unset or
  /// "0": off.
  /// Only with strategies that reshard after forward (full_shard, hybrid_shard): a usage error else.
  std::optional<std::string> reshard_after_forward;
  /// FullyShardOptions::reduce_scatter_codec of every unit: none | int8 (int8 with no_shard: a
  /// usage error).
  std::string reduce_scatter_codec = "none";
  /// FullyShardOptions::collective_host_size of every unit: a number of ranks, or "host"; unset
  /// or "0": off. Only with strategies that reduce-scatter (not no_shard): a usage error else.
  std::optional<std::string> host_aware_collectives;
  /// Recompute each block's activations in backward instead of keeping them
  /// (fsdp::call_checkpointed per block).
  bool activation_checkpointing = false;
  /// Per-rank memory budget as given ("600MB", "1.5GiB"; "" = none) and in bytes (0 = none): the
  /// counting allocator refuses allocations past it with fsdp::OutOfMemory.
  std::string memory_budget;
  int64_t memory_budget_bytes = 0;
  // Optimisation
  int64_t global_batch_size = 32;  ///< sequences per optimizer step, all ranks together
  int64_t micro_batch_size = 0;    ///< sequences per forward per rank; 0 = G/N (no accumulation)
  int64_t seq_len = 128;           ///< tokens per sequence
  int64_t steps = 200;
  double lr = 3e-3;
  double min_lr = 3e-4;  ///< unset on the command line and in --config: lr / 10
  int64_t warmup_steps = 20;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  std::string adamw_kernel = "fused";  ///< "fused" (fsdp::optim::FusedAdamW) or "libtorch"
  double grad_clip = 1.0;  ///< max global grad norm; 0 disables clipping (the norm is still reported)
  uint64_t seed = 1337;
  /// A NaN or inf loss or gradient norm on any rank: "stop" (exit 1 naming the step and ranks,
  /// before the optimizer step) or "skip" (drop that step's update and go on).
  std::string on_nonfinite = "stop";
  /// A write of the run's output that fails (--metrics, --trace on a full disk): "warn" (said once
  /// naming the file and errno; training goes on) or "stop" (every rank exits 1 after the step
  /// whose output failed). Checkpoints (--save, --export) always stop the run.
  std::string on_output_error = "warn";
  // Evaluation and output
  int64_t eval_every = 50;   ///< steps between validation passes; 0 = only at the end
  int64_t eval_batches = 4;  ///< global batches per validation pass
  int64_t sample_tokens = 0;
  double sample_temperature = 0.8;
  int64_t sample_top_k = 40;
  std::string sample_prompt = "And it came to pass";
  std::string progress = "auto";  ///< auto (bar when stdout is a terminal) | bar | lines
  std::string metrics;  ///< JSON-lines path (rank 0)
  std::string trace;    ///< Chrome trace path
  std::string profile;        ///< libtorch operator profile (Chrome trace) path; "" = off
  /// The world group's backend: auto (gloo under torchrun, else mpi) | mpi | gloo.
  std::string backend = "auto";
  /// Seconds a collective may take before the job is stopped with a diagnosis (unset:
  /// FSDP_COLLECTIVE_TIMEOUT_S, else 600).
  std::optional<double> collective_timeout_s;
  /// Where each rank writes its flight recorder on a timeout or a collective error ("" :
  /// FSDP_FLIGHT_RECORDER_DIR, else flight-recorder/ beside --metrics, else ./flight-recorder).
  std::string flight_recorder_dir;
  int64_t profile_steps = 2;  ///< the last K steps are profiled
  std::string config_file;
  // Checkpoints
  std::string save;         ///< sharded checkpoint directory ("" = no checkpoints)
  int64_t save_every = 0;   ///< steps between saves (0: only after the last step); needs --save
  int64_t keep = 0;         ///< keep the newest K checkpoints in --save (0: all)
  std::string resume;       ///< checkpoint (or directory of checkpoints) to resume; "latest" = --save
  /// --resume as given, before "auto" is resolved (to a checkpoint or to "" for a fresh start):
  /// non-empty means the run may continue an earlier attempt, so --metrics is appended to.
  std::string resume_asked;
  std::string export_path;  ///< full state dict (torch.load-able) written after training
  std::string import_path;  ///< full weights loaded before training (fine-tuning)
  /// A Hugging Face GPT2LMHeadModel or LlamaForCausalLM directory (config.json + safetensors): the model's shape and
  /// weights, imported straight into the shards (fine-tuning a published model).
  std::string init_from_hf;
  /// After training, write the model as a Hugging Face directory (GPT2LMHeadModel or
  /// LlamaForCausalLM).
  std::string export_hf;
  /// Dtype of the --export-hf tensors, from the fp32 master weights: "fp32" or "bf16".
  std::string export_hf_dtype = "fp32";
  // LoRA (models/lora.h): adapters over a frozen base; only they train.
  int64_t lora_rank = 0;             ///< --lora-rank r; 0: no adapters (a full fine-tune)
  double lora_alpha = 8.0;           ///< --lora-alpha: the update is scaled by alpha / r
  double lora_dropout = 0.0;         ///< --lora-dropout on the adapters' input, in training
  std::string lora_target_modules;   ///< --lora-target-modules: comma-separated names, "" the family's default
  /// After training, write the adapters alone as PEFT's adapter_model.safetensors and
  /// adapter_config.json in this directory.
  std::string export_adapter;
  bool model_given = false;  ///< --model was on the command line (or in --config)
  /// with import_path: the optimizer state of the plain libtorch run that wrote those weights
  std::string import_optimizer_path;
};

/// Parses argv (and the TOML file named by --config, whose keys are the long flag names with '-' or
/// '_'; flags given on the command line override the file). Returns the config, or std::nullopt
/// with *exit_code set when the program should exit now (--help: 0; a bad flag, value or file: 2).
/// Only rank 0 prints help and errors. Checks values that need no other context (positive sizes,
/// known choices); the rest (divisibility by the world size, strategy support) is checked later.
std::optional<TrainConfig> parse_train_config(int argc, char** argv, int rank, int* exit_code);

}  // namespace apps::train
