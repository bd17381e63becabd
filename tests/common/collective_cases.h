// Closed-form checks of every ProcessGroup op, shared by the threaded (`dist`) and MPI tiers.
// Rank r contributes values derived from r; the expected results are formulas in N and r.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"

namespace fsdp_test {

using fsdp::comm::ReduceOp;

inline void check_all_gather(fsdp::comm::ProcessGroup& g, at::ScalarType dtype, int64_t n) {
  const int N = g.size(), r = g.rank();
  at::Tensor in = (at::arange(n, at::kDouble) + 1000.0 * r).to(dtype);
  at::Tensor out = at::full({N * n}, -1, at::kDouble).to(dtype);
  g.all_gather_into_tensor(out, in)->wait();
  for (int q = 0; q < N; ++q) {
    at::Tensor expect = (at::arange(n, at::kDouble) + 1000.0 * q).to(dtype);
    EXPECT_TRUE(at::equal(out.narrow(0, q * n, n), expect))
        << "all_gather dtype " << dtype << " n=" << n << " N=" << N << " block " << q;
  }
}

inline void check_reduce_scatter(fsdp::comm::ProcessGroup& g, at::ScalarType dtype, int64_t n,
                                 ReduceOp op) {
  const int N = g.size(), r = g.rank();
  // input[i] = r + i  =>  sum over ranks at global index i = N*i + N(N-1)/2
  at::Tensor in = (at::arange(N * n, at::kDouble) + r).to(dtype);
  at::Tensor out = at::full({n}, -1, at::kDouble).to(dtype);
  g.reduce_scatter_tensor(out, in, op)->wait();
  at::Tensor idx = at::arange(r * n, (r + 1) * n, at::kDouble);
  at::Tensor expect;
  switch (op) {
    case ReduceOp::kSum: expect = idx * N + N * (N - 1) / 2.0; break;
    case ReduceOp::kAvg: expect = idx + (N - 1) / 2.0; break;
    case ReduceOp::kMax: expect = idx + (N - 1); break;
    case ReduceOp::kMin: expect = idx; break;
  }
  if (at::isIntegralType(dtype, false) && op == ReduceOp::kAvg) expect = expect.floor();
  expect = expect.to(dtype).to(at::kDouble);  // exact result rounded once to dtype
  EXPECT_TRUE(at::allclose(out.to(at::kDouble), expect, 0, 0))
      << "reduce_scatter " << fsdp::comm::to_string(op) << " dtype " << dtype << " n=" << n
      << " N=" << N << ": got " << out.to(at::kDouble).slice(0, 0, 4) << " expected "
      << expect.slice(0, 0, 4);
}

inline void check_all_reduce(fsdp::comm::ProcessGroup& g, at::ScalarType dtype, int64_t n,
                             ReduceOp op) {
  const int N = g.size(), r = g.rank();
  at::Tensor t = (at::arange(n, at::kDouble) * (r + 1)).to(dtype);
  g.all_reduce(t, op)->wait();
  at::Tensor i = at::arange(n, at::kDouble);
  at::Tensor expect;
  switch (op) {
    case ReduceOp::kSum: expect = i * (N * (N + 1) / 2.0); break;
    case ReduceOp::kAvg: expect = i * ((N + 1) / 2.0); break;
    case ReduceOp::kMax: expect = i * N; break;
    case ReduceOp::kMin: expect = i; break;
  }
  if (at::isIntegralType(dtype, false) && op == ReduceOp::kAvg) expect = expect.floor();
  expect = expect.to(dtype).to(at::kDouble);
  EXPECT_TRUE(at::allclose(t.to(at::kDouble), expect, 0, 0))
      << "all_reduce " << fsdp::comm::to_string(op) << " dtype " << dtype << " n=" << n
      << " N=" << N;
}

inline void check_broadcast(fsdp::comm::ProcessGroup& g, int root, int64_t n) {
  at::Tensor t = at::full({n}, static_cast<double>(g.rank() * 10 + 1), at::kFloat);
  g.broadcast(t, root)->wait();
  EXPECT_TRUE(at::equal(t, at::full({n}, static_cast<double>(root * 10 + 1), at::kFloat)))
      << "broadcast from root " << root;
}

// fp16 sums are accumulated in fp32: 2 x 40000 overflows fp16 (max 65504) only in the final sum,
// while the average 40000 stays finite.
inline void check_half_precision_reduction(fsdp::comm::ProcessGroup& g) {
  const int N = g.size();
  at::Tensor s = at::full({3}, 40000.0, at::kHalf);
  g.all_reduce(s, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(at::equal(s, at::full({3}, 40000.0, at::kHalf))) << "fp16 avg of 40000s: " << s;
  at::Tensor t = at::full({3}, 40000.0, at::kHalf);
  g.all_reduce(t, ReduceOp::kSum)->wait();
  if (N >= 2) {
    EXPECT_TRUE(at::isinf(t).all().item<bool>()) << "fp16 sum above 65504 must be inf: " << t;
  }
  // bf16: 1 + 2^-9 rounds to 1 in bf16 per element, but an fp32 sum of N copies of 2^-9 added to
  // N keeps it: result = N * (1 + 2^-9) rounded once.
  at::Tensor b = at::full({2}, 1.0 + 1.0 / 128, at::kBFloat16);
  g.all_reduce(b, ReduceOp::kSum)->wait();
  EXPECT_TRUE(at::equal(b, at::full({2}, N * (1.0 + 1.0 / 128), at::kDouble).to(at::kBFloat16)));
}

/// A float32 reduce-scatter sums in rank order 0, 1, ..., N-1 (the CPU backends' contract,
/// [Note: all-to-all reductions]): rank 0 gives 2^24 and every other rank 1, so the rank-order sum
/// in float32 stays 2^24 (2^24 + 1 rounds back to it, each time), while an order that adds the 1s
/// first (a tree that pairs ranks 1 and 2, or a reverse order) keeps them: 2^24 + N - 1 for N >= 3.
inline void check_reduce_scatter_rank_order(fsdp::comm::ProcessGroup& g) {
  const int N = g.size();
  const int64_t n = 5;
  at::Tensor in = at::full({N * n}, g.rank() == 0 ? 16777216.0f : 1.0f, at::kFloat);
  at::Tensor out = at::full({n}, -1.0f, at::kFloat);
  g.reduce_scatter_tensor(out, in, ReduceOp::kSum)->wait();
  float expect = 16777216.0f;
  for (int q = 1; q < N; ++q) expect += 1.0f;  // the fold in rank order, in float32
  EXPECT_TRUE(at::equal(out, at::full({n}, expect, at::kFloat)))
      << "reduce_scatter float32 sum over N=" << N << " is not the rank-order fold " << expect << ": got " << out;
}

/// Runs every closed-form check on group g (collective: all ranks call it).
inline void check_all_collectives(fsdp::comm::ProcessGroup& g) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong}) {
    for (int64_t n : {0, 1, 7, 33}) {
      // half-type inputs stay exact integers (< 256) only for small n
      if ((dtype == at::kBFloat16 || dtype == at::kHalf) && n > 7) continue;
      check_all_gather(g, dtype, n);
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        check_reduce_scatter(g, dtype, n, op);
        check_all_reduce(g, dtype, n, op);
      }
    }
  }
  check_all_gather(g, at::kByte, 5);
  for (int root = 0; root < g.size(); ++root) check_broadcast(g, root, 6);
  check_half_precision_reduction(g);
  check_reduce_scatter_rank_order(g);
  g.barrier()->wait();

  // Ops run in issue order, one at a time, on the communication thread. A chain on one tensor
  // whose result depends on the order and on each op seeing the previous one's output:
  // max (-> N), sum (-> N^2), sum (-> N^3); any other order or overlap gives another value (N >= 2).
  {
    at::Tensor c = at::full({3}, static_cast<double>(g.rank() + 1), at::kDouble);
    auto w1 = g.all_reduce(c, ReduceOp::kMax);
    auto w2 = g.all_reduce(c, ReduceOp::kSum);
    auto w3 = g.all_reduce(c, ReduceOp::kSum);
    w3->wait();
    EXPECT_TRUE(w1->is_completed() && w2->is_completed()) << "an op finished before an earlier one";
    const double n = g.size();
    EXPECT_TRUE(at::equal(c, at::full({3}, n * n * n, at::kDouble)))
        << "issue order: max, sum, sum of rank+1 must give N^3 = " << n * n * n << ", got " << c;
    // The same through two kinds: an all-gather into buf, then an all-reduce of buf.
    at::Tensor in = at::full({2}, static_cast<double>(g.rank()), at::kDouble);
    at::Tensor buf = at::full({2 * g.size()}, -1.0, at::kDouble);
    auto wa = g.all_gather_into_tensor(buf, in);
    auto wb = g.all_reduce(buf, ReduceOp::kSum);
    wb->wait();
    wa->wait();
    at::Tensor expect = at::arange(g.size(), at::kDouble).repeat_interleave(2) * n;
    EXPECT_TRUE(at::equal(buf, expect)) << "all_reduce ran before the all_gather it follows: " << buf;
  }
  // Independent ops: issue many, then wait in reverse.
  std::vector<at::Tensor> ts;
  std::vector<fsdp::comm::WorkPtr> ws;
  for (int k = 0; k < 8; ++k) {
    ts.push_back(at::full({4}, static_cast<double>(k + g.rank()), at::kFloat));
    ws.push_back(g.all_reduce(ts.back(), ReduceOp::kSum));
  }
  for (int k = 7; k >= 0; --k) ws[k]->wait();
  const int N = g.size();
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(ts[k][0].item<float>(), static_cast<float>(k * N + N * (N - 1) / 2));
  }

  // split: even and odd ranks; key reverses the order.
  auto sub = g.split(g.rank() % 2, -g.rank());
  const int expected_size = (N - g.rank() % 2 + 1) / 2;
  EXPECT_EQ(sub->size(), expected_size);
  at::Tensor one = at::ones({1}, at::kFloat);
  sub->all_reduce(one, ReduceOp::kSum)->wait();
  EXPECT_EQ(one.item<float>(), static_cast<float>(expected_size));
  at::Tensor who = at::full({1}, static_cast<double>(g.rank()), at::kLong);
  sub->broadcast(who, 0)->wait();
  // new rank 0 has the largest key order -> largest old rank of its color
  int largest = g.rank() % 2 == 0 ? ((N - 1) / 2) * 2 : ((N - 2) / 2) * 2 + 1;
  EXPECT_EQ(who.item<int64_t>(), largest);
}

/// Bad arguments are rejected on the calling thread, naming the op and the sizes.
inline void check_validation(fsdp::comm::ProcessGroup& g) {
  const int N = g.size();
  try {
    g.all_gather_into_tensor(at::empty({N * 3 + 1}), at::empty({3}));
    ADD_FAILURE() << "all_gather with a wrong output size was accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather_into_tensor"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(N * 3 + 1)), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.reduce_scatter_tensor(at::empty({2}), at::empty({2 * N}, at::kDouble)),
               fsdp::Error);
  EXPECT_THROW(g.all_reduce(at::empty({4, 4}).t()), fsdp::Error);  // not contiguous
  EXPECT_THROW(g.broadcast(at::empty({2}), N), fsdp::Error);
  EXPECT_THROW(g.all_reduce(at::empty({2}, at::kByte)), fsdp::Error);
}

}  // namespace fsdp_test
