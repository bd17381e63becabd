#include "fsdp/comm/process_group.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstring>

#include "fsdp/common/check.h"

namespace fsdp::comm {

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "?";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

void CommStats::record_issue(CollectiveKind kind, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = entries_[static_cast<int>(kind)];
  e.calls += 1;
  e.bytes += bytes;
}

void CommStats::record_time(CollectiveKind kind, double start_s, double end_s, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[static_cast<int>(kind)].busy_s += end_s - start_s;
  if (record_events_) events_.push_back(Event{kind, bytes, start_s, end_s});
}

void CommStats::set_record_events(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  record_events_ = on;
}

std::vector<CommStats::Event> CommStats::take_events() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Event> out;
  out.swap(events_);
  return out;
}

double now_s() {
  static const auto epoch = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

CommStats::Snapshot CommStats::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

void CommStats::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_ = Snapshot{};
}

ProcessGroup::ProcessGroup(int rank, int size, std::shared_ptr<CommStats> stats)
    : rank_(rank), size_(size), stats_(stats ? std::move(stats) : std::make_shared<CommStats>()) {
  FSDP_CHECK(size >= 1 && rank >= 0 && rank < size, "[fsdp] invalid process group: rank ", rank,
             " of size ", size);
  worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroup::~ProcessGroup() { shutdown(); }

void ProcessGroup::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void ProcessGroup::worker_loop() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    run_op(op);
  }
}

void ProcessGroup::run_op(Op& op) {
  double t0 = now_s();
  std::exception_ptr err;
  try {
    op.fn();
  } catch (...) {
    err = std::current_exception();
  }
  op.fn = nullptr;  // release the op's tensors before signalling completion
  double t1 = now_s();
  if (op.counted) stats_->record_time(op.kind, t0, t1, op.bytes);
  op.work->finish(err, t1 - t0);
}

WorkPtr ProcessGroup::enqueue(CollectiveKind kind, int64_t logical_bytes, std::function<void()> fn) {
  auto work = std::make_shared<Work>();
  if (logical_bytes >= 0) stats_->record_issue(kind, logical_bytes);
  Op op{kind, logical_bytes >= 0, logical_bytes, std::move(fn), work};
  if (size_ == 1) {
    // A group of one rank has nothing to wait for: run inline (a local copy or nothing). Every op
    // of this group runs inline, so issue order is kept.
    run_op(op);
    return work;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    FSDP_CHECK(!stopping_, "[fsdp rank ", rank_, "] ", to_string(kind),
               " issued on a process group that is shutting down");
    queue_.push_back(std::move(op));
  }
  cv_.notify_one();
  return work;
}

namespace {

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

void check_tensor(int rank, const char* op, const char* what, const at::Tensor& t) {
  FSDP_CHECK(t.defined(), "[fsdp rank ", rank, "] ", op, ": ", what, " is undefined");
  FSDP_CHECK(t.is_contiguous(), "[fsdp rank ", rank, "] ", op, ": ", what,
             " must be contiguous (sizes ", t.sizes(), ", strides ", t.strides(), ")");
  auto d = t.scalar_type();
  bool ok = d == at::kFloat || d == at::kDouble || d == at::kBFloat16 || d == at::kHalf ||
            d == at::kInt || d == at::kLong || d == at::kByte;
  FSDP_CHECK(ok, "[fsdp rank ", rank, "] ", op, ": unsupported dtype ", d, " for ", what);
}

void check_reducible(int rank, const char* op, const at::Tensor& t) {
  FSDP_CHECK(t.scalar_type() != at::kByte, "[fsdp rank ", rank, "] ", op,
             ": uint8 tensors cannot be reduced");
}

// Runs a reduction `fn(out, in)` in a dtype the backends reduce (fp32 for half types), then applies
// the kAvg division and writes back into `out`.
template <typename Fn>
void reduce_widened(const at::Tensor& out, const at::Tensor& in, ReduceOp op, int group_size,
                    Fn&& fn) {
  ReduceOp backend_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  bool widen = is_half(out.scalar_type());
  bool inplace = out.data_ptr() == in.data_ptr();
  at::Tensor w_out = widen ? at::empty(out.sizes(), out.options().dtype(at::kFloat)) : out;
  at::Tensor w_in = widen ? (inplace ? w_out.copy_(in) : in.to(at::kFloat)) : in;
  fn(w_out, w_in, backend_op);
  if (op == ReduceOp::kAvg) {
    if (at::isIntegralType(w_out.scalar_type(), /*includeBool=*/false)) {
      w_out.div_(group_size, "floor");
    } else {
      w_out.div_(group_size);
    }
  }
  if (widen) out.copy_(w_out);
}

}  // namespace

WorkPtr ProcessGroup::all_gather_into_tensor(at::Tensor output, at::Tensor input) {
  const char* op = "all_gather_into_tensor";
  check_tensor(rank_, op, "input", input);
  check_tensor(rank_, op, "output", output);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), "[fsdp rank ", rank_, "] ", op,
             ": dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(output.numel() == input.numel() * size_, "[fsdp rank ", rank_, "] ", op,
             ": output must hold world size x input numel = ", size_, " x ", input.numel(), " = ",
             input.numel() * size_, " elements, got ", output.numel());
  return enqueue(CollectiveKind::kAllGather, output.nbytes(),
                 [this, output, input] { run_all_gather(output, input); });
}

WorkPtr ProcessGroup::reduce_scatter_tensor(at::Tensor output, at::Tensor input, ReduceOp rop) {
  const char* op = "reduce_scatter_tensor";
  check_tensor(rank_, op, "input", input);
  check_tensor(rank_, op, "output", output);
  check_reducible(rank_, op, input);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), "[fsdp rank ", rank_, "] ", op,
             ": dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(input.numel() == output.numel() * size_, "[fsdp rank ", rank_, "] ", op,
             ": input must hold world size x output numel = ", size_, " x ", output.numel(), " = ",
             output.numel() * size_, " elements, got ", input.numel());
  return enqueue(CollectiveKind::kReduceScatter, input.nbytes(), [this, output, input, rop] {
    reduce_widened(output, input, rop, size_,
                   [this](const at::Tensor& o, const at::Tensor& i, ReduceOp bop) {
                     run_reduce_scatter(o, i, bop);
                   });
  });
}

WorkPtr ProcessGroup::all_reduce(at::Tensor tensor, ReduceOp rop) {
  const char* op = "all_reduce";
  check_tensor(rank_, op, "tensor", tensor);
  check_reducible(rank_, op, tensor);
  return enqueue(CollectiveKind::kAllReduce, tensor.nbytes(), [this, tensor, rop] {
    reduce_widened(tensor, tensor, rop, size_,
                   [this](const at::Tensor& o, const at::Tensor&, ReduceOp bop) {
                     run_all_reduce(o, bop);
                   });
  });
}

WorkPtr ProcessGroup::broadcast(at::Tensor tensor, int root) {
  check_tensor(rank_, "broadcast", "tensor", tensor);
  FSDP_CHECK(root >= 0 && root < size_, "[fsdp rank ", rank_, "] broadcast: root ", root,
             " outside the group of size ", size_);
  return enqueue(CollectiveKind::kBroadcast, tensor.nbytes(),
                 [this, tensor, root] { run_broadcast(tensor, root); });
}

WorkPtr ProcessGroup::barrier() {
  return enqueue(CollectiveKind::kBarrier, 0, [this] { run_barrier(); });
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  std::shared_ptr<ProcessGroup> result;
  // Not counted in stats (logical bytes -1): it is set-up, not training traffic.
  auto work = enqueue(CollectiveKind::kBarrier, -1,
                      [this, color, key, &result] { result = run_split(color, key); });
  work->wait();
  return result;
}

std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine) {
  const int n = group.size();
  at::Tensor len = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
  at::Tensor lens = at::empty({n}, at::kLong);
  group.all_gather_into_tensor(lens, len)->wait();
  const int64_t max_len = std::max<int64_t>(lens.max().item<int64_t>(), 1);
  at::Tensor buf = at::zeros({max_len}, at::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::empty({n * max_len}, at::kByte);
  group.all_gather_into_tensor(all, buf)->wait();
  std::vector<std::string> out;
  out.reserve(n);
  const char* base = static_cast<const char*>(all.data_ptr());
  const int64_t* l = lens.data_ptr<int64_t>();
  for (int r = 0; r < n; ++r) out.emplace_back(base + r * max_len, static_cast<size_t>(l[r]));
  return out;
}

}  // namespace fsdp::comm
