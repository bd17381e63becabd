#include "fsdp/comm/gloo_backend.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <limits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "all_to_all_reductions.h"
#include "fsdp/common/check.h"

namespace fsdp::comm {
namespace {

constexpr size_t kHostNameBytes = 256;
// Gloo computes now() + timeout: an infinite deadline becomes one day, far from any overflow.
constexpr double kNoDeadlineTimeout_s = 86400.0;

// Gloo's timeout for an op that must end by deadline_s: rounded up, so that Gloo gives up only
// once the deadline has passed.
std::chrono::milliseconds timeout_until(double deadline_s) {
  const double left_s = std::isfinite(deadline_s) ? deadline_s - now_s() : kNoDeadlineTimeout_s;
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::ceil(left_s * 1000.0)) + 1));
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn reduce_fn(ReduceOp op, int rank) {
  switch (op) {
    case ReduceOp::kSum: return &gloo::sum<T>;
    case ReduceOp::kMax: return &gloo::max<T>;
    case ReduceOp::kMin: return &gloo::min<T>;
    case ReduceOp::kAvg: break;
  }
  throw Error(ErrorKind::kUnsupported, ErrorContext{rank, "", "gloo"}, "kAvg reaches the Gloo backend only as kSum");
}

// Calls f(T{}) with T the C++ type of a reducible dtype (the four Backend reduces).
template <typename F>
void dispatch_reducible(const at::Tensor& t, int rank, F&& f) {
  switch (t.scalar_type()) {
    case at::kFloat: return f(float{});
    case at::kDouble: return f(double{});
    case at::kInt: return f(int32_t{});
    case at::kLong: return f(int64_t{});
    default: break;
  }
  throw Error(ErrorKind::kUnsupported, ErrorContext{rank, "", "gloo"},
              str_cat("no Gloo reduction for ", t.scalar_type(), " (expected float32, float64, int32 or int64)"));
}

uint8_t* bytes_of(const at::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }
size_t nbytes_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

}  // namespace

GlooBackend::GlooBackend(std::shared_ptr<gloo::rendezvous::Store> store,
                         std::shared_ptr<gloo::transport::Device> device, std::string prefix, int rank, int size,
                         double connect_timeout_s)
    : store_(std::move(store)),
      device_(std::move(device)),
      prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      connect_timeout_s_(connect_timeout_s) {
  connect();
  // Hosts: ranks with the same host name, numbered in the order of each host's lowest rank.
  at::Tensor mine = at::zeros({static_cast<int64_t>(kHostNameBytes)}, at::kByte);
  gethostname(reinterpret_cast<char*>(bytes_of(mine)), kHostNameBytes - 1);
  at::Tensor all = at::empty({static_cast<int64_t>(kHostNameBytes) * size_}, at::kByte);
  all_gather(all, mine);
  std::map<std::string, int> id_of_host;
  for (int r = 0; r < size_; ++r) {
    const std::string host(reinterpret_cast<const char*>(bytes_of(all) + kHostNameBytes * r));
    auto it = id_of_host.emplace(host, static_cast<int>(id_of_host.size())).first;
    host_of_ranks_.push_back(it->second);
  }
  set_deadline(std::numeric_limits<double>::infinity());
}

GlooBackend::GlooBackend(std::shared_ptr<gloo::rendezvous::Store> store,
                         std::shared_ptr<gloo::transport::Device> device, std::string prefix, int rank, int size,
                         double connect_timeout_s, std::vector<int> host_of_ranks)
    : store_(std::move(store)),
      device_(std::move(device)),
      prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      connect_timeout_s_(connect_timeout_s),
      host_of_ranks_(std::move(host_of_ranks)) {
  connect();
  set_deadline(std::numeric_limits<double>::infinity());
}

void GlooBackend::connect() {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
  context->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(connect_timeout_s_ * 1000.0)));
  gloo::rendezvous::PrefixStore prefixed(prefix_, *store_);
  set_deadline(now_s() + connect_timeout_s_);
  run("connect", [&] { context->connectFullMesh(prefixed, device_); });
  context_ = context;
}

GlooBackend::~GlooBackend() = default;

int64_t GlooBackend::max_elements() const { return INT_MAX; }

template <typename F>
void GlooBackend::run(const char* op, F&& call) {
  try {
    call();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // Gloo reports a wait past its timeout and a broken connection alike (gloo::IoException), and
    // the store its own way (c10d's errors while connecting): past the deadline it is a timeout,
    // before it a failed transport.
    const bool late = now_s() >= deadline_s();
    throw Error(late ? ErrorKind::kTimeout : ErrorKind::kCollective, ErrorContext{rank_, "", str_cat("gloo ", op)},
                late ? str_cat("not complete by the deadline (", message_of(e), ")") : message_of(e));
  }
}

// Every rank passes the same sizes, so an empty op returns on all of them alike (Gloo's buffers
// need a non-null address).
void GlooBackend::all_gather(const at::Tensor& output, const at::Tensor& input) {
  if (nbytes_of(output) == 0) return;
  gloo::AllgatherOptions opts(context_);
  opts.setInput(bytes_of(input), nbytes_of(input));
  opts.setOutput(bytes_of(output), nbytes_of(output));
  opts.setTimeout(timeout_until(deadline_s()));
  run("allgather", [&] { gloo::allgather(opts); });
}

void GlooBackend::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  if (tensor.numel() == 0) return;
  dispatch_reducible(tensor, rank_, [&](auto zero) {
    using T = decltype(zero);
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(static_cast<T*>(tensor.data_ptr()), static_cast<size_t>(tensor.numel()));
    opts.setReduceFunction(reduce_fn<T>(op, rank_));
    opts.setTimeout(timeout_until(deadline_s()));
    run("allreduce", [&] { gloo::allreduce(opts); });
  });
}

// Gloo has no reduce-scatter of one block per rank (its reduce_scatter.h is an in-place algorithm
// over several inputs of one process): an all-to-all and a local reduction in rank order stand in
// ([Note: all-to-all reductions] in all_to_all_reductions.cpp).
void GlooBackend::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  if (output.numel() == 0) return;
  detail::reduce_scatter_by_all_to_all(*this, output, input, op);
}

void GlooBackend::all_to_all(const at::Tensor& output, const at::Tensor& input) {
  if (nbytes_of(input) == 0) return;
  gloo::AlltoallOptions opts(context_);
  opts.setInput(bytes_of(input), nbytes_of(input));
  opts.setOutput(bytes_of(output), nbytes_of(output));
  opts.setTimeout(timeout_until(deadline_s()));
  run("alltoall", [&] { gloo::alltoall(opts); });
}

void GlooBackend::broadcast(const at::Tensor& tensor, int root) {
  if (nbytes_of(tensor) == 0) return;
  gloo::BroadcastOptions opts(context_);
  opts.setOutput(bytes_of(tensor), nbytes_of(tensor));
  opts.setRoot(root);
  opts.setTimeout(timeout_until(deadline_s()));
  run("broadcast", [&] { gloo::broadcast(opts); });
}

void GlooBackend::barrier() {
  gloo::BarrierOptions opts(context_);
  opts.setTimeout(timeout_until(deadline_s()));
  run("barrier", [&] { gloo::barrier(opts); });
}

std::unique_ptr<Backend> GlooBackend::split(int color, int key) {
  // Every rank's (color, key), then a context per color under a prefix no other split uses.
  at::Tensor mine = at::tensor({static_cast<int64_t>(color), static_cast<int64_t>(key)}, at::kLong);
  at::Tensor all = at::empty({2 * size_}, at::kLong);
  all_gather(all, mine);
  const int64_t* ck = all.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int>> members;  // (key, parent rank) of this color
  for (int r = 0; r < size_; ++r) {
    if (ck[2 * r] == color) members.emplace_back(ck[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  int sub_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank_) sub_rank = static_cast<int>(i);
  }
  const std::string prefix = str_cat(prefix_, "split", splits_++, "/color", color, "/");
  return std::make_unique<GlooBackend>(store_, device_, prefix, sub_rank, static_cast<int>(members.size()),
                                       connect_timeout_s_);
}

std::unique_ptr<Backend> GlooBackend::make_control_channel() {
  // No exchange needed: every rank derives the same prefix from its own count of calls.
  const std::string prefix = str_cat(prefix_, "control", controls_++, "/");
  return std::unique_ptr<Backend>(
      new GlooBackend(store_, device_, prefix, rank_, size_, connect_timeout_s_, host_of_ranks_));
}

void GlooBackend::abort_job(int code) {
  std::fflush(nullptr);
  std::_Exit(code == 0 ? 1 : code);
}

}  // namespace fsdp::comm
