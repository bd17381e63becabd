// Tier `unit`: the Work interface (WorkHandle) and its CPU implementation, and what a backend
// declares through supports(): ProcessGroup validates dtypes against it and picks the bf16/fp16
// reduction path from it; the comm context a group gives the unit collectives.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/comm/comm_context.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/comm/simulated_backend.h"
#include "fsdp/comm/threaded_backend.h"
#include "fsdp/comm/work.h"
#include "fsdp/common/check.h"

using fsdp::comm::BlockingBackend;
using fsdp::comm::CollectiveKind;
using fsdp::comm::ProcessGroup;
using fsdp::comm::ReduceOp;
using fsdp::comm::Work;
using fsdp::comm::WorkHandle;
using fsdp::comm::WorkPtr;

TEST(Work, WaitRethrowsTheSameErrorEveryTime) {
  auto w = std::make_shared<Work>();
  EXPECT_FALSE(w->is_completed());
  EXPECT_EQ(w->duration_s(), 0.0);
  w->finish(std::make_exception_ptr(std::runtime_error("the transport lost the peer")), 0.25);
  EXPECT_TRUE(w->is_completed());
  EXPECT_EQ(w->duration_s(), 0.25);
  for (int i = 0; i < 2; ++i) {
    try {
      w->wait();
      ADD_FAILURE() << "wait() returned after a failed op (call " << i << ")";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "the transport lost the peer");
    }
  }
}

// Each wait throws an exception object of its own, never the one the communication thread threw
// (which the Work keeps): two threads never share one exception object, whose reference count
// lives in uninstrumented runtime code (a thread sanitizer reported its release as a race).
TEST(Work, EachWaitThrowsItsOwnCopyOfAnFsdpError) {
  auto w = std::make_shared<Work>();
  const std::exception_ptr original = std::make_exception_ptr(
      fsdp::Error(fsdp::ErrorKind::kMismatch, fsdp::ErrorContext{1, "h.0", "all_gather"}, "ranks disagree"));
  const void* original_address = nullptr;
  try {
    std::rethrow_exception(original);
  } catch (const fsdp::Error& e) {
    original_address = &e;
  }
  w->finish(original, 0.0);
  std::vector<const void*> seen;
  for (int i = 0; i < 2; ++i) {
    std::thread waiter([&] {
      try {
        w->wait();
        ADD_FAILURE() << "wait() returned after a failed op";
      } catch (const fsdp::Error& e) {
        seen.push_back(&e);
        EXPECT_EQ(e.kind(), fsdp::ErrorKind::kMismatch);
        EXPECT_EQ(std::string(e.what()), "[fsdp rank 1] unit 'h.0' all_gather: ranks disagree");
      }
    });
    waiter.join();
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NE(seen[0], original_address);
  EXPECT_NE(seen[1], original_address);
}

TEST(Work, WaitBlocksUntilAnotherThreadFinishesIt) {
  auto w = std::make_shared<Work>();
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    w->wait();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(returned.load());
  w->finish(nullptr, 0.5);
  waiter.join();
  EXPECT_TRUE(returned.load());
  EXPECT_EQ(w->duration_s(), 0.5);
}

TEST(Work, JoiningTheCurrentStreamIsANoOpOnTheCpu) {
  // Neither blocks on an unfinished op nor reports a failed one (wait() does).
  auto pending = std::make_shared<Work>();
  pending->block_current_stream();
  EXPECT_FALSE(pending->is_completed());
  auto failed = std::make_shared<Work>();
  failed->finish(std::make_exception_ptr(std::runtime_error("x")), 0.0);
  EXPECT_NO_THROW(failed->block_current_stream());
  WorkPtr done = fsdp::comm::completed_work();
  EXPECT_TRUE(done->is_completed());
  EXPECT_NO_THROW(done->wait());
}

namespace {

// A handle of another kind than Work (what a device backend returns): completes when told.
class FlagWork final : public WorkHandle {
 public:
  void wait() override {
    while (!done_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool is_completed() const override { return done_; }
  double duration_s() const override { return 0.0; }
  void complete() { done_ = true; }

 private:
  std::atomic<bool> done_{false};
};

}  // namespace

TEST(Work, AnyHandleCanBeTheDependencyOfAnAllReduce) {
  auto world = fsdp::comm::threaded_world(2);
  auto dependency = std::make_shared<FlagWork>();
  at::Tensor t0 = at::zeros({3}), t1 = at::zeros({3});
  WorkPtr w0 = world[0]->all_reduce(t0, ReduceOp::kSum, {"u", "backward"}, dependency);
  WorkPtr w1 = world[1]->all_reduce(t1, ReduceOp::kSum, {"u", "backward"}, dependency);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(w0->is_completed());
  t0.fill_(1.0);
  t1.fill_(2.0);
  dependency->complete();
  w0->wait();
  w1->wait();
  EXPECT_TRUE(at::equal(t0, at::full({3}, 3.0)));
  EXPECT_TRUE(at::equal(t1, at::full({3}, 3.0)));
}

namespace {

// Rank 0 of a pretend 2-rank group that declares what it runs: reductions of float32 and, when
// `reduces_bf16`, bfloat16 (counted; the result is the input doubled, as if the peer held the same).
class DeclaringBackend final : public BlockingBackend {
 public:
  explicit DeclaringBackend(bool reduces_bf16) : reduces_bf16_(reduces_bf16) {}
  std::string name() const override { return "declaring"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
  int64_t max_elements() const override { return 1 << 20; }
  const std::vector<int>& host_of_ranks() const override { return hosts_; }
  bool supports(CollectiveKind kind, c10::ScalarType dtype) const override {
    if (kind == CollectiveKind::kAllReduce) return dtype == c10::kFloat || (reduces_bf16_ && dtype == c10::kBFloat16);
    return kind == CollectiveKind::kAllGather || kind == CollectiveKind::kAllToAll;  // any dtype
  }
  void all_gather(const at::Tensor& out, const at::Tensor& in) override { out.view(-1).copy_(in.view(-1).repeat(2)); }
  void reduce_scatter(const at::Tensor&, const at::Tensor&, ReduceOp) override {
    throw std::logic_error("not declared");
  }
  void all_reduce(const at::Tensor& t, ReduceOp) override {
    ++all_reduces;
    t.mul_(2);
  }
  void all_to_all(const at::Tensor& out, const at::Tensor& in) override {
    ++all_to_alls;
    const int64_t n = in.numel() / 2;  // both blocks for me come from "my" block 0
    out.view(-1).narrow(0, 0, n).copy_(in.view(-1).narrow(0, 0, n));
    out.view(-1).narrow(0, n, n).copy_(in.view(-1).narrow(0, 0, n));
  }
  void broadcast(const at::Tensor&, int) override { throw std::logic_error("not declared"); }
  void barrier() override {}
  std::unique_ptr<BlockingBackend> split(int, int) override { throw std::logic_error("not declared"); }
  // A pretend group of one process: a simulated control channel mirrors this rank's signature.
  std::unique_ptr<BlockingBackend> make_control_channel() override { return fsdp::comm::simulated_backend(2, 0); }
  [[noreturn]] void abort_job(int) override { std::abort(); }

  static inline std::atomic<int> all_reduces{0};
  static inline std::atomic<int> all_to_alls{0};

 private:
  bool reduces_bf16_;
  std::vector<int> hosts_{0, 0};
};

// The kInvalidArgument message of fn (empty, and a failure, when it throws none).
std::string invalid_argument_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

}  // namespace

TEST(BackendSupports, TheDefaultIsTheCpuTransportsSet) {
  // The default (BlockingBackend::supports) through a backend that does not override it.
  class Plain final : public BlockingBackend {
   public:
    std::string name() const override { return "plain"; }
    int rank() const override { return 0; }
    int size() const override { return 1; }
    c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
    int64_t max_elements() const override { return 1; }
    const std::vector<int>& host_of_ranks() const override { return hosts_; }
    void all_gather(const at::Tensor&, const at::Tensor&) override {}
    void reduce_scatter(const at::Tensor&, const at::Tensor&, ReduceOp) override {}
    void all_reduce(const at::Tensor&, ReduceOp) override {}
    void all_to_all(const at::Tensor&, const at::Tensor&) override {}
    void broadcast(const at::Tensor&, int) override {}
    void barrier() override {}
    std::unique_ptr<BlockingBackend> split(int, int) override { return nullptr; }
    [[noreturn]] void abort_job(int) override { std::abort(); }

   private:
    std::vector<int> hosts_{0};
  } plain;
  int moved = 0, reduced = 0;
  for (const auto d : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong, at::kByte, at::kChar,
                       at::kShort, at::kBool}) {
    moved += plain.supports(CollectiveKind::kAllGather, d);
    EXPECT_EQ(plain.supports(CollectiveKind::kAllToAll, d), plain.supports(CollectiveKind::kAllGather, d));
    EXPECT_EQ(plain.supports(CollectiveKind::kBroadcast, d), plain.supports(CollectiveKind::kAllGather, d));
    reduced += plain.supports(CollectiveKind::kAllReduce, d);
    EXPECT_EQ(plain.supports(CollectiveKind::kReduceScatter, d), plain.supports(CollectiveKind::kAllReduce, d));
  }
  EXPECT_EQ(moved, 7);    // float32, float64, bfloat16, float16, int32, int64, uint8
  EXPECT_EQ(reduced, 4);  // float32, float64, int32, int64
  EXPECT_FALSE(plain.supports(CollectiveKind::kAllReduce, at::kBFloat16));
  EXPECT_TRUE(plain.supports(CollectiveKind::kBarrier, at::kBool));
}

TEST(BackendSupports, TheGroupRefusesWhatTheBackendDoesNotDeclareBeforeQueueing) {
  ProcessGroup g(std::make_unique<DeclaringBackend>(false));
  const int before = DeclaringBackend::all_reduces.load();
  const std::string msg = invalid_argument_of([&] { g.all_reduce(at::ones({4}, at::kDouble)); });
  EXPECT_NE(msg.find("unsupported dtype float64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("declaring backend's all_reduce takes float32, bfloat16, float16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[fsdp rank 0]"), std::string::npos) << msg;
  const std::string b = invalid_argument_of([&] { g.broadcast(at::ones({4}), 0); });
  EXPECT_NE(b.find("broadcast takes none"), std::string::npos) << b;
  EXPECT_EQ(DeclaringBackend::all_reduces.load(), before);
  EXPECT_EQ(g.stats().snapshot()[static_cast<int>(CollectiveKind::kAllReduce)].calls, 0);
}

TEST(BackendSupports, ABackendThatReducesBf16ItselfIsCalledForIt) {
  for (bool reduces_bf16 : {false, true}) {
    ProcessGroup g(std::make_unique<DeclaringBackend>(reduces_bf16));
    const int reduces = DeclaringBackend::all_reduces.load(), exchanges = DeclaringBackend::all_to_alls.load();
    at::Tensor t = at::full({6}, 1.5, at::kBFloat16);
    g.all_reduce(t, ReduceOp::kSum)->wait();
    EXPECT_TRUE(at::equal(t, at::full({6}, 3.0, at::kBFloat16))) << t;
    // Its own reduction, or the group's float32 one over one all_to_all (and an all_gather).
    EXPECT_EQ(DeclaringBackend::all_reduces.load() - reduces, reduces_bf16 ? 1 : 0);
    EXPECT_EQ(DeclaringBackend::all_to_alls.load() - exchanges, reduces_bf16 ? 0 : 1);
  }
}

TEST(CommContext, FollowsTheGroupsDevice) {
  const auto threaded = fsdp::comm::CommContext::for_group(*fsdp::comm::threaded_world(1)[0]);
  EXPECT_EQ(threaded.buffer_device, c10::Device(c10::DeviceType::CPU));
  EXPECT_EQ(threaded.flag_device, c10::Device(c10::DeviceType::CPU));
  EXPECT_EQ(threaded.buffer_options(at::kBFloat16).dtype(), at::kBFloat16);
  // A simulated group's buffers are meta tensors; the flags it answers by its own rule stay on the host.
  const auto simulated = fsdp::comm::CommContext::for_group(*fsdp::comm::simulated_world(4, 1));
  EXPECT_EQ(simulated.buffer_device, c10::Device(c10::DeviceType::Meta));
  EXPECT_EQ(simulated.flag_device, c10::Device(c10::DeviceType::CPU));
  EXPECT_EQ(simulated.buffer_options(at::kFloat).device(), c10::Device(c10::DeviceType::Meta));
}
