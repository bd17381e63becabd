#include "unit_collectives.h"

#include <ATen/ATen.h>

#include "fsdp/comm/block_quant.h"

namespace fsdp::detail {

AllGatherResult issue_all_gather(at::Tensor input, comm::ProcessGroup& group, const HostGroups& hosts,
                                 const comm::CommContext& ctx, const comm::OpTag& tag) {
  AllGatherResult r;
  r.input = std::move(input);
  // One rank: the all-gather is the identity, so the output is the input (no buffer, no copy).
  if (group.size() == 1) {
    r.output = r.input;
    r.work = group.all_gather_into_tensor(r.output, r.input, tag);
    return r;
  }
  const auto options = ctx.buffer_options(r.input.scalar_type());
  r.output = at::empty({group.size() * r.input.numel()}, options);
  if (!hosts.active()) {
    r.work = group.all_gather_into_tensor(r.output, r.input, tag);
    return r;
  }
  // Across hosts first (each rank receives its place's block of every host: one copy of each
  // byte per host pair), then inside the host, whose output is (h, H, n) in [place][host] order.
  r.hosts = hosts.hosts();
  r.staged = at::empty({r.hosts * r.input.numel()}, options);
  r.first = hosts.cross->all_gather_into_tensor(r.staged, r.input, tag);
  r.work = hosts.host->all_gather_into_tensor(r.output, r.staged, tag, r.first);
  return r;
}

void wait_gathered(const AllGatherResult& gather) {
  for (const auto& w : {gather.first, gather.work}) {
    if (!w) continue;
    w->wait();
    w->block_current_stream();
  }
}

AllGatherResult foreach_all_gather(const at::Tensor& sharded_flat, comm::ProcessGroup& group,
                                   const comm::CommContext& ctx, c10::ScalarType param_dtype,
                                   const comm::OpTag& tag, const HostGroups& hosts) {
  at::NoGradGuard no_grad;
  at::Tensor input = sharded_flat.scalar_type() == param_dtype ? sharded_flat : sharded_flat.to(param_dtype);
  return issue_all_gather(std::move(input), group, hosts, ctx, tag);
}

AllGatherResult local_cast(const at::Tensor& sharded_flat, c10::ScalarType param_dtype) {
  at::NoGradGuard no_grad;
  AllGatherResult r;
  r.input = sharded_flat.to(param_dtype);
  r.output = r.input;
  return r;
}

void copy_out(AllGatherResult& gather, std::vector<FSDPParam>& params, const shard::FlatLayout& layout) {
  wait_gathered(gather);
  const int64_t S = layout.shard_numel();
  at::Tensor blocks = gather.output.view({layout.world_size / gather.hosts, gather.hosts, S});
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_in_unsharded(blocks, layout.offsets[i]);
  gather = AllGatherResult{};
}

namespace {

// The int8 stage of a reduce-scatter over `group` (n ranks): `blocks` ((n, S) reduce_dtype, block q
// for rank q) go block-quantised in one all-to-all of bytes, started after `after` with the
// quantisation on the communication thread (blocks may be what `after` writes); r.decode then
// averages the n received blocks in float32, in rank order, into r.output.
void int8_reduce_stage(ReduceScatterResult& r, comm::ProcessGroup& group, at::Tensor blocks,
                       const std::vector<int64_t>& segments, const comm::OpTag& tag, comm::WorkPtr after) {
  const int64_t n = group.size(), B = comm::int8_payload_bytes(segments);
  const auto bytes = blocks.options().dtype(at::kByte);
  r.payload_in = at::empty({n, B}, bytes);
  r.payload_out = at::empty({n, B}, bytes);
  at::Tensor in = r.payload_in, out = r.payload_out, output = r.output;
  auto encode = [in, blocks, segments] {
    at::NoGradGuard no_grad;
    for (int64_t q = 0; q < blocks.size(0); ++q) in.select(0, q).copy_(comm::int8_block_quantize(blocks.select(0, q), segments));
  };
  r.decode = [out, output, segments, n] {
    at::NoGradGuard no_grad;
    if (output.is_meta()) return;  // a dry run: sizes only
    // One block at a time (two float32 rows of S'), added in rank order.
    at::Tensor sum = at::empty({1, output.numel()}, output.options().dtype(at::kFloat));
    at::Tensor row = at::empty_like(sum);
    comm::int8_block_dequantize(out.narrow(0, 0, 1), segments, sum);
    for (int64_t q = 1; q < n; ++q) {
      comm::int8_block_dequantize(out.narrow(0, q, 1), segments, row);
      sum.add_(row);
    }
    output.copy_(sum.view(-1).div_(static_cast<double>(n)));
  };
  if (after) {
    r.work = group.all_to_all(out.view(-1), in.view(-1), tag, std::move(after), encode);
  } else {
    encode();  // the blocks are ready: quantise on the caller's thread
    r.work = group.all_to_all(out.view(-1), in.view(-1), tag);
  }
}

}  // namespace

ReduceScatterResult foreach_reduce_scatter(std::vector<FSDPParam>& params, const std::vector<int>& index,
                                           const shard::FlatLayout& layout, comm::ProcessGroup& group,
                                           comm::ProcessGroup* replicate, const comm::CommContext& ctx,
                                           c10::ScalarType reduce_dtype, const comm::OpTag& tag,
                                           const ReduceScatterWire& wire) {
  at::NoGradGuard no_grad;
  const int64_t world = layout.world_size, S = layout.shard_numel();
  const bool staged = wire.hosts.active() && world > 1;
  const int64_t H = staged ? wire.hosts.hosts() : 1;
  ReduceScatterResult r;
  const auto options = ctx.buffer_options(reduce_dtype);  // meta on a simulated group
  r.input = at::empty({world * S}, options);
  at::Tensor blocks = r.input.view({world / H, H, S});
  for (size_t j = 0; j < index.size(); ++j) {
    params[index[j]].take_unsharded_grad(blocks, layout.offsets[j], tag.unit);
  }
  r.output = world == 1 ? r.input : at::empty({S}, options);
  const bool int8 = wire.codec == WireCodec::kInt8 && world > 1;
  if (!staged) {
    if (int8) {
      int8_reduce_stage(r, group, r.input.view({world, S}), wire.segments, tag, nullptr);
      r.input = at::Tensor();  // quantised already: the all-to-all reads the payloads only
    } else {
      r.work = group.reduce_scatter_tensor(r.output, r.input, comm::ReduceOp::kAvg, tag);
    }
  } else {
    // Inside the host first: place l receives its host's average of blocks [l][k] for every host
    // k; then across hosts, where host k's rank keeps block k.
    r.staged = at::empty({H * S}, options);
    r.first = wire.hosts.host->reduce_scatter_tensor(r.staged, r.input, comm::ReduceOp::kAvg, tag);
    if (int8) {
      int8_reduce_stage(r, *wire.hosts.cross, r.staged.view({H, S}), wire.segments, tag, r.first);
    } else {
      r.work = wire.hosts.cross->reduce_scatter_tensor(r.output, r.staged, comm::ReduceOp::kAvg, tag, r.first);
    }
  }
  if (replicate) {
    r.replica_work = replicate->all_reduce(r.output, comm::ReduceOp::kAvg, tag, r.work, r.decode);
    r.decode = nullptr;  // the replicas' all-reduce decodes before it starts
  }
  return r;
}

void wait_reduced(const ReduceScatterResult& rs) {
  for (const auto& w : {rs.first, rs.work, rs.replica_work}) {
    if (!w) continue;
    w->wait();
    w->block_current_stream();
  }
}

void accumulate_reduced(ReduceScatterResult& rs, std::vector<FSDPParam>& params,
                        const std::vector<int>& index, const shard::FlatLayout& layout,
                        int64_t shard_rank) {
  wait_reduced(rs);
  if (rs.decode) rs.decode();
  for (size_t j = 0; j < index.size(); ++j) {
    const auto& s = layout.params[j];
    params[index[j]].accumulate_sharded_grad(
        rs.output.narrow(0, layout.offsets[j], s.real_numel(shard_rank)));
  }
  rs = ReduceScatterResult{};
}

}  // namespace fsdp::detail
