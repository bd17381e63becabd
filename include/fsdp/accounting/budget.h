// A per-rank memory budget enforced by the counting CPU allocator: an allocation that would take
// the bytes in use past the budget is refused with fsdp::OutOfMemory. docs/architecture.md,
// "[Note: memory budget]".
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/common/check.h"

namespace fsdp {

/// Thrown by the counting allocator when a memory budget refuses an allocation (kind
/// kOutOfMemory). where(): the rank given to set_memory_budget, the unit in flight ("" outside
/// any unit) and the phase as op ("forward", "backward", "optimizer step", ...; "" when nothing
/// was marked). Nothing was allocated: the bytes in use are those before the request.
class OutOfMemory : public Error {
 public:
  OutOfMemory(ErrorContext where, int64_t requested_bytes, int64_t in_use_bytes, int64_t budget_bytes);
  /// Size of the refused allocation, in bytes.
  int64_t requested_bytes() const { return requested_bytes_; }
  /// Bytes of CPU tensor storage alive on this process when it was refused.
  int64_t in_use_bytes() const { return in_use_bytes_; }
  int64_t budget_bytes() const { return budget_bytes_; }
  /// The phase in flight (where().op), "" when unknown.
  const std::string& phase() const { return where().op; }

 private:
  int64_t requested_bytes_, in_use_bytes_, budget_bytes_;
};

namespace accounting {

/// Caps this process's CPU tensor bytes at budget_bytes (> 0): from now on, an allocation through
/// the counting allocator that would take current_bytes() past it throws fsdp::OutOfMemory with
/// `rank` (this process's rank, for the report; -1: none), the bytes asked, the bytes in use, the
/// budget, and the unit and phase of the calling thread (fsdp::current_activity()). Allocations
/// made before the call stay; a budget below current_bytes() refuses every further allocation.
/// Threads holding a BudgetExemptScope (the communication threads) are counted, never refused.
/// Installs the counting allocator if it is not installed (tensors allocated before that are
/// never counted). Not collective; thread-safe. Throws fsdp::Error (kInvalidArgument) for
/// budget_bytes <= 0.
void set_memory_budget(int64_t budget_bytes, int rank = -1);
/// Removes the budget (nothing is refused afterwards). Call before reporting an OutOfMemory, so
/// that the report itself may allocate.
void clear_memory_budget();
/// The budget in bytes, 0 when none is set.
int64_t memory_budget_bytes();

/// Parses a byte size: a non-negative number with an optional unit B, KB, MB, GB, TB (powers of
/// 1000) or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive, e.g. "600MB", "1.5GiB",
/// "4096". Throws fsdp::Error (kInvalidArgument) naming the text otherwise.
int64_t parse_bytes(const std::string& text);
/// "600.0 MB"-style text of a byte count in powers of 1000 (B, KB, MB, GB, TB; one decimal):
/// format_byte_count(bytes, ByteUnits::kDecimal) (fsdp/common/bytes.h).
std::string format_bytes(int64_t bytes);

}  // namespace accounting
}  // namespace fsdp
