#include "dtypes.h"

#include <utility>

namespace fsdp::checkpoint {

namespace {

const std::vector<std::pair<c10::ScalarType, const char*>>& dtype_names() {
  static const std::vector<std::pair<c10::ScalarType, const char*>> names = {
      {c10::kFloat, "float32"}, {c10::kDouble, "float64"}, {c10::kBFloat16, "bfloat16"},
      {c10::kHalf, "float16"},  {c10::kLong, "int64"},     {c10::kInt, "int32"},
      {c10::kShort, "int16"},   {c10::kChar, "int8"},      {c10::kByte, "uint8"},
      {c10::kBool, "bool"}};
  return names;
}

}  // namespace

std::string dtype_name(c10::ScalarType dtype, const ErrorContext& where) {
  for (const auto& [d, n] : dtype_names()) {
    if (d == dtype) return n;
  }
  std::string known;
  for (const auto& [d, n] : dtype_names()) known += (known.empty() ? "" : ", ") + std::string(n);
  throw Error(ErrorKind::kUnsupported, where,
              str_cat("dtype ", dtype, " cannot be checkpointed (supported: ", known, ")"));
}

c10::ScalarType dtype_from(const std::string& name, const ErrorContext& where) {
  for (const auto& [d, n] : dtype_names()) {
    if (n == name) return d;
  }
  throw Error(ErrorKind::kCorruptData, where, "unknown dtype '" + name + "' in the manifest");
}

std::vector<int64_t> row_shape(const std::vector<int64_t>& shape) {
  const int64_t d0 = shape.empty() ? 1 : shape[0];
  int64_t row_numel = 1;
  FSDP_CHECK(d0 >= 0, ErrorKind::kCorruptData, ErrorContext{}, "shape with dim 0 = ", d0);
  for (size_t i = 1; i < shape.size(); ++i) {
    // A manifest's shape is read from disk: no negative dims, no int64 overflow (fuzz_manifest).
    FSDP_CHECK(shape[i] >= 0 && !__builtin_mul_overflow(row_numel, shape[i], &row_numel),
               ErrorKind::kCorruptData, ErrorContext{}, "shape dim ", i, " = ", shape[i],
               ": negative, or the row has more than 2^63 elements");
  }
  return {d0, row_numel};
}

}  // namespace fsdp::checkpoint
