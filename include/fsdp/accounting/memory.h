// Memory accounting, the ground floor: a counting CPU allocator (current / peak bytes of every CPU
// tensor of this process) and glibc heap retention. The library's own bytes by kind (a query of
// the runtime's units) are in fsdp/runtime/model_state.h.
#pragma once

#include <cstdint>

namespace fsdp::accounting {

/// Installs a CPU allocator that counts the bytes of every live CPU allocation made through
/// c10's allocator (all CPU tensors, and oneDNN's tensors and scratch memory) in front of the
/// current one. Call once, before creating the tensors to be counted (tensors allocated earlier
/// are freed correctly but never counted). Idempotent; thread-safe counters. Not collective.
///
/// It honours the whole c10::Allocator contract: every DataPtr has context == data and the
/// deleter raw_deleter() returns (so raw_allocate/raw_deallocate, is_simple_data_ptr and
/// copy-on-write clones work), copy_data is a memcpy, memory is 64-byte aligned as the inner
/// allocator gives it, a zero-byte request is a null DataPtr, and frees may come from any thread.
/// Counted bytes are the requested sizes, exactly. See docs/architecture.md,
/// "[Note: counting allocator contract]".
void install_counting_allocator();
/// Asks the C library's malloc (glibc) to keep freed memory for reuse instead of returning it to
/// the operating system: allocations up to 32 MiB (glibc's largest mmap threshold) come from the
/// heap, which is never trimmed. FSDP frees every unit's unsharded params and gradients after use
/// and allocates them again in the next phase; returned to the OS, each new buffer faults in its
/// pages again (measured: 12% of a bf16 micro step, 600k page faults in 8 steps). The price is
/// that the resident set stays at the heap's high-water mark. Process-wide and irreversible; call
/// once at start-up, before training. Returns false (and changes nothing) when the C library is not
/// glibc. Not collective.
bool retain_freed_heap_memory();
/// True once install_counting_allocator() has run.
bool counting_allocator_installed();
/// Bytes of CPU tensor storage alive now (0 if the allocator is not installed).
int64_t current_bytes();
/// Highest current_bytes() since install or the last reset_peak_bytes().
int64_t peak_bytes();
/// Sets the peak to the current value (start of a measured phase).
void reset_peak_bytes();

}  // namespace fsdp::accounting
