#include "fsdp/comm/process_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "collective_check.h"
#include "fsdp/common/check.h"
#include "group_state.h"
#include "issue_order_executor.h"
#include "all_to_all_reductions.h"

namespace fsdp::comm {

ProcessGroupOptions ProcessGroupOptions::from_env() {
  ProcessGroupOptions o;
  if (const char* t = std::getenv("FSDP_COLLECTIVE_TIMEOUT_S"); t && *t) {
    char* end = nullptr;
    const double v = std::strtod(t, &end);
    FSDP_CHECK(end && *end == '\0' && std::isfinite(v) && v > 0, ErrorKind::kInvalidArgument,
               (ErrorContext{-1, "", "ProcessGroupOptions"}),
               expected_actual("FSDP_COLLECTIVE_TIMEOUT_S", "a number of seconds > 0", std::string("'") + t + "'"));
    o.timeout_s = v;
  }
  if (const char* d = std::getenv("FSDP_FLIGHT_RECORDER_DIR"); d && *d) o.flight_recorder_dir = d;
  return o;
}

ProcessGroup::ProcessGroup(std::unique_ptr<Backend> backend, ProcessGroupOptions options, std::string name)
    : ProcessGroup(std::move(backend), nullptr, std::move(options), std::move(name), nullptr) {}

ProcessGroup::ProcessGroup(std::unique_ptr<Backend> data, std::unique_ptr<Backend> control,
                           ProcessGroupOptions options, std::string name)
    : ProcessGroup(std::move(data), std::move(control), std::move(options), std::move(name), nullptr) {}

ProcessGroup::ProcessGroup(std::unique_ptr<Backend> data, std::unique_ptr<Backend> control,
                           ProcessGroupOptions options, std::string name, std::shared_ptr<detail::Family> family)
    : backend_(std::move(data)),
      control_(std::move(control)),
      rank_(backend_ ? backend_->rank() : -1),
      size_(backend_ ? backend_->size() : 0),
      backend_name_(backend_ ? backend_->name() : ""),
      options_(std::move(options)),
      name_(std::move(name)),
      family_(family ? std::move(family)
                     : std::make_shared<detail::Family>(detail::Family{
                           std::make_shared<CommStats>(),
                           std::make_shared<FlightRecorder>(
                               static_cast<size_t>(std::max(1, options_.flight_recorder_entries))),
                           rank_, size_})),
      stats_(family_->stats),
      recorder_(family_->recorder) {
  FSDP_CHECK(backend_ != nullptr, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "ProcessGroup"}),
             "the backend is null");
  FSDP_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, ErrorKind::kInvalidArgument,
             (ErrorContext{rank_, "", "ProcessGroup"}), "invalid backend: rank ", rank_, " of size ", size_);
  host_of_ranks_ = backend_->host_of_ranks();
  FSDP_CHECK(static_cast<int>(host_of_ranks_.size()) == size_, ErrorKind::kInvalidArgument,
             (ErrorContext{rank_, "", "ProcessGroup"}), "invalid backend: ", host_of_ranks_.size(),
             " host entries for ", size_, " ranks");
  num_hosts_ = 1 + *std::max_element(host_of_ranks_.begin(), host_of_ranks_.end());
  ranks_on_my_host_ = static_cast<int>(
      std::count(host_of_ranks_.begin(), host_of_ranks_.end(), host_of_ranks_[static_cast<size_t>(rank_)]));
  FSDP_CHECK(options_.timeout_s > 0 && options_.abort_grace_s >= 0, ErrorKind::kInvalidArgument,
             (ErrorContext{rank_, "", "ProcessGroup"}), "timeout_s must be > 0 and abort_grace_s >= 0, got ",
             options_.timeout_s, " and ", options_.abort_grace_s);
  if (!control_) control_ = backend_->make_control_channel();
  const ErrorContext where{rank_, "", "ProcessGroup"};
  FSDP_CHECK(control_ != nullptr, ErrorKind::kInvalidArgument, where, "the ", backend_name_,
             " backend made a null control channel");
  control_backend_name_ = control_->name();
  FSDP_CHECK(control_->rank() == rank_ && control_->size() == size_, ErrorKind::kInvalidArgument, where,
             expected_actual("control channel's rank and size", str_cat("rank ", rank_, " of ", size_),
                             str_cat("rank ", control_->rank(), " of ", control_->size())),
             " (the ", control_backend_name_, " control channel must span the ", backend_name_,
             " backend's ranks in the same order)");
  FSDP_CHECK(control_->device_type() == c10::DeviceType::CPU || control_->simulated(), ErrorKind::kInvalidArgument,
             where,
             expected_actual("control channel's device", "cpu", c10::DeviceTypeName(control_->device_type(), true)),
             " (the ", control_backend_name_, " backend cannot carry the collective check's CPU bytes)");
  state_ = std::make_unique<detail::GroupState>(*backend_, *control_, options_, name_, family_);
  executor_ = std::make_unique<detail::IssueOrderExecutor>(*state_, /*threaded=*/size_ > 1);
}

ProcessGroup::~ProcessGroup() {
  executor_->stop();  // runs every queued op, joins the communication thread
  // A timed-out collective may still be running inside the transport (MPI cannot cancel it):
  // such a backend is never freed, the job ends by abort (GroupState::on_unrecoverable).
  if (!state_->broken().empty()) {
    (void)backend_.release();
    (void)control_.release();  // the timed-out op may be the collective check on it
  }
  // Otherwise backend_ is destroyed after this body, with no op left that could use it.
}

std::string ProcessGroup::diverged() const { return state_->diverged(); }

void ProcessGroup::refuse(const std::string& why) { state_->refuse(why); }

std::string ProcessGroup::dump_flight_recorder(const std::string& reason) { return state_->dump_flight_recorder(reason); }

std::string ProcessGroup::flight_recorder_note() const { return state_->flight_recorder_note(); }

WorkPtr ProcessGroup::enqueue(const Described& d, std::function<void()> fn, WorkPtr after,
                              std::shared_ptr<MarkerOutcome> marker_outcome, int marker_kind, int marker_ordinal,
                              std::function<void()> before) {
  auto work = std::make_shared<Work>();
  std::unique_lock<std::mutex> lock(issue_mu_);
  const ErrorContext where{rank_, d.tag ? d.tag->unit : "", to_string(d.kind)};
  FSDP_CHECK(!executor_->stopping(), ErrorKind::kState, where, "issued on a process group that is shutting down");
  const std::string broken = state_->broken(), diverged = state_->diverged();
  FSDP_CHECK(broken.empty(), ErrorKind::kTimeout, where, "the group '", name_, "' is unusable since ", broken);
  FSDP_CHECK(diverged.empty(), ErrorKind::kMismatch, where, "the group '", name_, "' refuses every collective: ",
             diverged);
  detail::Op op;
  op.kind = d.kind;
  op.counted = d.logical_bytes >= 0;
  op.bytes = std::max<int64_t>(d.logical_bytes, 0);
  op.seq = next_seq_++;
  op.signature = detail::make_signature(op.seq, d.kind, d.tensor, d.reduce_op, d.root, d.tag, marker_kind, marker_ordinal);
  if (d.tag) {
    op.unit = d.tag->unit;
    op.phase = d.tag->phase;
  }
  CollectiveRecord rec;
  rec.group = name_;
  rec.seq = op.seq;
  rec.kind = d.kind;
  rec.dtype = d.tensor ? dtype_name(d.tensor->scalar_type()) : "";
  rec.numel = op.signature.numel;
  rec.bytes = op.bytes;
  if (d.tag) rec.tag = *d.tag;
  rec.issue_s = now_s();
  op.record_id = recorder_->add(std::move(rec));
  if (op.counted) stats_->record_issue(d.kind, op.bytes, split_by_host(d.kind, op.bytes, size_, ranks_on_my_host_));
  op.fn = std::move(fn);
  op.work = work;
  op.after = std::move(after);
  op.before = std::move(before);
  if (marker_outcome) {
    op.marker_outcome = std::move(marker_outcome);
    op.unit.clear();  // the reason travels in the signature's unit field only
  }
  if (size_ == 1) {
    // No peer to wait for: run inline. Every op of this group runs inline, so issue order is kept.
    lock.unlock();
    executor_->run(op);
    return work;
  }
  executor_->push(std::move(op));  // under issue_mu_: the queue's order is the sequence order
  return work;
}

namespace {

ErrorContext at_op(int rank, const char* op) { return ErrorContext{rank, "", op}; }

// Copy for a group of one rank, where every collective is the identity.
void copy_if_distinct(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.data_ptr() != src.data_ptr() && dst.numel() > 0) dst.view(-1).copy_(src.view(-1));
}

bool is_reduction(CollectiveKind kind) {
  return kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllReduce;
}

}  // namespace

bool ProcessGroup::reduces_in_float32(CollectiveKind kind, c10::ScalarType dtype) const {
  return is_reduction(kind) && detail::is_low_precision(dtype) && !backend_->supports(kind, dtype) &&
         backend_->supports(CollectiveKind::kAllToAll, dtype) && backend_->supports(CollectiveKind::kAllGather, dtype);
}

void ProcessGroup::check_tensor(const char* op, CollectiveKind kind, const char* what, const at::Tensor& t) const {
  const ErrorContext where = at_op(rank_, op);
  FSDP_CHECK(t.defined(), ErrorKind::kInvalidArgument, where, what, " is undefined");
  FSDP_CHECK(t.is_contiguous(), ErrorKind::kInvalidArgument, where, what,
             " must be contiguous (sizes ", t.sizes(), ", strides ", t.strides(), ")");
  const auto runs = [&](c10::ScalarType d) { return backend_->supports(kind, d) || reduces_in_float32(kind, d); };
  if (!runs(t.scalar_type())) {
    std::string supported;
    for (const auto d : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong, at::kByte,
                         at::kChar, at::kShort, at::kBool}) {
      if (runs(d)) supported += (supported.empty() ? "" : ", ") + dtype_name(d);
    }
    FSDP_CHECK(false, ErrorKind::kInvalidArgument, where, "unsupported dtype ", dtype_name(t.scalar_type()), " for ",
               what, ": the ", backend_name_, " backend's ", to_string(kind), " takes ",
               supported.empty() ? std::string("none") : supported,
               t.scalar_type() == at::kByte && is_reduction(kind) ? " (uint8 tensors cannot be reduced)" : "");
  }
  const bool simulated_host = backend_->simulated() && t.device().is_cpu();  // its own rule
  FSDP_CHECK(t.device().type() == backend_->device_type() || simulated_host, ErrorKind::kInvalidArgument, where,
             expected_actual(std::string(what) + " device", c10::DeviceTypeName(backend_->device_type(), true),
                             t.device()),
             " (the ", backend_name_, " backend)");
  FSDP_CHECK(t.numel() <= backend_->max_elements(), ErrorKind::kInvalidArgument, where, what, " has ",
             t.numel(), " elements, more than the ", backend_name_, " backend's limit of ",
             backend_->max_elements(), " per collective; split the FSDP unit into smaller units");
}

WorkPtr ProcessGroup::all_gather_into_tensor(at::Tensor output, at::Tensor input, const OpTag& tag, WorkPtr after,
                                             std::function<void()> before) {
  const char* op = "all_gather_into_tensor";
  check_tensor(op, CollectiveKind::kAllGather, "input", input);
  check_tensor(op, CollectiveKind::kAllGather, "output", output);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), ErrorKind::kInvalidArgument, at_op(rank_, op),
             "dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(output.numel() == input.numel() * size_, ErrorKind::kInvalidArgument, at_op(rank_, op),
             "output must hold world size x input numel = ", size_, " x ", input.numel(), " = ",
             input.numel() * size_, " elements, got ", output.numel());
  const Described d{CollectiveKind::kAllGather, &input, ReduceOp::kSum, -1, &tag,
                    static_cast<int64_t>(output.nbytes())};
  if (size_ == 1) return enqueue(d, [output, input] { copy_if_distinct(output, input); }, after, nullptr, -1, 0, before);
  return enqueue(d, [this, output, input] { backend_->all_gather(output, input); }, after, nullptr, -1, 0, before);
}

WorkPtr ProcessGroup::reduce_scatter_tensor(at::Tensor output, at::Tensor input, ReduceOp rop,
                                            const OpTag& tag, WorkPtr after, std::function<void()> before) {
  const char* op = "reduce_scatter_tensor";
  check_tensor(op, CollectiveKind::kReduceScatter, "input", input);
  check_tensor(op, CollectiveKind::kReduceScatter, "output", output);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), ErrorKind::kInvalidArgument, at_op(rank_, op),
             "dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(input.numel() == output.numel() * size_, ErrorKind::kInvalidArgument, at_op(rank_, op),
             "input must hold world size x output numel = ", size_, " x ", output.numel(), " = ",
             output.numel() * size_, " elements, got ", input.numel());
  const Described d{CollectiveKind::kReduceScatter, &input, rop, -1, &tag, static_cast<int64_t>(input.nbytes())};
  if (size_ == 1) {  // every reduction over one rank is the identity
    return enqueue(d, [output, input] { copy_if_distinct(output, input); }, after, nullptr, -1, 0, before);
  }
  if (reduces_in_float32(d.kind, input.scalar_type())) {
    return enqueue(
        d, [this, output, input, rop] { detail::reduce_scatter_by_all_to_all(*backend_, output, input, rop); }, after,
        nullptr, -1, 0, before);
  }
  return enqueue(
      d,
      [this, output, input, rop] {
        detail::reduce_with(*backend_, output, rop, [&](ReduceOp o) { backend_->reduce_scatter(output, input, o); });
      },
      after, nullptr, -1, 0, before);
}

WorkPtr ProcessGroup::all_reduce(at::Tensor tensor, ReduceOp rop, const OpTag& tag, WorkPtr after,
                                 std::function<void()> before) {
  const char* op = "all_reduce";
  check_tensor(op, CollectiveKind::kAllReduce, "tensor", tensor);
  const Described d{CollectiveKind::kAllReduce, &tensor, rop, -1, &tag, static_cast<int64_t>(tensor.nbytes())};
  if (size_ == 1) {  // the identity: reads nothing, so it waits for `after` only to run `before`
    return before ? enqueue(d, [] {}, std::move(after), nullptr, -1, 0, std::move(before)) : enqueue(d, [] {});
  }
  std::function<void()> fn;
  if (reduces_in_float32(d.kind, tensor.scalar_type())) {
    fn = [this, tensor, rop] { detail::all_reduce_low_precision(*backend_, tensor, rop); };
  } else {
    fn = [this, tensor, rop] {
      detail::reduce_with(*backend_, tensor, rop, [&](ReduceOp o) { backend_->all_reduce(tensor, o); });
    };
  }
  return enqueue(d, std::move(fn), std::move(after), nullptr, -1, 0, std::move(before));
}

WorkPtr ProcessGroup::all_to_all(at::Tensor output, at::Tensor input, const OpTag& tag, WorkPtr after,
                                 std::function<void()> before) {
  const char* op = "all_to_all";
  check_tensor(op, CollectiveKind::kAllToAll, "input", input);
  check_tensor(op, CollectiveKind::kAllToAll, "output", output);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), ErrorKind::kInvalidArgument, at_op(rank_, op),
             "dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(output.numel() == input.numel() && input.numel() % size_ == 0,
             ErrorKind::kInvalidArgument, at_op(rank_, op), "input and output must hold world size ",
             size_, " x n elements each, got input ", input.numel(), " and output ", output.numel());
  const Described d{CollectiveKind::kAllToAll, &input, ReduceOp::kSum, -1, &tag, static_cast<int64_t>(input.nbytes())};
  if (size_ == 1) return enqueue(d, [output, input] { copy_if_distinct(output, input); }, after, nullptr, -1, 0, before);
  return enqueue(d, [this, output, input] { backend_->all_to_all(output, input); }, after, nullptr, -1, 0, before);
}

WorkPtr ProcessGroup::broadcast(at::Tensor tensor, int root, const OpTag& tag) {
  check_tensor("broadcast", CollectiveKind::kBroadcast, "tensor", tensor);
  FSDP_CHECK(root >= 0 && root < size_, ErrorKind::kInvalidArgument, at_op(rank_, "broadcast"),
             "root ", root, " outside the group of size ", size_);
  const Described d{CollectiveKind::kBroadcast, &tensor, ReduceOp::kSum, root, &tag,
                    static_cast<int64_t>(tensor.nbytes())};
  if (size_ == 1) return enqueue(d, [] {});
  return enqueue(d, [this, tensor, root] { backend_->broadcast(tensor, root); });
}

WorkPtr ProcessGroup::barrier(const OpTag& tag, bool counted) {
  const Described d{CollectiveKind::kBarrier, nullptr, ReduceOp::kSum, -1, &tag, counted ? 0 : -1};
  if (size_ == 1) return enqueue(d, [] {});
  return enqueue(d, [this] { backend_->barrier(); });
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  std::unique_ptr<Backend> sub, sub_control;
  // Not counted in stats (logical bytes -1): it is set-up, not training traffic. The control
  // channel splits in step, on the same ranks, so that the new group's check spans them.
  const OpTag tag{"", "split"};
  const Described d{CollectiveKind::kBarrier, nullptr, ReduceOp::kSum, -1, &tag, -1};
  enqueue(d, [this, color, key, &sub, &sub_control] {
    sub = backend_->split(color, key);
    sub_control = control_->split(color, key);
  })->wait();
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(sub), std::move(sub_control), options_,
                                                        str_cat(name_, "/split(", color, ")"), family_));
}

std::unique_ptr<Backend> ProcessGroup::make_control_backend() {
  std::unique_ptr<Backend> made;
  const OpTag tag{"", "make_control_backend"};
  const Described d{CollectiveKind::kBarrier, nullptr, ReduceOp::kSum, -1, &tag, -1};  // set-up: not counted
  enqueue(d, [this, &made] { made = backend_->make_control_channel(); })->wait();
  return made;
}

std::shared_ptr<ProcessGroup> ProcessGroup::split_blocks(int block, bool strided) {
  FSDP_CHECK(block >= 1 && size_ % block == 0, ErrorKind::kInvalidArgument, at_op(rank_, "split_blocks"),
             expected_actual("block", str_cat("a divisor of the group size ", size_), block));
  std::unique_ptr<Backend> sub, sub_control;
  const OpTag tag{"", "split"};
  const Described d{CollectiveKind::kBarrier, nullptr, ReduceOp::kSum, -1, &tag, -1};
  enqueue(d, [this, block, strided, &sub, &sub_control] {
    sub = backend_->split_blocks(block, strided);
    sub_control = control_->split_blocks(block, strided);
  })->wait();
  const int color = strided ? rank_ % block : rank_ / block;
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(sub), std::move(sub_control), options_,
                                                        str_cat(name_, "/split(", color, ")"), family_));
}

c10::DeviceType ProcessGroup::device_type() const { return backend_->device_type(); }

bool ProcessGroup::simulated() const { return backend_->simulated(); }

}  // namespace fsdp::comm
