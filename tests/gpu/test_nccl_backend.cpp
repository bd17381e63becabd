// Tier gpu: the NCCL backend (FSDP_WITH_CUDA builds). Every test skips, saying why, where the
// process sees fewer CUDA devices than it needs. At N = 1 (a world of one over a bootstrap group of
// one) each op of the backend is called directly against closed-form results (a group of one runs
// its ops inline and would not reach the backend); at N = 2 (two devices, one thread per rank, a
// threaded bootstrap) through the backend and through a ProcessGroup.
#include <ATen/cuda/Sleep.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../common/error_of.h"
#include "../common/models.h"
#include "../common/threaded.h"
#include "comm/all_to_all_reductions.h"  // detail::reduce_with: what ProcessGroup does for kAvg
#include "fsdp/comm/nccl_backend.h"
#include "fsdp/comm/threaded_backend.h"
#include "fsdp/comm/world.h"

namespace {

using fsdp::ErrorKind;
using fsdp::comm::CollectiveKind;
using fsdp::comm::NcclBackend;
using fsdp::comm::ReduceOp;
using fsdp_test::error_of;

int devices() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

// FSDP_REQUIRE_GPUS=N (scripts/gpu_check.sh sets it to the GPUs nvidia-smi lists): a test that
// needs at most N devices fails, instead of skipping, when this process sees fewer, so that a
// machine whose GPUs the tests cannot use does not pass the check by skipping everything.
int required_devices() {
  const char* v = std::getenv("FSDP_REQUIRE_GPUS");
  return v ? std::atoi(v) : 0;
}

#define FSDP_NEED_DEVICES(n)                                                                          \
  if (devices() < (n)) {                                                                              \
    if ((n) <= required_devices()) {                                                                  \
      FAIL() << "needs " << (n) << " CUDA device(s); FSDP_REQUIRE_GPUS=" << required_devices()         \
             << " says this machine has them, but this process sees " << devices();                  \
    }                                                                                                 \
    GTEST_SKIP() << "needs " << (n) << " CUDA device(s), this process sees " << devices()             \
                 << (torch::cuda::is_available() ? "" : " (no CUDA driver or device)");               \
  }

at::TensorOptions on_cuda(c10::ScalarType dtype, int device = 0) {
  return at::TensorOptions().dtype(dtype).device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
}

// The NCCL backend of a world of one: bootstrap over a threaded group of one rank.
std::unique_ptr<NcclBackend> backend_of_one() {
  auto boot = fsdp::comm::threaded_world(1);
  return std::make_unique<NcclBackend>(*boot[0], 0);
}

void expect_equal(const at::Tensor& actual, const at::Tensor& expected, const std::string& name) {
  const at::Tensor a = actual.cpu().to(at::kDouble), e = expected.cpu().to(at::kDouble);
  ASSERT_EQ(a.sizes(), e.sizes()) << name;
  EXPECT_TRUE(at::equal(a, e)) << name << ": max abs error " << (a - e).abs().max().item<double>();
}

TEST(NcclBackend, DescribesItself) {
  FSDP_NEED_DEVICES(1);
  auto b = backend_of_one();
  EXPECT_EQ(b->name(), "nccl");
  EXPECT_EQ(b->rank(), 0);
  EXPECT_EQ(b->size(), 1);
  EXPECT_EQ(b->device_type(), c10::DeviceType::CUDA);
  EXPECT_GT(b->max_elements(), int64_t{1} << 31);
  EXPECT_EQ(b->host_of_ranks(), std::vector<int>{0});
  for (auto kind : {CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce}) {
    EXPECT_TRUE(b->supports(kind, at::kBFloat16)) << "NCCL reduces bfloat16 itself";
    EXPECT_TRUE(b->supports(kind, at::kHalf)) << "NCCL reduces float16 itself";
    EXPECT_FALSE(b->supports(kind, at::kComplexFloat));
  }
  EXPECT_TRUE(b->supports(CollectiveKind::kAllGather, at::kByte));
}

TEST(NcclBackend, AllGatherOfOne) {
  FSDP_NEED_DEVICES(1);
  auto b = backend_of_one();
  const at::Tensor in = at::arange(7, on_cuda(at::kFloat));
  at::Tensor out = at::full({7}, -1.0, on_cuda(at::kFloat));
  b->all_gather(out, in);
  expect_equal(out, in, "all_gather output");
  // CPU tensors are refused: the collective check travels on the group's CPU control channel.
  at::Tensor host_out = at::zeros({7}, at::kFloat);
  EXPECT_THROW(b->all_gather(host_out, at::arange(7, at::kFloat)), fsdp::Error);
  EXPECT_THROW(b->make_control_channel(), fsdp::Error);
}

TEST(NcclBackend, ReduceScatterSumAndAvgOfOne) {
  FSDP_NEED_DEVICES(1);
  auto b = backend_of_one();
  const at::Tensor in = at::arange(6, on_cuda(at::kFloat)) * 1.5;
  at::Tensor out = at::zeros({6}, on_cuda(at::kFloat));
  b->reduce_scatter(out, in, ReduceOp::kSum);
  expect_equal(out, in, "reduce_scatter sum");  // one rank: the sum over ranks is its own block
  at::Tensor avg = at::zeros({6}, on_cuda(at::kFloat));
  fsdp::comm::detail::reduce_with(*b, avg, ReduceOp::kAvg,
                                  [&](ReduceOp o) { b->reduce_scatter(avg, in, o); });
  expect_equal(avg, in, "reduce_scatter avg");  // sum / 1
  for (auto op : {ReduceOp::kMax, ReduceOp::kMin}) {
    at::Tensor m = at::zeros({6}, on_cuda(at::kFloat));
    b->reduce_scatter(m, in, op);
    expect_equal(m, in, std::string("reduce_scatter ") + fsdp::comm::to_string(op));
  }
}

TEST(NcclBackend, AllReduceOfOneIncludingBfloat16) {
  FSDP_NEED_DEVICES(1);
  auto b = backend_of_one();
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong}) {
    const at::Tensor expected = (at::arange(9, at::kDouble) - 4).to(dtype);
    at::Tensor t = expected.to(at::kCUDA);
    b->all_reduce(t, ReduceOp::kSum);
    EXPECT_EQ(t.scalar_type(), dtype);
    expect_equal(t, expected, "all_reduce sum of " + fsdp::comm::dtype_name(dtype));
  }
}

TEST(NcclBackend, AllToAllBroadcastBarrierOfOne) {
  FSDP_NEED_DEVICES(1);
  auto b = backend_of_one();
  const at::Tensor in = at::arange(5, on_cuda(at::kLong));
  at::Tensor out = at::zeros({5}, on_cuda(at::kLong));
  b->all_to_all(out, in);
  expect_equal(out, in, "all_to_all");
  at::Tensor t = at::arange(4, on_cuda(at::kBFloat16));
  b->broadcast(t, 0);
  expect_equal(t, at::arange(4, at::kBFloat16), "broadcast");
  b->barrier();
}

TEST(NcclBackend, SplitOfOne) {
  FSDP_NEED_DEVICES(1);
  auto b = backend_of_one();
  auto sub = b->split(/*color=*/3, /*key=*/0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->name(), "nccl");
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->host_of_ranks(), std::vector<int>{0});
  at::Tensor t = at::full({3}, 2.0, on_cuda(at::kFloat));
  sub->all_reduce(t, ReduceOp::kSum);
  expect_equal(t, at::full({3}, 2.0), "all_reduce on the split communicator");
  EXPECT_EQ(error_of([&] { b->split(-1, 0); }).kind(), ErrorKind::kInvalidArgument);
}

TEST(NcclBackend, RefusesTensorsOffItsDevice) {
  FSDP_NEED_DEVICES(1);
  auto b = backend_of_one();
  at::Tensor host = at::zeros({4});
  const fsdp::Error e = error_of([&] { b->all_reduce(host, ReduceOp::kSum); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(e.where().rank, 0);
  EXPECT_NE(std::string(e.what()).find("ncclAllReduce"), std::string::npos) << e.what();
  auto boot = fsdp::comm::threaded_world(1);
  EXPECT_EQ(error_of([&] { NcclBackend(*boot[0], 9999); }).kind(), ErrorKind::kInvalidArgument)
      << "a device index this process does not see";
}

// The deadline: the caller's stream is kept busy (a spinning kernel) past the op's deadline, so
// the NCCL stream, which waits for it, cannot finish in time. Its own ctest entry
// (gpu_timeout): the aborted communicator's process runs nothing else.
TEST(NcclTimeout, AbortsAndNamesRankAndOp) {
  FSDP_NEED_DEVICES(1);
  auto b = backend_of_one();
  at::Tensor t = at::ones({16}, on_cuda(at::kFloat));
  at::cuda::sleep(int64_t{4} * 1000 * 1000 * 1000);  // a few seconds at any GPU clock
  b->set_deadline(fsdp::comm::now_s() + 0.2);
  const fsdp::Error e = error_of([&] { b->all_reduce(t, ReduceOp::kSum); });
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
  EXPECT_EQ(e.where().rank, 0);
  EXPECT_EQ(e.where().op, "ncclAllReduce");
  EXPECT_NE(e.message().find("ncclCommAbort"), std::string::npos) << e.what();
  const fsdp::Error after = error_of([&] { b->barrier(); });
  EXPECT_EQ(after.kind(), ErrorKind::kCollective);
  EXPECT_NE(after.message().find("aborted"), std::string::npos) << after.what();
  torch::cuda::synchronize();
}

// The engine on CUDA tensors over an NCCL world of one: a tiny MLP, FULL_SHARD over Linear units,
// two SGD steps, against the same model on the CPU over a threaded group of one. A group of one
// runs its collectives inline (no NCCL call), so this checks the engine's device path (shards,
// buffers and flags on the group's device), not NCCL's transfers: those are the closed-form tests
// above and the two-device tests below.
TEST(NcclProcessGroup, FullyShardStepMatchesCpu) {
  FSDP_NEED_DEVICES(1);
  auto boot = fsdp::comm::threaded_world(1);
  auto g = fsdp::comm::nccl_world(boot[0], 0, fsdp::comm::threaded_defaults());
  EXPECT_EQ(g->backend_name(), "nccl");
  EXPECT_EQ(g->control_backend_name(), "threaded");  // the check never touches the device
  EXPECT_EQ(g->device_type(), c10::DeviceType::CUDA);
  auto cpu_group = fsdp::comm::threaded_world(1)[0];
  torch::manual_seed(7);
  auto cpu_model = fsdp_test::MLP(8, 16, 4).ptr();
  auto gpu_model = fsdp_test::MLP(8, 16, 4).ptr();
  {
    torch::NoGradGuard no_grad;
    auto src = cpu_model->parameters(), dst = gpu_model->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  gpu_model->to(at::Device(at::kCUDA, 0));
  fsdp::fully_shard_tree(cpu_model, cpu_group, fsdp::wrap_by_type<torch::nn::LinearImpl>());
  fsdp::fully_shard_tree(gpu_model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>());
  torch::optim::SGD cpu_opt(fsdp::parameters(cpu_model), torch::optim::SGDOptions(0.1));
  torch::optim::SGD gpu_opt(fsdp::parameters(gpu_model), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 2; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
    const at::Tensor x = at::randn({5, 8}, gen), y = at::randn({5, 4}, gen);
    auto cpu_loss = torch::mse_loss(fsdp::call(cpu_model, x), y);
    auto gpu_loss = torch::mse_loss(fsdp::call(gpu_model, x.cuda()), y.cuda());
    cpu_loss.backward();
    gpu_loss.backward();
    cpu_opt.step();
    gpu_opt.step();
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    EXPECT_NEAR(gpu_loss.item<double>(), cpu_loss.item<double>(), 1e-5) << "loss of step " << step;
  }
  const auto cpu_params = fsdp::parameters(cpu_model), gpu_params = fsdp::parameters(gpu_model);
  ASSERT_EQ(cpu_params.size(), gpu_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    EXPECT_TRUE(gpu_params[i].is_cuda());
    const double err = (gpu_params[i].cpu() - cpu_params[i]).abs().max().item<double>();
    EXPECT_LT(err, 1e-5) << "sharded parameter " << i << ": max abs error " << err;
  }
}


// Two ranks, one device each: rank r contributes r + 1 (closed forms: sum 3, gather [1, 2]).
TEST(NcclTwoRanks, CollectivesInClosedForm) {
  FSDP_NEED_DEVICES(2);
  fsdp_test::run_threaded(2, [](int r, fsdp::comm::ProcessGroupPtr boot) {
    NcclBackend b(*boot, r);
    EXPECT_EQ(b.rank(), r);
    EXPECT_EQ(b.size(), 2);
    const auto f = on_cuda(at::kFloat, r);
    at::Tensor t = at::full({4}, r + 1.0, f);
    b.all_reduce(t, ReduceOp::kSum);
    expect_equal(t, at::full({4}, 3.0), "all_reduce sum");
    at::Tensor h = at::full({4}, r + 1.0, on_cuda(at::kBFloat16, r));
    b.all_reduce(h, ReduceOp::kMax);
    expect_equal(h, at::full({4}, 2.0), "all_reduce max bfloat16");
    at::Tensor gathered = at::zeros({2}, f);
    b.all_gather(gathered, at::full({1}, r + 1.0, f));
    expect_equal(gathered, at::tensor({1.0, 2.0}), "all_gather");
    at::Tensor block = at::zeros({2}, f);
    b.reduce_scatter(block, at::arange(4, f) + r, ReduceOp::kSum);  // rank q's block: [2q, 2q+1]
    expect_equal(block, at::tensor({4.0 * r + 1, 4.0 * r + 3}), "reduce_scatter sum");
    at::Tensor a2a = at::zeros({2}, f);
    b.all_to_all(a2a, at::tensor({10.0 * r, 10.0 * r + 1}, f));  // block q of rank p: 10p + q
    expect_equal(a2a, at::tensor({0.0 + r, 10.0 + r}), "all_to_all");
    at::Tensor bc = at::full({3}, r == 1 ? 5.0 : 0.0, f);
    b.broadcast(bc, 1);
    expect_equal(bc, at::full({3}, 5.0), "broadcast from root 1");
    b.barrier();
    auto sub = b.split(r, 0);  // one group per rank
    EXPECT_EQ(sub->size(), 1);
  });
}

// Two ranks through ProcessGroup: the collective check's CPU signatures on the control channel,
// the group's own kAvg division and the data over NCCL.
TEST(NcclTwoRanks, ProcessGroupOverNccl) {
  FSDP_NEED_DEVICES(2);
  fsdp_test::run_threaded(2, [](int r, fsdp::comm::ProcessGroupPtr boot) {
    auto g = fsdp::comm::nccl_world(boot, r, fsdp::comm::threaded_defaults());
    const auto f = on_cuda(at::kFloat, r);
    at::Tensor out = at::zeros({4}, f);
    g->reduce_scatter_tensor(out, at::full({8}, r + 1.0, f), ReduceOp::kAvg)->wait();
    expect_equal(out, at::full({4}, 1.5), "reduce_scatter avg");
    at::Tensor gathered = at::zeros({2}, on_cuda(at::kBFloat16, r));
    g->all_gather_into_tensor(gathered, at::full({1}, r + 1.0, on_cuda(at::kBFloat16, r)))->wait();
    expect_equal(gathered, at::tensor({1.0, 2.0}), "all_gather_into_tensor");
    g->barrier()->wait();
    EXPECT_EQ(fsdp::comm::local_rank_on_host(*boot), r);
  });
}

// The world a program asks for by name: the launcher's CPU world (a process of its own here: a
// world of one) bootstraps NCCL on the device local_rank_on_host gives, and carries the check.
TEST(NcclWorld, FromTheEnvironmentAtOneRank) {
  FSDP_NEED_DEVICES(1);
  auto world = fsdp::comm::world_from_env("nccl");
  EXPECT_EQ(world->backend_name(), "nccl");
  EXPECT_EQ(world->control_backend_name(), fsdp::comm::mpi_available() ? "mpi" : "gloo");
  EXPECT_EQ(world->size(), 1);
  at::Tensor t = at::full({5}, 2.5, on_cuda(at::kFloat));
  world->all_reduce(t, ReduceOp::kSum)->wait();
  expect_equal(t, at::full({5}, 2.5), "all_reduce over a world of one");
}

}  // namespace
