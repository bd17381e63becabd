// Tier `unit`: the counting CPU allocator honours the whole c10::Allocator contract (raw interface,
// simple DataPtrs, clone, alignment, zero bytes, cross-thread frees, exact counters) and libtorch's
// oneDNN and low-precision kernels run on top of it on every CPU.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/COW.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "fsdp/accounting/memory.h"

namespace acc = fsdp::accounting;

namespace {

c10::Allocator* counting() {
  acc::install_counting_allocator();
  return c10::GetCPUAllocator();
}

bool aligned64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

}  // namespace

TEST(CountingAllocator, InstalledAsTheCpuAllocator) {
  c10::Allocator* a = counting();
  EXPECT_TRUE(acc::counting_allocator_installed());
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CPU), a) << "GetAllocator(CPU) and GetCPUAllocator agree";
  const int64_t before = acc::current_bytes();
  {
    at::Tensor t = at::empty({1000}, at::kFloat);
    EXPECT_EQ(acc::current_bytes() - before, 4000) << "a CPU tensor's storage is counted exactly";
  }
  EXPECT_EQ(acc::current_bytes(), before) << "and uncounted when freed";
}

TEST(CountingAllocator, RawAllocateThenRawDeleter) {
  c10::Allocator* a = counting();
  ASSERT_NE(a->raw_deleter(), nullptr) << "raw_deleter() must be implemented (oneDNN frees with it)";
  const int64_t before = acc::current_bytes();
  void* p = a->raw_allocate(4096);  // asserts context == data inside c10
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(aligned64(p));
  std::memset(p, 0xab, 4096);  // writable, whole size
  EXPECT_EQ(acc::current_bytes() - before, 4096);
  a->raw_deallocate(p);
  EXPECT_EQ(acc::current_bytes(), before);
  // Mixed: raw and DataPtr allocations alive together, freed in another order.
  void* q = a->raw_allocate(100);
  c10::DataPtr d = a->allocate(300);
  void* r = a->raw_allocate(7);
  EXPECT_EQ(acc::current_bytes() - before, 407);
  a->raw_deallocate(q);
  d.clear();
  EXPECT_EQ(acc::current_bytes() - before, 7);
  a->raw_deallocate(r);
  EXPECT_EQ(acc::current_bytes(), before);
}

TEST(CountingAllocator, DataPtrIsSimpleAndFreedByRawDeleter) {
  c10::Allocator* a = counting();
  c10::DataPtr d = a->allocate(256);
  EXPECT_EQ(d.get(), d.get_context()) << "context == data";
  EXPECT_EQ(d.get_deleter(), a->raw_deleter());
  EXPECT_TRUE(a->is_simple_data_ptr(d));
  EXPECT_EQ(d.device(), c10::Device(c10::DeviceType::CPU));
  // Copy-on-write clones (at::_lazy_clone) need simple DataPtrs.
  at::Tensor t = at::arange(64, at::kFloat);
  EXPECT_TRUE(c10::impl::cow::has_simple_data_ptr(*t.storage().unsafeGetStorageImpl()));
  at::Tensor c = at::_lazy_clone(t);
  EXPECT_TRUE(c.equal(t));
  c.add_(1);  // materializes the copy; t unchanged
  EXPECT_EQ(t[5].item<float>(), 5.0f);
  EXPECT_EQ(c[5].item<float>(), 6.0f);
}

TEST(CountingAllocator, CloneAndCopyData) {
  c10::Allocator* a = counting();
  std::vector<uint8_t> src(1000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  c10::DataPtr s = a->allocate(src.size());
  std::memcpy(s.get(), src.data(), src.size());
  const int64_t before = acc::current_bytes();
  c10::DataPtr c = a->clone(s.get(), src.size());
  EXPECT_EQ(acc::current_bytes() - before, 1000) << "a clone is a counted allocation";
  EXPECT_NE(c.get(), s.get());
  EXPECT_EQ(std::memcmp(c.get(), src.data(), src.size()), 0);
  a->copy_data(s.get(), c.get(), 10);  // copy_data between two of our allocations
  EXPECT_EQ(std::memcmp(s.get(), src.data(), 10), 0);
}

TEST(CountingAllocator, AlignmentOfEverySize) {
  c10::Allocator* a = counting();
  std::vector<c10::DataPtr> keep;
  for (size_t n : {1, 3, 8, 63, 64, 65, 127, 1000, 4095, 4097, 1 << 20, (1 << 21) + 5}) {
    keep.push_back(a->allocate(n));
    EXPECT_TRUE(aligned64(keep.back().get())) << n << " bytes";
    void* p = a->raw_allocate(n);
    EXPECT_TRUE(aligned64(p)) << n << " bytes, raw";
    a->raw_deallocate(p);
  }
}

TEST(CountingAllocator, ZeroBytes) {
  c10::Allocator* a = counting();
  const int64_t before = acc::current_bytes();
  c10::DataPtr d = a->allocate(0);
  EXPECT_EQ(d.get(), nullptr);
  EXPECT_EQ(d.get(), d.get_context());
  EXPECT_EQ(acc::current_bytes(), before);
  void* p = a->raw_allocate(0);
  a->raw_deallocate(p);
  d.clear();
  at::Tensor e = at::empty({0}, at::kFloat);
  at::Tensor e2 = e.clone();
  EXPECT_EQ(acc::current_bytes(), before);
}

TEST(CountingAllocator, CurrentAndPeakAreExact) {
  c10::Allocator* a = counting();
  const int64_t base = acc::current_bytes();
  acc::reset_peak_bytes();
  EXPECT_EQ(acc::peak_bytes(), base);
  c10::DataPtr x = a->allocate(1 << 20);
  void* y = a->raw_allocate(2 << 20);
  EXPECT_EQ(acc::current_bytes() - base, 3 << 20);
  x.clear();
  a->raw_deallocate(y);
  c10::DataPtr z = a->allocate(1 << 10);
  EXPECT_EQ(acc::current_bytes() - base, 1 << 10);
  EXPECT_EQ(acc::peak_bytes() - base, 3 << 20) << "peak holds the high-water mark";
  z.clear();
  EXPECT_EQ(acc::current_bytes(), base);
}

TEST(CountingAllocator, FreesFromAnotherThread) {
  c10::Allocator* a = counting();
  const int64_t base = acc::current_bytes();
  // Allocated here, freed by a second thread (the communication thread releases op tensors).
  std::vector<c10::DataPtr> dptrs;
  std::vector<void*> raws;
  for (int i = 0; i < 200; ++i) {
    dptrs.push_back(a->allocate(64 + i));
    raws.push_back(a->raw_allocate(32 + i));
  }
  std::thread other([&] {
    for (auto& d : dptrs) d.clear();
    for (void* p : raws) a->raw_deallocate(p);
  });
  other.join();
  EXPECT_EQ(acc::current_bytes(), base);
  // Both threads allocating and freeing at once; each frees some of the other's blocks.
  // Thread 0 also raw-allocates blocks that a third thread frees afterwards.
  std::vector<void*> handoff(2000, nullptr);
  auto worker = [&](int id) {
    std::mt19937 rng(id);
    std::vector<c10::DataPtr> mine;
    for (int i = 0; i < 20000; ++i) {
      mine.push_back(a->allocate(1 + rng() % 5000));
      if (mine.size() > 32) mine.erase(mine.begin() + static_cast<long>(rng() % mine.size()));
      if (id == 0 && i % 10 == 0) handoff[i / 10] = a->raw_allocate(100);
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  std::thread t2([&] {
    for (void* p : handoff) {
      if (p) a->raw_deallocate(p);
    }
  });
  t2.join();
  EXPECT_EQ(acc::current_bytes(), base);
}

// oneDNN allocates its tensors and scratch memory with raw_allocate on every x86 CPU: converting to
// and from its layout runs that path whether or not the CPU has bf16 units.
TEST(CountingAllocator, OneDnnTensorsRunOnIt) {
  counting();
  if (!at::hasMKLDNN()) GTEST_SKIP() << "this libtorch build has no oneDNN";
  const int64_t base = acc::current_bytes();
  {
    at::Tensor x = at::randn({64, 48});
    at::Tensor m = x.to_mkldnn();
    EXPECT_GT(acc::current_bytes() - base, 64 * 48 * 4) << "oneDNN's buffer is counted";
    at::Tensor back = m.to_dense();
    EXPECT_TRUE(back.equal(x));
    // A oneDNN linear (fp32) on oneDNN tensors.
    at::Tensor w = at::randn({32, 48});
    at::Tensor y = at::mkldnn_linear(m, w, at::Tensor()).to_dense();
    EXPECT_TRUE(at::allclose(y, at::matmul(x, w.t()), 1e-4, 1e-4));
  }
  EXPECT_EQ(acc::current_bytes(), base) << "every oneDNN allocation was freed and uncounted";
}

// bf16 and fp16 matmuls, linear layers and their backward take oneDNN (with scratch memory from
// raw_allocate) where the CPU has those units and another kernel elsewhere; both must match fp32.
TEST(CountingAllocator, LowPrecisionMatmulsForwardAndBackward) {
  counting();
  const int64_t base = acc::current_bytes();
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::Tensor x = at::randn({16, 64});
    at::Tensor w = at::randn({32, 64});
    at::Tensor xl = x.to(dtype).requires_grad_(true);
    at::Tensor wl = w.to(dtype).requires_grad_(true);
    at::Tensor y = at::linear(xl, wl);
    y.sum().backward();
    at::Tensor ref = at::linear(x.to(dtype).to(at::kFloat), w.to(dtype).to(at::kFloat));
    EXPECT_TRUE(at::allclose(y.to(at::kFloat), ref, 5e-2, 2.5e-1)) << (y.to(at::kFloat) - ref).abs().max();
    EXPECT_EQ(wl.grad().scalar_type(), dtype);
    at::Tensor gref = at::ones({16, 32}).t().mm(x.to(dtype).to(at::kFloat));
    EXPECT_TRUE(at::allclose(wl.grad().to(at::kFloat), gref, 5e-2, 2.5e-1));
    at::Tensor mm = at::mm(x.to(dtype), w.to(dtype).t());
    EXPECT_TRUE(at::allclose(mm.to(at::kFloat), ref, 5e-2, 2.5e-1));
  }
  EXPECT_EQ(acc::current_bytes(), base);
}
