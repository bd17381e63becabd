// A Backend that counts the calls it forwards to another, and the check that a ProcessGroup's
// data backend sees the user's ops only while its control channel carries the collective check
// ([Note: control channel] in include/fsdp/comm/backend.h).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "error_of.h"
#include "fsdp/comm/process_group.h"

namespace fsdp_test {

/// What one rank's backend (and the backends split from it) was asked to do.
struct BackendCounts {
  std::array<std::atomic<int>, fsdp::comm::kNumCollectiveKinds> calls{};  // by CollectiveKind
  std::atomic<int64_t> all_gather_output_bytes{0};  // summed over its all_gathers
  std::atomic<int> splits{0};                       // split and split_blocks
  std::atomic<int> control_channels{0};             // make_control_channel
  int of(fsdp::comm::CollectiveKind k) const { return calls[static_cast<size_t>(k)].load(); }
};

/// Forwards every call to `inner`, counting it in `counts` (both owned elsewhere, `counts`
/// outliving this backend). The groups it splits off count into the same `counts`; the control
/// channel it makes forwards to inner's and counts into `control_counts` (which must then be set).
class CountingBackend final : public fsdp::comm::Backend {
 public:
  CountingBackend(std::unique_ptr<fsdp::comm::Backend> inner, BackendCounts& counts,
                  BackendCounts* control_counts = nullptr)
      : inner_(std::move(inner)), counts_(counts), control_counts_(control_counts) {}

  std::string name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  c10::DeviceType device_type() const override { return inner_->device_type(); }
  int64_t max_elements() const override { return inner_->max_elements(); }
  const std::vector<int>& host_of_ranks() const override { return inner_->host_of_ranks(); }
  bool supports(fsdp::comm::CollectiveKind kind, c10::ScalarType dtype) const override {
    return inner_->supports(kind, dtype);
  }
  bool simulated() const override { return inner_->simulated(); }

  void all_gather(const at::Tensor& output, const at::Tensor& input) override {
    count(fsdp::comm::CollectiveKind::kAllGather);
    counts_.all_gather_output_bytes += static_cast<int64_t>(output.nbytes());
    inner_->all_gather(output, input);
  }
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, fsdp::comm::ReduceOp op) override {
    count(fsdp::comm::CollectiveKind::kReduceScatter);
    inner_->reduce_scatter(output, input, op);
  }
  void all_reduce(const at::Tensor& tensor, fsdp::comm::ReduceOp op) override {
    count(fsdp::comm::CollectiveKind::kAllReduce);
    inner_->all_reduce(tensor, op);
  }
  void all_to_all(const at::Tensor& output, const at::Tensor& input) override {
    count(fsdp::comm::CollectiveKind::kAllToAll);
    inner_->all_to_all(output, input);
  }
  void broadcast(const at::Tensor& tensor, int root) override {
    count(fsdp::comm::CollectiveKind::kBroadcast);
    inner_->broadcast(tensor, root);
  }
  void barrier() override {
    count(fsdp::comm::CollectiveKind::kBarrier);
    inner_->barrier();
  }
  std::unique_ptr<fsdp::comm::Backend> split(int color, int key) override {
    ++counts_.splits;
    inner_->set_deadline(deadline_s());
    return std::make_unique<CountingBackend>(inner_->split(color, key), counts_, control_counts_);
  }
  std::unique_ptr<fsdp::comm::Backend> split_blocks(int block, bool strided) override {
    ++counts_.splits;
    inner_->set_deadline(deadline_s());
    return std::make_unique<CountingBackend>(inner_->split_blocks(block, strided), counts_, control_counts_);
  }
  std::unique_ptr<fsdp::comm::Backend> make_control_channel() override {
    EXPECT_NE(control_counts_, nullptr) << "a control channel made without counts for it";
    ++counts_.control_channels;
    return std::make_unique<CountingBackend>(inner_->make_control_channel(), *control_counts_);
  }
  [[noreturn]] void abort_job(int code) override {
    inner_->abort_job(code);
    std::abort();  // the inner abort_job does not return either
  }

 private:
  void count(fsdp::comm::CollectiveKind kind) {
    ++counts_.calls[static_cast<size_t>(kind)];
    inner_->set_deadline(deadline_s());  // the executor sets this wrapper's deadline
  }

  std::unique_ptr<fsdp::comm::Backend> inner_;
  BackendCounts& counts_;
  BackendCounts* control_counts_;
};

/// Collective over g (a fresh group of two or more ranks, no op issued yet, over a data backend
/// counting into `data` and a control channel counting into `control`): one op of every kind,
/// a split and an op of the split group, then a mismatched all-gather. Expects the data backend to
/// have seen exactly those ops (kinds and counts; the mismatched one not at all) and the split,
/// the control channel one all-gather of a 152-byte signature per rank per op (the split and the
/// mismatched op included) and the split, nothing else; and the mismatch to fail on every rank
/// with kMismatch naming the sequence number, both sides' ops and the ranks that differ.
inline void check_control_channel_carries_the_check(fsdp::comm::ProcessGroup& g, const BackendCounts& data,
                                                    const BackendCounts& control) {
  using fsdp::comm::CollectiveKind;
  const int n = g.size(), r = g.rank();
  ASSERT_GE(n, 2);
  at::Tensor gathered = at::empty({n * 3});
  g.all_gather_into_tensor(gathered, at::full({3}, static_cast<float>(r)))->wait();
  at::Tensor reduced = at::empty({2});
  g.reduce_scatter_tensor(reduced, at::ones({n * 2}))->wait();
  at::Tensor summed = at::full({4}, static_cast<double>(r), at::kDouble);
  g.all_reduce(summed)->wait();
  at::Tensor root_value = at::full({5}, static_cast<int64_t>(r), at::kLong);
  g.broadcast(root_value, n - 1)->wait();
  at::Tensor exchanged = at::empty({n * 2});
  g.all_to_all(exchanged, at::full({n * 2}, static_cast<float>(r)))->wait();
  g.barrier()->wait();
  // The data moved as before.
  EXPECT_EQ(gathered[n * 3 - 1].item<float>(), static_cast<float>(n - 1));
  EXPECT_TRUE(at::equal(reduced, at::full({2}, static_cast<float>(n))));
  EXPECT_TRUE(at::equal(summed, at::full({4}, n * (n - 1) / 2.0, at::kDouble)));
  EXPECT_TRUE(at::equal(root_value, at::full({5}, static_cast<int64_t>(n - 1), at::kLong)));
  EXPECT_EQ(exchanged[2 * n - 1].item<float>(), static_cast<float>(n - 1));

  auto sub = g.split(0, r);  // one color: the same ranks
  at::Tensor sub_summed = at::ones({3});
  sub->all_reduce(sub_summed)->wait();
  EXPECT_TRUE(at::equal(sub_summed, at::full({3}, static_cast<float>(n))));

  // A mismatch: rank 0 gathers 4 elements, the others 5. Caught before any data moves.
  const int64_t mine = r == 0 ? 4 : 5;
  const fsdp::Error e = error_of(
      [&] { g.all_gather_into_tensor(at::empty({n * mine}), at::zeros({mine}), {"h.1", "forward"})->wait(); });
  EXPECT_EQ(e.kind(), fsdp::ErrorKind::kMismatch) << e.what();
  const std::string msg = e.what();
  EXPECT_NE(msg.find("ranks disagree at collective #7 of group 'world'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 issued all_gather of 4 float32, unit 'h.1', forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find(n == 2 ? "rank 1 issued all_gather of 5 float32" : "issued all_gather of 5 float32"),
            std::string::npos)
      << msg;

  // The data backend: the user's six ops, the split, the split group's all-reduce; not the
  // mismatched all-gather, and no signature.
  EXPECT_EQ(data.of(CollectiveKind::kAllGather), 1);
  EXPECT_EQ(data.all_gather_output_bytes.load(), n * 3 * 4);
  EXPECT_EQ(data.of(CollectiveKind::kReduceScatter), 1);
  EXPECT_EQ(data.of(CollectiveKind::kAllReduce), 2);
  EXPECT_EQ(data.of(CollectiveKind::kBroadcast), 1);
  EXPECT_EQ(data.of(CollectiveKind::kAllToAll), 1);
  EXPECT_EQ(data.of(CollectiveKind::kBarrier), 1);
  EXPECT_EQ(data.splits.load(), 1);
  // The control channel: a signature per op (six, the split, the split group's op, the mismatch).
  constexpr int kOps = 9;
  constexpr int64_t kSignatureBytes = 152;
  EXPECT_EQ(control.of(CollectiveKind::kAllGather), kOps);
  EXPECT_EQ(control.all_gather_output_bytes.load(), kOps * n * kSignatureBytes);
  for (const auto k : {CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce, CollectiveKind::kBroadcast,
                       CollectiveKind::kAllToAll, CollectiveKind::kBarrier}) {
    EXPECT_EQ(control.of(k), 0) << fsdp::comm::to_string(k) << " on the control channel";
  }
  EXPECT_EQ(control.splits.load(), 1);
}

}  // namespace fsdp_test
