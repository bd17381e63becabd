// Element types and row geometry as checkpoint files name them (internal to the checkpoint
// subsystem). Manifests store dtypes by these names, never by c10's enum values.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/common/check.h"

namespace fsdp::checkpoint {

/// "float32", "float64", "bfloat16", "float16", "int64", "int32", "int16", "int8", "uint8", "bool".
/// Throws fsdp::Error (kUnsupported, context `where`) for any other dtype.
std::string dtype_name(c10::ScalarType dtype, const ErrorContext& where);

/// The dtype a manifest names. Throws fsdp::Error (kCorruptData, context `where`) for an unknown
/// name ("unknown dtype '<name>' in the manifest").
c10::ScalarType dtype_from(const std::string& name, const ErrorContext& where);

/// {rows, row_numel} of a global shape: dim 0 and the product of the other dims (a 0-dim tensor
/// is one row of one element). Files store tensors as C-contiguous rows of dim 0.
std::vector<int64_t> row_shape(const std::vector<int64_t>& shape);

}  // namespace fsdp::checkpoint
