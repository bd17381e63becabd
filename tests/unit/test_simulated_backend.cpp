// Tier `unit`: the simulated backend of dry runs. Meta tensors move nothing; a CPU all-gather
// returns this rank's input in every block; every other collective of CPU values and an
// arbitrary split are refused with fsdp::Error; structured splits give the right sizes and ranks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "fsdp/comm/simulated_backend.h"
#include "fsdp/common/check.h"

using fsdp::ErrorKind;

namespace {

ErrorKind kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fsdp::Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no fsdp::Error thrown";
  return ErrorKind::kInvalidArgument;
}

}  // namespace

TEST(SimulatedBackend, MetaMovesNothingCpuGathersReplicateValuesAreRefused) {
  auto g = fsdp::comm::simulated_world(8, 3);
  EXPECT_EQ(g->rank(), 3);
  EXPECT_EQ(g->size(), 8);
  EXPECT_TRUE(g->simulated());
  EXPECT_EQ(g->device_type(), c10::DeviceType::Meta);
  const auto meta = at::TensorOptions().device(at::kMeta);
  at::Tensor in = at::empty({5}, meta), out = at::empty({40}, meta);
  g->all_gather_into_tensor(out, in)->wait();
  g->reduce_scatter_tensor(in, out, fsdp::comm::ReduceOp::kAvg)->wait();
  g->all_reduce(at::empty({6}, meta.dtype(at::kBFloat16)))->wait();  // the low-precision path too
  EXPECT_EQ(g->stats().snapshot()[0].bytes, 40 * 4);  // logical bytes still counted

  at::Tensor mine = at::tensor({int64_t{7}, int64_t{9}});
  at::Tensor all = at::zeros({16}, at::kLong);
  g->all_gather_into_tensor(all, mine)->wait();
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(all[2 * r].item<int64_t>(), 7);
    EXPECT_EQ(all[2 * r + 1].item<int64_t>(), 9);
  }
  EXPECT_EQ(kind_of([&] { g->all_reduce(at::ones({4}))->wait(); }), ErrorKind::kUnsupported);
  EXPECT_EQ(kind_of([&] { g->broadcast(at::ones({4}), 0)->wait(); }), ErrorKind::kUnsupported);
  EXPECT_EQ(kind_of([&] { g->split(0, 0); }), ErrorKind::kUnsupported);
  EXPECT_EQ(kind_of([&] { g->split_blocks(3, false); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([&] { fsdp::comm::simulated_world(4, 4); }), ErrorKind::kInvalidArgument);

  auto shard = g->split_blocks(4, /*strided=*/false);  // ranks 0-3: rank 3 is the 4th
  EXPECT_EQ(shard->size(), 4);
  EXPECT_EQ(shard->rank(), 3);
  auto replicate = g->split_blocks(4, /*strided=*/true);  // ranks 3, 7: rank 3 is the first
  EXPECT_EQ(replicate->size(), 2);
  EXPECT_EQ(replicate->rank(), 0);
}
