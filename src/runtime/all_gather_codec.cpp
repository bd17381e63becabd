#include "all_gather_codec.h"

namespace fsdp::detail {
namespace {

class CastAllGatherCodec final : public AllGatherCodec {
 public:
  CastAllGatherCodec(c10::ScalarType param_dtype, bool gathers) : param_dtype_(param_dtype), gathers_(gathers) {}

  AllGatherResult encode(const at::Tensor& master_flat, comm::ProcessGroup& group, const comm::OpTag& tag) override {
    if (!gathers_) return local_cast(master_flat, param_dtype_);
    return foreach_all_gather(master_flat, group, comm::CommContext::for_group(group), param_dtype_, tag);
  }

  void decode(AllGatherResult& gather, std::vector<FSDPParam>& params, const shard::FlatLayout& layout) override {
    copy_out(gather, params, layout);
  }

 private:
  c10::ScalarType param_dtype_;
  bool gathers_;
};

}  // namespace

std::unique_ptr<AllGatherCodec> cast_all_gather_codec(c10::ScalarType param_dtype, bool gathers) {
  return std::make_unique<CastAllGatherCodec>(param_dtype, gathers);
}

}  // namespace fsdp::detail
