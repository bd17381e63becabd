#include "fsdp/planner/setup.h"

#include "fsdp/comm/block_quant.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/shard/layout.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/strategy_traits.h"

namespace fsdp::planner {
namespace {
const ErrorContext kSetupWhere{-1, "", "planner"};
}  // namespace

std::string to_string(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  throw Error(ErrorKind::kInvalidArgument, kSetupWhere, expected_actual("mixed precision", "fp32, bf16 or fp16", name));
}

int64_t param_bytes_per_elem(Precision p) { return p == Precision::kFp32 ? 4 : 2; }
int64_t reduce_bytes_per_elem(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

std::string to_string(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kSgdMomentum: return "sgd-momentum";
    case OptimizerKind::kSgd: return "sgd";
  }
  return "?";
}

OptimizerKind parse_optimizer(const std::string& name) {
  if (name == "adamw" || name == "adam") return OptimizerKind::kAdamW;
  if (name == "sgd-momentum") return OptimizerKind::kSgdMomentum;
  if (name == "sgd") return OptimizerKind::kSgd;
  throw Error(ErrorKind::kInvalidArgument, kSetupWhere,
              expected_actual("optimizer", "adamw, adam, sgd-momentum or sgd", name));
}

std::string to_string(ReduceScatterRoute r) {
  return r == ReduceScatterRoute::kInPlace ? "in_place" : "all_to_all";
}

ReduceScatterRoute parse_reduce_scatter_route(const std::string& name) {
  if (name == "all_to_all") return ReduceScatterRoute::kAllToAll;
  if (name == "in_place") return ReduceScatterRoute::kInPlace;
  throw Error(ErrorKind::kInvalidArgument, kSetupWhere,
              expected_actual("reduce-scatter route", "all_to_all or in_place", name));
}

int64_t optimizer_bytes_per_elem(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::kAdamW: return 8;
    case OptimizerKind::kSgdMomentum: return 4;
    case OptimizerKind::kSgd: return 0;
  }
  return 0;
}

int64_t Parallelism::shard_group_size() const {
  return fsdp::shard_group_size_of(strategy, hybrid_shard_group_size, world_size, kSetupWhere);
}

int64_t Parallelism::num_replicas() const { return world_size / shard_group_size(); }

int64_t Parallelism::node_group_size() const {
  const int64_t g = reshard_after_forward_group_size;
  return g > 0 && g < shard_group_size() ? g : 0;
}

int64_t Parallelism::host_stage_size() const {
  const int64_t h = collective_host_size;
  return h > 1 && h < shard_group_size() ? h : 0;
}

void Parallelism::validate() const {
  FSDP_CHECK(world_size >= 1, ErrorKind::kInvalidArgument, kSetupWhere, expected_actual("world size", ">= 1", world_size));
  FSDP_CHECK(ranks_per_node >= 0, ErrorKind::kInvalidArgument, kSetupWhere,
             expected_actual("ranks per node", ">= 0", ranks_per_node));
  const int64_t G = shard_group_size();  // throws for a hybrid_shard_group_size the strategy does not take
  if (const int64_t g = reshard_after_forward_group_size; g != 0) {
    FSDP_CHECK(fsdp::traits_of(strategy).reshard_after_forward, ErrorKind::kInvalidArgument, kSetupWhere,
               "reshard_after_forward_group_size ", g, " applies to full_shard and hybrid_shard, not ",
               fsdp::to_string(strategy), " (it keeps each unit's params from forward to backward)");
    FSDP_CHECK(g > 0 && G % g == 0, ErrorKind::kInvalidArgument, kSetupWhere, "reshard_after_forward_group_size ", g,
               " must divide the shard group size ", G);
  }
  if (const int64_t h = collective_host_size; h != 0) {
    FSDP_CHECK(fsdp::traits_of(strategy).grad_sync == fsdp::GradSync::kReduceScatter, ErrorKind::kInvalidArgument,
               kSetupWhere, "collective_host_size ", h, " applies to strategies that reduce-scatter, not ",
               fsdp::to_string(strategy));
    FSDP_CHECK(h > 0 && G % h == 0, ErrorKind::kInvalidArgument, kSetupWhere, "collective_host_size ", h,
               " must divide the shard group size ", G);
  }
}

std::string Parallelism::label() const {
  const int64_t g = node_group_size(), h = host_stage_size();
  std::vector<std::string> parts;
  if (fsdp::traits_of(strategy).uses_hybrid_shard_group_size) parts.push_back(str_cat("G=", shard_group_size()));
  if (g > 0) parts.push_back(str_cat("node=", g));
  if (h > 0) parts.push_back(str_cat("host=", h));
  std::string label = fsdp::to_string(strategy);
  for (size_t i = 0; i < parts.size(); ++i) label += (i == 0 ? "(" : ",") + parts[i];
  return parts.empty() ? label : label + ")";
}

int64_t all_gather_bytes(const StepSetup& setup, const UnitSpec& unit, int64_t shard_group_size) {
  std::vector<int64_t> segments;
  int64_t shard_numel = 0;
  for (const auto& p : unit.params) {
    segments.push_back(fsdp::shard::ParamShardSpec::make(p.shape, shard_group_size).padded_shard_numel());
    shard_numel += segments.back();
  }
  if (setup.all_gather_codec == fsdp::WireCodec::kInt8) return shard_group_size * comm::int8_payload_bytes(segments);
  return shard_group_size * shard_numel * param_bytes_per_elem(setup.precision);
}

int64_t int8_reduce_bytes(const UnitSpec& unit, int64_t shard_group_size, int64_t ranks) {
  std::vector<int64_t> segments;
  for (const auto& p : unit.params) {
    if (p.trainable) segments.push_back(fsdp::shard::ParamShardSpec::make(p.shape, shard_group_size).padded_shard_numel());
  }
  return segments.empty() ? 0 : ranks * comm::int8_payload_bytes(segments);
}

void StepSetup::validate() const {
  FSDP_CHECK(micro_batch_size >= 1 && seq_len >= 1 && accumulation_steps >= 1 && max_unsharded_units >= 1 &&
                 bucket_cap_bytes >= 1,
             ErrorKind::kInvalidArgument, kSetupWhere,
             "micro-batch size, sequence length, accumulation steps, max_unsharded_units and the bucket "
             "cap must be >= 1, got ",
             micro_batch_size, ", ", seq_len, ", ", accumulation_steps, ", ", max_unsharded_units, ", ",
             bucket_cap_bytes);
  FSDP_CHECK(checkpoint_every >= 1 && (activation_checkpointing || checkpoint_every == 1), ErrorKind::kInvalidArgument,
             kSetupWhere, "checkpoint_every must be >= 1 and other than 1 only with activation checkpointing, got ",
             checkpoint_every, activation_checkpointing ? " (checkpointing on)" : " (checkpointing off)");
}

}  // namespace fsdp::planner
