// Tier `unit`: the memory budget of the counting allocator (include/fsdp/accounting/budget.h):
// refusals with the exact bytes, rank, unit and phase; nothing allocated by a refusal; the
// exemption of communication threads; byte-size parsing.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <thread>

#include "fsdp/accounting/budget.h"
#include "fsdp/accounting/memory.h"
#include "fsdp/common/activity.h"

namespace {

// Sets a budget of `headroom` bytes above what is in use now, lifted at the end of the scope.
struct BudgetScope {
  explicit BudgetScope(int64_t headroom) {
    fsdp::accounting::set_memory_budget(fsdp::accounting::current_bytes() + headroom, /*rank=*/3);
  }
  ~BudgetScope() { fsdp::accounting::clear_memory_budget(); }
};

}  // namespace

TEST(MemoryBudget, RefusesPastTheBudgetWithTheFullReport) {
  fsdp::accounting::install_counting_allocator();
  at::Tensor keep = at::empty({1000}, at::kFloat);  // 4000 bytes, allowed
  const int64_t in_use = fsdp::accounting::current_bytes();
  BudgetScope budget(4096);
  at::Tensor fits = at::empty({1024}, at::kFloat);  // exactly the headroom: allowed
  EXPECT_EQ(fsdp::accounting::current_bytes(), in_use + 4096);
  const fsdp::ActivityScope activity("h.3", "backward");
  try {
    at::Tensor too_much = at::empty({1}, at::kByte);
    ADD_FAILURE() << "one byte past the budget was allocated";
  } catch (const fsdp::OutOfMemory& e) {
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kOutOfMemory);
    EXPECT_EQ(e.requested_bytes(), 1);
    EXPECT_EQ(e.in_use_bytes(), in_use + 4096);
    EXPECT_EQ(e.budget_bytes(), in_use + 4096);
    EXPECT_EQ(e.where().rank, 3);
    EXPECT_EQ(e.where().unit, "h.3");
    EXPECT_EQ(e.phase(), "backward");
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("[fsdp rank 3] unit 'h.3' backward: memory budget of ", 0), 0u) << what;
    EXPECT_NE(what.find("expected at most " + std::to_string(in_use + 4096) + ", got " +
                        std::to_string(in_use + 4097)),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(fsdp::accounting::current_bytes(), in_use + 4096) << "a refusal allocates nothing";
  fits = at::Tensor();
  at::Tensor again = at::empty({1024}, at::kFloat);  // freed bytes may be used again
  EXPECT_EQ(fsdp::accounting::current_bytes(), in_use + 4096);
}

TEST(MemoryBudget, ExemptThreadsAreCountedNotRefused) {
  fsdp::accounting::install_counting_allocator();
  const int64_t in_use = fsdp::accounting::current_bytes();
  BudgetScope budget(1);
  int64_t seen = -1;
  std::thread comm([&] {
    const fsdp::BudgetExemptScope exempt;
    at::Tensor t = at::empty({256}, at::kFloat);
    seen = fsdp::accounting::current_bytes() - in_use;
  });
  comm.join();
  EXPECT_EQ(seen, 1024) << "counted on the exempt thread";
  EXPECT_THROW(at::empty({256}, at::kFloat), fsdp::OutOfMemory) << "refused on this thread";
}

TEST(MemoryBudget, ActivitiesNestAndRestore) {
  EXPECT_EQ(fsdp::current_activity().unit, nullptr);
  {
    const fsdp::ActivityScope outer(nullptr, "optimizer step");
    fsdp::push_activity(fsdp::Activity{"h.0", "forward"});
    EXPECT_STREQ(fsdp::current_activity().unit, "h.0");
    fsdp::pop_activity();
    EXPECT_STREQ(fsdp::current_activity().phase, "optimizer step");
  }
  EXPECT_EQ(fsdp::current_activity().phase, nullptr);
}

TEST(MemoryBudget, ParsesAndFormatsByteSizes) {
  using fsdp::accounting::format_bytes;
  using fsdp::accounting::parse_bytes;
  EXPECT_EQ(parse_bytes("600MB"), 600000000);
  EXPECT_EQ(parse_bytes("1.5GiB"), 1610612736);
  EXPECT_EQ(parse_bytes("4096"), 4096);
  EXPECT_EQ(parse_bytes("64 kib"), 65536);
  EXPECT_EQ(parse_bytes("2KB"), 2000);
  EXPECT_THROW(parse_bytes("600 parsecs"), fsdp::Error);
  EXPECT_THROW(parse_bytes("MB"), fsdp::Error);
  EXPECT_THROW(parse_bytes("-5MB"), fsdp::Error);
  EXPECT_EQ(format_bytes(600000000), "600.0 MB");
  EXPECT_EQ(format_bytes(999), "999 B");
  EXPECT_THROW(fsdp::accounting::set_memory_budget(0), fsdp::Error);
}
