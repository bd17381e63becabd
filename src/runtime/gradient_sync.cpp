#include "gradient_sync.h"

namespace fsdp::detail {

std::unique_ptr<GradientSync> make_gradient_sync(GradSync kind, GradientSyncArgs args) {
  switch (kind) {
    case GradSync::kReduceScatter: return make_reduce_scatter_sync(std::move(args));
    case GradSync::kBuckets: break;
  }
  return make_bucket_sync(std::move(args));
}

}  // namespace fsdp::detail
