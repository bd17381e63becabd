// fsdp-plan's flags (CLI11) and their translation into the planner's inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "fsdp/planner/plan.h"

namespace apps::plan {

/// A flag value or combination the planner cannot honour; main() prints it on one line, exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Every fsdp-plan flag; defaults are the flag defaults. Names shared with fsdp-train mean the same.
struct PlanFlags {
  // Model
  std::string model = "nano";  ///< GPT preset (as fsdp-train) or llama2-7b / -13b / -70b
  std::string params;          ///< a parameter count ("7e9", "7B"): a shape-free model instead
  int64_t units = 32;          ///< block units of a --params model
  int64_t n_layer = 0, n_head = 0, n_kv_head = 0, n_embd = 0, ffn_hidden = 0, block_size = 0;
  int64_t vocab_size = 0;      ///< 0: 8192 for GPT presets (fsdp-train's tokenizer), 32000 for Llama-2
  std::string attention = "auto";
  int64_t lora_rank = 0;            ///< > 0: a LoRA fine-tune (fsdp::planner::with_lora), as fsdp-train's flag
  std::string lora_target_modules;  ///< comma-separated; "" the family's default
  std::optional<double> lora_alpha, lora_dropout;  ///< fsdp-train's; accepted, they change no plan
  // Parallelism
  int64_t world_size = 1;
  int64_t ranks_per_node = 0;  ///< 0: the profile's
  std::string strategy = "all";
  std::optional<int64_t> hybrid_shard_group_size;  ///< 0 = all ranks (fsdp-train's meaning); unset: ranks per node
  std::string mixed_precision = "fp32";
  std::string optimizer = "adamw";
  bool forward_prefetch = true;
  int max_unsharded_units = 2;
  std::optional<double> bucket_cap_mb;
  std::string all_gather_codec = "none";  ///< none | int8 (fsdp-train's --all-gather-codec)
  std::optional<std::string> reshard_after_forward;  ///< N | host (fsdp-train's --reshard-after-forward)
  std::string reduce_scatter_codec = "none";  ///< none | int8 (fsdp-train's --reduce-scatter-codec)
  std::optional<std::string> host_aware_collectives;  ///< N | host (fsdp-train's --host-aware-collectives)
  // Step
  int64_t global_batch_size = 0;  ///< 0: micro-batch x world size (no accumulation)
  int64_t micro_batch_size = 0;   ///< 0: global / world size, or 1
  int64_t seq_len = 0;            ///< 0: 128 for GPT presets (fsdp-train's default), the context for Llama-2
  bool activation_checkpointing = false;
  int64_t checkpoint_every = 1;  ///< with --activation-checkpointing: every k-th block only
  // Machine
  std::string profile = "h100";
  bool profile_given = false;  ///< --profile was on the command line (the report notes the default)
  std::string memory_per_rank;  ///< "80GB"; "" = the profile's
  double headroom = fsdp::planner::kDefaultHeadroom;
  std::optional<double> compute_efficiency;
  std::optional<int64_t> nics_per_node;  ///< unset: the profile's
  std::string inter_node_bandwidth;      ///< "200Mbit", "10Gbit/s", "3GB/s"; "": the profile's
  std::string reduce_scatter_route;      ///< "all_to_all", "in_place"; "": from the profile
  int64_t rank = 0;
  // Output
  bool json = false;
  // Calibration
  bool calibrate = false;
  std::string out;          ///< --calibrate: the profile file to write
  std::string backend = "auto";  ///< --calibrate: the group's backend, auto (gloo under torchrun) | mpi | gloo
  int threads = 1;          ///< --calibrate: intra-op threads per rank
  std::string name;         ///< --calibrate: the profile's name ("" = "calibrated")
};

/// Parses argv. Returns the flags, or std::nullopt with *exit_code set when the program should exit
/// now: --help (0, help printed), a bad flag or value (2, one line "fsdp-plan: error: ..." on
/// stderr). Only `rank` 0 prints (every rank of an mpirun job parses the same argv).
std::optional<PlanFlags> parse_plan_flags(int argc, char** argv, int rank, int* exit_code);

/// The rank the launcher gave this process, from its environment (OMPI_COMM_WORLD_RANK,
/// PMIX_RANK, PMI_RANK or torchrun's RANK; 0 when not launched by one). Needs no MPI_Init.
int launcher_rank();

/// The planner's inputs for `flags`: the model (preset + overrides), batch geometry (as fsdp-train
/// resolves it), precision, profile, memory. Throws UsageError for combinations that do not fit
/// (sizes that do not divide, a sequence longer than the context, overrides that do not apply to
/// the model family), and fsdp::Error when the planner rejects a value or a profile file.
fsdp::planner::PlanInputs resolve_inputs(const PlanFlags& flags);

/// The model of `flags` alone (preset + overrides), used by --calibrate for its matmul shapes.
fsdp::planner::ModelSpec resolve_model(const PlanFlags& flags);

}  // namespace apps::plan
