#include "fsdp/comm/process_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "fsdp/common/check.h"

namespace fsdp::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

ProcessGroup::ProcessGroup(std::unique_ptr<Backend> backend, std::shared_ptr<CommStats> stats)
    : backend_(std::move(backend)),
      rank_(backend_ ? backend_->rank() : -1),
      size_(backend_ ? backend_->size() : 0),
      backend_name_(backend_ ? backend_->name() : ""),
      stats_(stats ? std::move(stats) : std::make_shared<CommStats>()) {
  FSDP_CHECK(backend_ != nullptr, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "ProcessGroup"}),
             "the backend is null");
  FSDP_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, ErrorKind::kInvalidArgument,
             (ErrorContext{rank_, "", "ProcessGroup"}), "invalid backend: rank ", rank_, " of size ", size_);
  if (size_ > 1) worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  // backend_ is destroyed after this body, with no op left that could use it.
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
  const double t0 = now_s();
  std::exception_ptr err;
  try {
    op.fn();
  } catch (...) {
    err = std::current_exception();
  }
  op.fn = nullptr;  // release the op's tensors before signalling completion
  const double t1 = now_s();
  if (op.counted) stats_->record_time(op.kind, t0, t1, op.bytes, op.seq);
  op.work->finish(err, t1 - t0);
}

WorkPtr ProcessGroup::enqueue(CollectiveKind kind, int64_t logical_bytes, std::function<void()> fn) {
  auto work = std::make_shared<Work>();
  std::unique_lock<std::mutex> lock(mu_);
  FSDP_CHECK(!stopping_, ErrorKind::kState, (ErrorContext{rank_, "", to_string(kind)}),
             "issued on a process group that is shutting down");
  if (logical_bytes >= 0) stats_->record_issue(kind, logical_bytes);
  Op op{kind, logical_bytes >= 0, logical_bytes, next_seq_++, std::move(fn), work};
  if (size_ == 1) {
    // Nothing to wait for: run inline. Every op of this group runs inline, so issue order is kept.
    lock.unlock();
    run_op(op);
    return work;
  }
  queue_.push_back(std::move(op));
  lock.unlock();
  cv_.notify_one();
  return work;
}

namespace {

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

ErrorContext at_op(int rank, const char* op) { return ErrorContext{rank, "", op}; }

void check_reducible(int rank, const char* op, const at::Tensor& t) {
  FSDP_CHECK(t.scalar_type() != at::kByte, ErrorKind::kInvalidArgument, at_op(rank, op),
             "uint8 tensors cannot be reduced");
}

// An fp32/fp64/int reduction through the backend: kAvg is a sum followed by a division.
void reduce_with(Backend& b, const at::Tensor& result, ReduceOp op,
                 const std::function<void(ReduceOp)>& run) {
  run(op == ReduceOp::kAvg ? ReduceOp::kSum : op);
  if (op != ReduceOp::kAvg) return;
  if (at::isIntegralType(result.scalar_type(), /*includeBool=*/false)) {
    result.div_(b.size(), "floor");
  } else {
    result.div_(b.size());
  }
}

// Copy for a group of one rank, where every collective is the identity.
void copy_if_distinct(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.data_ptr() != src.data_ptr() && dst.numel() > 0) dst.view(-1).copy_(src.view(-1));
}

}  // namespace

void ProcessGroup::check_tensor(const char* op, const char* what, const at::Tensor& t) const {
  const ErrorContext where = at_op(rank_, op);
  FSDP_CHECK(t.defined(), ErrorKind::kInvalidArgument, where, what, " is undefined");
  FSDP_CHECK(t.is_contiguous(), ErrorKind::kInvalidArgument, where, what,
             " must be contiguous (sizes ", t.sizes(), ", strides ", t.strides(), ")");
  const auto d = t.scalar_type();
  const bool ok = d == at::kFloat || d == at::kDouble || d == at::kBFloat16 || d == at::kHalf ||
                  d == at::kInt || d == at::kLong || d == at::kByte;
  FSDP_CHECK(ok, ErrorKind::kInvalidArgument, where, "unsupported dtype ", d, " for ", what,
             " (float32, float64, bfloat16, float16, int32, int64, uint8)");
  FSDP_CHECK(t.device().type() == backend_->device_type(), ErrorKind::kInvalidArgument, where,
             expected_actual(std::string(what) + " device", c10::DeviceTypeName(backend_->device_type(), true),
                             t.device()),
             " (the ", backend_name_, " backend)");
  FSDP_CHECK(t.numel() <= backend_->max_elements(), ErrorKind::kInvalidArgument, where, what, " has ",
             t.numel(), " elements, more than the ", backend_name_, " backend's limit of ",
             backend_->max_elements(), " per collective; split the FSDP unit into smaller units");
}

WorkPtr ProcessGroup::all_gather_into_tensor(at::Tensor output, at::Tensor input) {
  const char* op = "all_gather_into_tensor";
  check_tensor(op, "input", input);
  check_tensor(op, "output", output);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), ErrorKind::kInvalidArgument, at_op(rank_, op),
             "dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(output.numel() == input.numel() * size_, ErrorKind::kInvalidArgument, at_op(rank_, op),
             "output must hold world size x input numel = ", size_, " x ", input.numel(), " = ",
             input.numel() * size_, " elements, got ", output.numel());
  if (size_ == 1) {
    return enqueue(CollectiveKind::kAllGather, output.nbytes(),
                   [output, input] { copy_if_distinct(output, input); });
  }
  return enqueue(CollectiveKind::kAllGather, output.nbytes(),
                 [this, output, input] { backend_->all_gather(output, input); });
}

WorkPtr ProcessGroup::reduce_scatter_tensor(at::Tensor output, at::Tensor input, ReduceOp rop) {
  const char* op = "reduce_scatter_tensor";
  check_tensor(op, "input", input);
  check_tensor(op, "output", output);
  check_reducible(rank_, op, input);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), ErrorKind::kInvalidArgument, at_op(rank_, op),
             "dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(input.numel() == output.numel() * size_, ErrorKind::kInvalidArgument, at_op(rank_, op),
             "input must hold world size x output numel = ", size_, " x ", output.numel(), " = ",
             output.numel() * size_, " elements, got ", input.numel());
  const int64_t bytes = input.nbytes();
  if (size_ == 1) {  // every reduction over one rank is the identity
    return enqueue(CollectiveKind::kReduceScatter, bytes,
                   [output, input] { copy_if_distinct(output, input); });
  }
  if (is_half(input.scalar_type())) {
    return enqueue(CollectiveKind::kReduceScatter, bytes,
                   [this, output, input, rop] { reduce_scatter_low_precision(output, input, rop); });
  }
  return enqueue(CollectiveKind::kReduceScatter, bytes, [this, output, input, rop] {
    reduce_with(*backend_, output, rop, [&](ReduceOp o) { backend_->reduce_scatter(output, input, o); });
  });
}

WorkPtr ProcessGroup::all_reduce(at::Tensor tensor, ReduceOp rop) {
  const char* op = "all_reduce";
  check_tensor(op, "tensor", tensor);
  check_reducible(rank_, op, tensor);
  if (size_ == 1) return enqueue(CollectiveKind::kAllReduce, tensor.nbytes(), [] {});
  if (is_half(tensor.scalar_type())) {
    return enqueue(CollectiveKind::kAllReduce, tensor.nbytes(),
                   [this, tensor, rop] { all_reduce_low_precision(tensor, rop); });
  }
  return enqueue(CollectiveKind::kAllReduce, tensor.nbytes(), [this, tensor, rop] {
    reduce_with(*backend_, tensor, rop, [&](ReduceOp o) { backend_->all_reduce(tensor, o); });
  });
}

WorkPtr ProcessGroup::all_to_all(at::Tensor output, at::Tensor input) {
  const char* op = "all_to_all";
  check_tensor(op, "input", input);
  check_tensor(op, "output", output);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), ErrorKind::kInvalidArgument, at_op(rank_, op),
             "dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(output.numel() == input.numel() && input.numel() % size_ == 0,
             ErrorKind::kInvalidArgument, at_op(rank_, op), "input and output must hold world size ",
             size_, " x n elements each, got input ", input.numel(), " and output ", output.numel());
  if (size_ == 1) {
    return enqueue(CollectiveKind::kAllToAll, input.nbytes(),
                   [output, input] { copy_if_distinct(output, input); });
  }
  return enqueue(CollectiveKind::kAllToAll, input.nbytes(),
                 [this, output, input] { backend_->all_to_all(output, input); });
}

WorkPtr ProcessGroup::broadcast(at::Tensor tensor, int root) {
  check_tensor("broadcast", "tensor", tensor);
  FSDP_CHECK(root >= 0 && root < size_, ErrorKind::kInvalidArgument, at_op(rank_, "broadcast"),
             "root ", root, " outside the group of size ", size_);
  if (size_ == 1) return enqueue(CollectiveKind::kBroadcast, tensor.nbytes(), [] {});
  return enqueue(CollectiveKind::kBroadcast, tensor.nbytes(),
                 [this, tensor, root] { backend_->broadcast(tensor, root); });
}

WorkPtr ProcessGroup::barrier() {
  if (size_ == 1) return enqueue(CollectiveKind::kBarrier, 0, [] {});
  return enqueue(CollectiveKind::kBarrier, 0, [this] { backend_->barrier(); });
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  std::unique_ptr<Backend> sub;
  // Not counted in stats (logical bytes -1): it is set-up, not training traffic.
  enqueue(CollectiveKind::kBarrier, -1, [this, color, key, &sub] { sub = backend_->split(color, key); })
      ->wait();
  return std::make_shared<ProcessGroup>(std::move(sub), stats_);
}

// [Note: low-precision reductions] A bf16/fp16 reduce-scatter sends each block in its own dtype to
// the rank that owns it (one all-to-all: the (N-1)/N x input bytes of a ring reduce-scatter), and
// the owner adds the N blocks in float32 in rank order, rounding once. Widening to float32 before
// the collective would double the bytes on the wire; reducing in bf16 would round N-1 times.
void ProcessGroup::reduce_scatter_low_precision(const at::Tensor& output, const at::Tensor& input,
                                                ReduceOp op) {
  at::NoGradGuard no_grad;
  const int64_t n = output.numel();
  at::Tensor blocks = at::empty({size_ * n}, input.options());
  backend_->all_to_all(blocks, input);
  at::Tensor parts = blocks.view({size_, n}).to(at::kFloat);  // row q: rank q's block for me
  at::Tensor acc = parts[0].clone();
  for (int q = 1; q < size_; ++q) {
    switch (op) {
      case ReduceOp::kMax: at::maximum_out(acc, acc, parts[q]); break;
      case ReduceOp::kMin: at::minimum_out(acc, acc, parts[q]); break;
      default: acc.add_(parts[q]); break;
    }
  }
  if (op == ReduceOp::kAvg) acc.div_(size_);
  output.view(-1).copy_(acc);
}

// All-reduce = the reduce-scatter above over blocks padded to a multiple of the group size, then an
// all-gather of the rounded blocks: every rank ends with bitwise the same values.
void ProcessGroup::all_reduce_low_precision(const at::Tensor& tensor, ReduceOp op) {
  at::NoGradGuard no_grad;
  const int64_t m = tensor.numel();
  const int64_t c = (m + size_ - 1) / size_;
  at::Tensor padded = at::zeros({size_ * c}, tensor.options());
  padded.narrow(0, 0, m).copy_(tensor.view(-1));
  at::Tensor mine = at::empty({c}, tensor.options());
  reduce_scatter_low_precision(mine, padded, op);
  backend_->all_gather(padded, mine);
  tensor.view(-1).copy_(padded.narrow(0, 0, m));
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
