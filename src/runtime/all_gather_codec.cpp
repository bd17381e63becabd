#include "all_gather_codec.h"

#include <ATen/ATen.h>

#include "fsdp/comm/block_quant.h"
#include "fsdp/common/check.h"

namespace fsdp::detail {
namespace {

class CastAllGatherCodec final : public AllGatherCodec {
 public:
  CastAllGatherCodec(c10::ScalarType param_dtype, bool gathers, HostGroups hosts)
      : param_dtype_(param_dtype), gathers_(gathers), hosts_(std::move(hosts)) {}

  AllGatherResult encode(const at::Tensor& master_flat, comm::ProcessGroup& group, const comm::OpTag& tag) override {
    if (!gathers_) return local_cast(master_flat, param_dtype_);
    return foreach_all_gather(master_flat, group, comm::CommContext::for_group(group), param_dtype_, tag, hosts_);
  }

  void decode(AllGatherResult& gather, std::vector<FSDPParam>& params, const shard::FlatLayout& layout) override {
    copy_out(gather, params, layout);
  }

 private:
  c10::ScalarType param_dtype_;
  bool gathers_;
  HostGroups hosts_;
};

class Int8AllGatherCodec final : public AllGatherCodec {
 public:
  Int8AllGatherCodec(c10::ScalarType param_dtype, std::vector<int64_t> segments, HostGroups hosts)
      : param_dtype_(param_dtype), segments_(std::move(segments)), hosts_(std::move(hosts)) {}

  AllGatherResult encode(const at::Tensor& master_flat, comm::ProcessGroup& group, const comm::OpTag& tag) override {
    at::NoGradGuard no_grad;
    return issue_all_gather(comm::int8_block_quantize(master_flat, segments_), group, hosts_,
                            comm::CommContext::for_group(group), tag);
  }

  void decode(AllGatherResult& gather, std::vector<FSDPParam>& params, const shard::FlatLayout& layout) override {
    wait_gathered(gather);
    const int64_t S = layout.shard_numel(), world = layout.world_size;
    AllGatherResult decoded;
    decoded.hosts = gather.hosts;  // the blocks keep the gather's order
    decoded.output = at::empty({world, S}, gather.output.options().dtype(param_dtype_));
    comm::int8_block_dequantize(gather.output.view({world, comm::int8_payload_bytes(segments_)}), segments_,
                                decoded.output);
    gather = AllGatherResult{};  // the payloads go before the params are allocated
    decoded.output = decoded.output.view({world * S});
    copy_out(decoded, params, layout);
  }

 private:
  c10::ScalarType param_dtype_;
  std::vector<int64_t> segments_;  // per param, padded_shard_numel: blocks restart at each
  HostGroups hosts_;
};

}  // namespace

std::unique_ptr<AllGatherCodec> int8_all_gather_codec(c10::ScalarType param_dtype, std::vector<int64_t> segments,
                                                      HostGroups hosts) {
  return std::make_unique<Int8AllGatherCodec>(param_dtype, std::move(segments), std::move(hosts));
}

std::vector<int64_t> shard_segments(const shard::FlatLayout& layout) {
  std::vector<int64_t> segments;
  for (const auto& p : layout.params) segments.push_back(p.padded_shard_numel());
  return segments;
}

std::unique_ptr<AllGatherCodec> make_all_gather_codec(WireCodec codec, c10::ScalarType param_dtype, bool gathers,
                                                      const shard::FlatLayout& layout, HostGroups hosts) {
  if (codec == WireCodec::kNone) return cast_all_gather_codec(param_dtype, gathers, std::move(hosts));
  FSDP_CHECK(gathers, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "make_all_gather_codec"}),
             "all_gather_codec ", to_string(codec), " needs a strategy that all-gathers params");
  return int8_all_gather_codec(param_dtype, shard_segments(layout), std::move(hosts));
}

std::unique_ptr<AllGatherCodec> cast_all_gather_codec(c10::ScalarType param_dtype, bool gathers, HostGroups hosts) {
  return std::make_unique<CastAllGatherCodec>(param_dtype, gathers, std::move(hosts));
}

}  // namespace fsdp::detail
