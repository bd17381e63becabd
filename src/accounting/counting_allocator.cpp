// The counting CPU allocator. See docs/architecture.md, "[Note: counting allocator contract]".
#include <c10/core/CPUAllocator.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "fsdp/accounting/budget.h"
#include "fsdp/accounting/memory.h"
#include "fsdp/common/activity.h"
#include "fsdp/common/check.h"

namespace fsdp::accounting {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};
std::atomic<int64_t> g_budget{0};  // 0: none
std::atomic<int> g_budget_rank{-1};

void raise_peak(int64_t now) {
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// [Note: memory budget] The bytes are reserved before the inner allocator is asked, so two threads
// cannot both pass the check with the last free bytes; a refused request is given back at once and
// nothing is allocated. The report names the unit and phase the calling thread marked
// (fsdp::current_activity()); the communication threads are exempt (BudgetExemptScope).
void reserve_bytes(int64_t n) {
  const int64_t now = g_current.fetch_add(n) + n;
  const int64_t budget = g_budget.load(std::memory_order_relaxed);
  if (budget > 0 && now > budget && !budget_exempt()) {
    g_current.fetch_sub(n);
    const Activity a = current_activity();
    throw OutOfMemory(ErrorContext{g_budget_rank.load(), a.unit ? a.unit : "", a.phase ? a.phase : ""}, n,
                      now - n, budget);
  }
  raise_peak(now);
}

// [Note: counting allocator contract] c10::Allocator has two ways in: allocate() returns a DataPtr
// that frees itself, and raw_allocate()/raw_deallocate() (used by oneDNN for its scratch memory,
// the path libtorch takes for bf16/fp16 matmuls on CPUs with those units) hand out a bare pointer
// and free it later through raw_deleter(). The raw path requires every DataPtr of allocate() to
// have context == data and the deleter raw_deleter() returns. So the allocation's size and the
// inner allocator's DataPtr cannot live in the context: they live in a table keyed by the data
// pointer, striped over kStripes locks so that the compute thread and the communication thread
// rarely contend. A zero-byte allocation is a null DataPtr (as c10's default allocator gives).
// Frees may come from any thread. A pointer the table does not know was allocated before install
// (by the inner allocator, through its raw interface): it goes back to the inner raw deleter.
constexpr size_t kStripes = 16;

struct Allocation {
  c10::DataPtr inner;  // owns the memory; destroying it frees through the inner allocator
  int64_t bytes;
};

struct Stripe {
  std::mutex mu;
  std::unordered_map<void*, Allocation> live;
};

// Leaked on purpose: tensors alive at static destruction still free through it.
std::array<Stripe, kStripes>& stripes() {
  static auto* s = new std::array<Stripe, kStripes>();
  return *s;
}

Stripe& stripe_of(const void* p) {
  // Allocations are 64-byte aligned: drop the low bits before hashing.
  const auto v = reinterpret_cast<std::uintptr_t>(p) >> 6;
  return stripes()[(v ^ (v >> 7) ^ (v >> 13)) % kStripes];
}

c10::Allocator* g_inner = nullptr;

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  /// n bytes from the inner allocator (64-byte aligned with c10's default one); n == 0 gives a
  /// null DataPtr. context == data, deleter == raw_deleter().
  c10::DataPtr allocate(size_t n) override {
    const c10::Device device(c10::DeviceType::CPU);
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &CountingAllocator::release, device);
    reserve_bytes(static_cast<int64_t>(n));  // throws OutOfMemory past the budget
    c10::DataPtr inner;
    try {
      inner = inner_->allocate(n);
    } catch (...) {
      g_current.fetch_sub(static_cast<int64_t>(n));
      throw;
    }
    void* data = inner.get();
    if (data == nullptr) g_current.fetch_sub(static_cast<int64_t>(n));
    FSDP_CHECK(data != nullptr, ErrorKind::kOutOfMemory, (ErrorContext{-1, "", "allocate"}),
               "the CPU allocator returned no memory for ", n, " bytes");
    {
      Stripe& s = stripe_of(data);
      std::lock_guard<std::mutex> lock(s.mu);
      s.live.emplace(data, Allocation{std::move(inner), static_cast<int64_t>(n)});
    }
    return c10::DataPtr(data, data, &CountingAllocator::release, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static void release(void* data) {
    if (data == nullptr) return;
    Allocation a;
    {
      Stripe& s = stripe_of(data);
      std::lock_guard<std::mutex> lock(s.mu);
      auto it = s.live.find(data);
      if (it == s.live.end()) {
        // Raw-allocated by the inner allocator before install.
        c10::DeleterFnPtr d = g_inner ? g_inner->raw_deleter() : nullptr;
        if (d) d(data);
        return;
      }
      a = std::move(it->second);
      s.live.erase(it);
    }
    g_current.fetch_sub(a.bytes);
    // a.inner frees the memory when it goes out of scope, outside the lock.
  }

  c10::Allocator* inner_;
};

}  // namespace

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_inner = c10::GetCPUAllocator();
    static CountingAllocator alloc(g_inner);
    c10::SetCPUAllocator(&alloc, /*priority=*/200);
    g_installed = true;
  });
}

bool retain_freed_heap_memory() {
#if defined(__GLIBC__)
  // M_MMAP_THRESHOLD may not exceed HEAP_MAX_SIZE / 2 (32 MiB on 64-bit glibc); setting it also
  // stops glibc's dynamic adjustment. A trim threshold above any heap never gives memory back.
  constexpr int kMaxMmapThreshold = 32 * 1024 * 1024;
  return mallopt(M_MMAP_THRESHOLD, kMaxMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1;
#else
  return false;
#endif
}

void set_memory_budget(int64_t budget_bytes, int rank) {
  FSDP_CHECK(budget_bytes > 0, ErrorKind::kInvalidArgument, (ErrorContext{rank, "", "set_memory_budget"}),
             expected_actual("memory budget", "a number of bytes > 0", budget_bytes));
  install_counting_allocator();
  g_budget_rank = rank;
  g_budget = budget_bytes;
}

void clear_memory_budget() { g_budget = 0; }
int64_t memory_budget_bytes() { return g_budget.load(); }

bool counting_allocator_installed() { return g_installed.load(); }
int64_t current_bytes() { return g_current.load(); }
int64_t peak_bytes() { return g_peak.load(); }
void reset_peak_bytes() { g_peak.store(g_current.load()); }

}  // namespace fsdp::accounting
