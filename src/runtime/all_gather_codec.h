// AllGatherCodec: how a unit's master shards become the all-gather input, and how the all-gather
// output becomes the unsharded params (internal). Chosen once per unit from its strategy's traits
// row and mixed-precision policy. The default (cast_all_gather_codec) casts the flat master shard
// to param_dtype and all-gathers it over the shard group (or, for a strategy that gathers nothing,
// casts it locally), then copies each param's rows out of the output blocks. A quantised
// all-gather or an offloaded master shard is another codec. docs/architecture.md, "Seams" and
// "[Note: master and gather shards]".
#pragma once

#include <c10/core/ScalarType.h>

#include <memory>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/fsdp_param.h"
#include "fsdp/shard/layout.h"
#include "unit_collectives.h"

namespace fsdp::detail {

/// One unit's all-gather encoding. Called by the unit on the thread that runs forward and
/// backward; encode() is collective over the shard group when the codec communicates (every rank
/// of the group gathers the same units in the same order).
class AllGatherCodec {
 public:
  virtual ~AllGatherCodec() = default;
  /// Issues the gather of `master_flat` ((S) this rank's padded master shards of all params,
  /// original dtype; S = layout.shard_numel()) over `group`, tagged `tag`. Non-blocking; the result
  /// (its input, output and work) stays alive until decode().
  virtual AllGatherResult encode(const at::Tensor& master_flat, comm::ProcessGroup& group,
                                 const comm::OpTag& tag) = 0;
  /// Waits for `gather` (rethrowing its error), allocates every param's unsharded storage and
  /// writes its full rows in param_dtype. Blocking. `gather` is released afterwards.
  virtual void decode(AllGatherResult& gather, std::vector<FSDPParam>& params, const shard::FlatLayout& layout) = 0;
};

/// The cast codec: cast to `param_dtype` (no copy when it is the master's dtype), then an
/// all-gather over the shard group when `gathers` (foreach_all_gather), a local cast copy
/// otherwise (local_cast: no_shard with a param_dtype); decode is copy_out. With `hosts` active
/// the gather runs in two stages ([Note: host-aware collectives]; issue_all_gather).
std::unique_ptr<AllGatherCodec> cast_all_gather_codec(c10::ScalarType param_dtype, bool gathers,
                                                      HostGroups hosts = {});

/// The int8 codec (WireCodec::kInt8): encode quantises this rank's master shard, padding
/// included, with blocks restarting at every param (comm::int8_block_quantize over `segments`:
/// the layout's padded_shard_numel per param, in order) and all-gathers the payloads (uint8,
/// world x comm::int8_payload_bytes(segments)); decode dequantises every rank's block into a
/// (world, S) param_dtype buffer, one block at a time, then copies the params out of it as
/// copy_out does. At world 1 the payload is decoded locally (the same values as at any world size).
/// With `hosts` active the payloads are gathered in two stages (issue_all_gather).
std::unique_ptr<AllGatherCodec> int8_all_gather_codec(c10::ScalarType param_dtype, std::vector<int64_t> segments,
                                                      HostGroups hosts = {});

/// The segments of a unit's flat shard: each param's padded_shard_numel, in layout order.
std::vector<int64_t> shard_segments(const shard::FlatLayout& layout);

/// The codec of FullyShardOptions::all_gather_codec: cast_all_gather_codec for kNone,
/// int8_all_gather_codec over the layout's segments for kInt8 (which needs `gathers`: fsdp::Error
/// otherwise, already refused by validated_shard_size).
std::unique_ptr<AllGatherCodec> make_all_gather_codec(WireCodec codec, c10::ScalarType param_dtype, bool gathers,
                                                      const shard::FlatLayout& layout, HostGroups hosts = {});

}  // namespace fsdp::detail
