#include "fsdp/shard/layout.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "fsdp/common/check.h"

namespace fsdp::shard {

using fsdp::Error;
using fsdp::ErrorContext;
using fsdp::ErrorKind;
using fsdp::expected_actual;

ParamShardSpec ParamShardSpec::make(const std::vector<int64_t>& shape, int64_t world_size) {
  FSDP_CHECK(world_size >= 1, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "ParamShardSpec::make"}),
             expected_actual("world size", ">= 1", world_size));
  ParamShardSpec s;
  s.world_size = world_size;
  s.dim0 = shape.empty() ? 1 : shape[0];
  s.row_numel = 1;
  for (size_t i = 1; i < shape.size(); ++i) s.row_numel *= shape[i];
  if (s.dim0 < 0 || s.row_numel < 0) {
    throw Error(ErrorKind::kInvalidArgument, ErrorContext{-1, "", "ParamShardSpec::make"},
                "negative size in shape " + shape_to_string(shape));
  }
  s.rows_per_rank = (s.dim0 + world_size - 1) / world_size;
  return s;
}

int64_t ParamShardSpec::row_offset(int64_t rank) const {
  return std::min(rank * rows_per_rank, dim0);
}

int64_t ParamShardSpec::real_rows(int64_t rank) const {
  return std::clamp<int64_t>(dim0 - rank * rows_per_rank, 0, rows_per_rank);
}

FlatLayout FlatLayout::make(const std::vector<std::vector<int64_t>>& shapes, int64_t world_size) {
  FlatLayout l;
  l.world_size = world_size;
  int64_t off = 0;
  for (const auto& shape : shapes) {
    l.params.push_back(ParamShardSpec::make(shape, world_size));
    l.offsets.push_back(off);
    off += l.params.back().padded_shard_numel();
  }
  return l;
}

int64_t FlatLayout::shard_numel() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.padded_shard_numel();
  return n;
}

int64_t FlatLayout::real_numel() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace fsdp::shard
