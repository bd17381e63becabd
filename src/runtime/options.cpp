#include "fsdp/runtime/options.h"

#include "fsdp/common/check.h"

namespace fsdp {

std::string to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard: return "full_shard";
    case ShardingStrategy::kShardGradOp: return "shard_grad_op";
    case ShardingStrategy::kNoShard: return "no_shard";
    case ShardingStrategy::kHybridShard: return "hybrid_shard";
    case ShardingStrategy::kZero1: return "zero1";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  for (auto s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                 ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard,
                 ShardingStrategy::kZero1}) {
    if (to_string(s) == name) return s;
  }
  throw Error(ErrorKind::kInvalidArgument, ErrorContext{-1, "", "parse_sharding_strategy"},
              expected_actual("sharding strategy",
                              "one of full_shard, shard_grad_op, no_shard, hybrid_shard, zero1",
                              "'" + name + "'"));
}

std::string to_string(WireCodec c) {
  switch (c) {
    case WireCodec::kNone: return "none";
    case WireCodec::kInt8: return "int8";
  }
  return "?";
}

WireCodec parse_wire_codec(const std::string& name) {
  for (auto c : {WireCodec::kNone, WireCodec::kInt8}) {
    if (to_string(c) == name) return c;
  }
  throw Error(ErrorKind::kInvalidArgument, ErrorContext{-1, "", "parse_wire_codec"},
              expected_actual("wire codec", "one of none, int8", "'" + name + "'"));
}

}  // namespace fsdp
