// Block-wise int8 quantisation of a flat tensor for the wire (ZeRO++, Wang et al. 2023, section
// 3.1, "qwZ": one scale per block instead of one per tensor keeps the error of a block bounded by
// its own largest value). Pure tensor math, no process group: the all-gather codec packs each
// rank's shard with it, and the planner counts its bytes with the same formula.
//
// A flat tensor is a sequence of segments (a unit's shard: one per param, in order), and blocks
// restart at every segment, so that a block never mixes two params (a LayerNorm gain of 1.0 beside
// weights of 0.02 would otherwise set the weights' step).
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace fsdp::comm {

/// Elements per quantisation block (one fp32 scale each).
constexpr int64_t kInt8BlockNumel = 256;

/// Blocks of one segment of `numel` elements: ceil(numel / kInt8BlockNumel) (the last one may be
/// short).
constexpr int64_t int8_block_count(int64_t numel) { return (numel + kInt8BlockNumel - 1) / kInt8BlockNumel; }
/// Blocks of a flat tensor made of `segments` (element counts, in order; zeros allowed): the sum
/// of each segment's blocks.
int64_t int8_block_count(const std::vector<int64_t>& segments);

/// Bytes of the payload of `segments`: 4 x blocks (one fp32 scale per block) + the elements as
/// int8, rounded up to a multiple of 4 (so that payloads laid end to end keep their scales
/// aligned). Layout: [scales: blocks x float32, segment by segment][values: numel x int8][0-3
/// padding bytes].
int64_t int8_payload_bytes(const std::vector<int64_t>& segments);
/// The payload of one segment of `numel` elements.
constexpr int64_t int8_payload_bytes(int64_t numel) { return 4 * int8_block_count(numel) + (numel + 3) / 4 * 4; }

/// Quantises `flat` ((numel), any floating dtype, any device; computed in float32), made of
/// `segments` (summing to numel), into a new payload ((int8_payload_bytes(segments)), uint8, same
/// device). Block b of a segment holds its elements [256 b, 256 b + 256); its scale is
/// s_b = max|x| / 127 over the block and each value is q = round(x / s_b) in [-127, 127] (q = 0 in
/// an all-zero block). A block holding a NaN or an infinity gets a non-finite scale, so it decodes
/// to non-finite values (the step's non-finite check sees them). Throws c10::Error for a tensor
/// that is not 1-D floating point, or segments that do not sum to its numel or are negative. On the
/// meta device (a dry run) only the payload's size is made.
at::Tensor int8_block_quantize(const at::Tensor& flat, const std::vector<int64_t>& segments);
/// One segment: int8_block_quantize(flat, {flat.numel()}).
at::Tensor int8_block_quantize(const at::Tensor& flat);

/// Decodes `payloads` ((R, int8_payload_bytes(segments)) uint8: R payloads of the same segments,
/// row after row, as an all-gather lays them out) into `out` ((R, numel), any floating dtype, same
/// device): x' = q x s_b, computed in float32 and rounded once to out's dtype. The error against
/// the quantised input is |x - x'| <= s_b / 2 = max|x| / 254 per block in float32 (plus, in a
/// 16-bit dtype, the rounding of x' to that dtype). Throws c10::Error on a shape or dtype mismatch.
void int8_block_dequantize(const at::Tensor& payloads, const std::vector<int64_t>& segments, at::Tensor& out);
/// One segment of `numel` elements.
void int8_block_dequantize(const at::Tensor& payloads, int64_t numel, at::Tensor& out);

}  // namespace fsdp::comm
