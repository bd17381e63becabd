// Pure shard layout math (layer 2): no process group, no tensors. See docs/architecture.md,
// "[Note: dim-0 sharding]".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::shard {

/// Dim-0 sharding of one parameter over world_size ranks (PyTorch FSDP2's per-parameter scheme).
///
/// A parameter of shape (d0, d1, ...) is seen as d0 rows of row_numel = d1*d2*... elements (a 0-dim
/// parameter is 1 row of 1 element). Every rank stores rows_per_rank = ceil(d0 / world_size) rows;
/// rank r owns the global rows [r*rows_per_rank, r*rows_per_rank + real_rows(r)), and the remaining
/// rows of its shard are padding that stays exactly zero. When world_size > d0, the last ranks own
/// 0 rows (empty shards) but still take part in every collective.
struct ParamShardSpec {
  int64_t dim0 = 0;           ///< rows of the unsharded parameter
  int64_t row_numel = 1;      ///< elements per row
  int64_t world_size = 1;
  int64_t rows_per_rank = 0;  ///< ceil(dim0 / world_size)

  /// Throws fsdp::Error (kInvalidArgument) for world_size < 1 or negative sizes.
  static ParamShardSpec make(const std::vector<int64_t>& shape, int64_t world_size);

  int64_t numel() const { return dim0 * row_numel; }
  /// First global row held by rank (clamped to dim0 for empty shards).
  int64_t row_offset(int64_t rank) const;
  /// Rows of real data rank holds: in [0, rows_per_rank].
  int64_t real_rows(int64_t rank) const;
  int64_t real_numel(int64_t rank) const { return real_rows(rank) * row_numel; }
  /// Elements of every rank's shard including padding: rows_per_rank * row_numel.
  int64_t padded_shard_numel() const { return rows_per_rank * row_numel; }
  /// Elements of the padded unsharded parameter: world_size * padded_shard_numel().
  int64_t padded_numel() const { return world_size * padded_shard_numel(); }
};

/// Layout of one FSDP unit's flat communication buffer: the unit's parameters' padded shards
/// concatenated in parameter order. Every rank contributes shard_numel() elements; the all-gather
/// output (and reduce-scatter input) holds world_size blocks of shard_numel() elements, block r being
/// rank r's shards. Parameter i's slice inside a block is [offsets[i], offsets[i] + padded_shard_numel).
struct FlatLayout {
  std::vector<ParamShardSpec> params;
  std::vector<int64_t> offsets;  ///< per parameter, in elements within one rank's block
  int64_t world_size = 1;

  static FlatLayout make(const std::vector<std::vector<int64_t>>& shapes, int64_t world_size);
  /// Elements one rank contributes: sum of padded_shard_numel over parameters.
  int64_t shard_numel() const;
  /// Elements of the all-gather output / reduce-scatter input: world_size * shard_numel().
  int64_t total_numel() const { return world_size * shard_numel(); }
  /// Sum of the real (unpadded) elements over parameters.
  int64_t real_numel() const;
};

/// "[3, 4]" for error messages.
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace fsdp::shard
