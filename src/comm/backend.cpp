#include "fsdp/comm/backend.h"

#include "fsdp/common/check.h"

namespace fsdp::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kBFloat16: return "bfloat16";
    case c10::kHalf: return "float16";
    case c10::kInt: return "int32";
    case c10::kLong: return "int64";
    case c10::kByte: return "uint8";
    default: return c10::toString(dtype);
  }
}

bool BlockingBackend::supports(CollectiveKind kind, c10::ScalarType dtype) const {
  const bool reducible = dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kInt || dtype == c10::kLong;
  switch (kind) {
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllReduce:
      return reducible;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
    case CollectiveKind::kBroadcast:
      return reducible || dtype == c10::kBFloat16 || dtype == c10::kHalf || dtype == c10::kByte;
    case CollectiveKind::kBarrier:
      return true;
  }
  return false;
}

std::unique_ptr<BlockingBackend> BlockingBackend::make_control_channel() {
  throw Error(ErrorKind::kUnsupported, ErrorContext{rank(), "", "make_control_channel"},
              str_cat("the ", name(), " backend makes no CPU control channel of its own (the collective check's "
                      "signatures are CPU bytes); pass a CPU control backend over the same ranks (mpi or gloo) "
                      "to the ProcessGroup constructor"));
}

}  // namespace fsdp::comm
