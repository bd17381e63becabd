#include "fsdp/comm/nccl_backend.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "fsdp/comm/job_channel.h"
#include "fsdp/common/check.h"

namespace fsdp::comm {
namespace {

// [Note: NCCL polling] The thread waits for an op as MpiBackend waits for an MPI request
// ([Note: polling] in mpi_backend.cpp): a burst of back-to-back queries (latency of small ops),
// then one every kPollSleep, and after kLongWait_s one every kIdleSleep, so a rank waiting for a
// late peer leaves its core to the compute thread. Each round queries the completion event of
// the op (cudaEventQuery) and the communicator's asynchronous error (ncclCommGetAsyncError: a
// peer that failed, a network error), and checks the deadline: NCCL cannot cancel one op, so a
// timeout aborts the whole communicator (ncclCommAbort), which also releases the kernels that
// wait for the missing peer.
constexpr int kPollSpins = 50;
constexpr auto kPollSleep = std::chrono::microseconds(20);
constexpr double kLongWait_s = 0.05;
constexpr auto kIdleSleep = std::chrono::milliseconds(1);

[[noreturn]] void throw_collective(int rank, const char* op, const std::string& message) {
  throw Error(ErrorKind::kCollective, ErrorContext{rank, "", op}, message);
}

void check_cuda(cudaError_t code, int rank, const char* op, const char* call) {
  if (code == cudaSuccess) return;
  throw_collective(rank, op, str_cat(call, " failed: ", cudaGetErrorString(code), " (CUDA error ",
                                     static_cast<int>(code), ")"));
}

void check_nccl(ncclResult_t code, ncclComm_t comm, int rank, const char* op, const char* call) {
  if (code == ncclSuccess) return;
  const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw_collective(rank, op, str_cat(call, " failed: ", ncclGetErrorString(code), " (NCCL error ",
                                     static_cast<int>(code), ")", last && *last ? str_cat(": ", last) : ""));
}

// [Note: NCCL non-blocking] Communicators are made non-blocking (ncclConfig_t::blocking = 0): an
// NCCL call returns at once, ncclSuccess or ncclInProgress, and the communicator's state
// (ncclCommGetAsyncError) stays ncclInProgress until the call's work has been handed to the device
// (for init and split: until the communicator is ready; since NCCL 2.22 a collective may first
// connect to its peers, which waits for them on the host). Every such wait is polled against a
// deadline, so no NCCL call can hold the communication thread past the collective timeout, and
// the completion event of an op is recorded only once its kernels are on the stream.
void check_started(ncclResult_t code, ncclComm_t comm, int rank, const char* op, const char* call) {
  if (code != ncclInProgress) check_nccl(code, comm, rank, op, call);
}

ncclConfig_t non_blocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Sleeps between two polls of a wait that began at t0 ([Note: NCCL polling]).
void poll_pause(int spins, double t0) {
  if (spins < kPollSpins) return;
  if (now_s() - t0 > kLongWait_s) {
    std::this_thread::sleep_for(kIdleSleep);
  } else {
    std::this_thread::sleep_for(kPollSleep);
  }
}

// Polls `comm`'s state until it leaves ncclInProgress; an error or the deadline throws (the caller
// aborts the communicator).
void wait_not_in_progress(ncclComm_t comm, int rank, const char* op, double deadline_s) {
  const double t0 = now_s();
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclInProgress;
    check_nccl(ncclCommGetAsyncError(comm, &state), comm, rank, op, "ncclCommGetAsyncError");
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) check_nccl(state, comm, rank, op, "the communicator");
    if (now_s() > deadline_s) {
      throw Error(ErrorKind::kTimeout, ErrorContext{rank, "", op},
                  str_cat("NCCL did not get ready after ", now_s() - t0,
                          " s (deadline reached: a peer missing or late); the communicator was aborted"));
    }
    poll_pause(spins, t0);
  }
}

ncclDataType_t nccl_type(const at::Tensor& t, int rank, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    default: break;
  }
  throw Error(ErrorKind::kUnsupported, ErrorContext{rank, "", op},
              str_cat("no NCCL datatype for ", dtype_name(t.scalar_type())));
}

ncclRedOp_t nccl_op(ReduceOp op, int rank, const char* name) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kAvg: break;
  }
  throw Error(ErrorKind::kUnsupported, ErrorContext{rank, "", name},
              "kAvg reaches the NCCL backend only as kSum (ProcessGroup divides)");
}

}  // namespace

NcclBackend::NcclBackend(ProcessGroup& bootstrap, int device_index)
    : device_(device_index), rank_(bootstrap.rank()), size_(bootstrap.size()),
      host_of_ranks_(bootstrap.host_of_ranks()) {
  const char* op = "nccl_init";
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), rank_, op, "cudaGetDeviceCount");
  // Every rank learns whether every rank can use its device before any of them waits for NCCL:
  // one rank's refusal ends the construction on all of them at once, not at the timeout.
  const bool usable = device_index >= 0 && device_index < count;
  at::Tensor refused = at::full({1}, usable ? 0 : 1, at::kInt);
  bootstrap.all_reduce(refused, ReduceOp::kMax, OpTag{"", "nccl_init"})->wait();
  FSDP_CHECK(usable, ErrorKind::kInvalidArgument, (ErrorContext{rank_, "", op}), "CUDA device ", device_index,
             " requested, but this process sees ", count, " device(s) (CUDA_VISIBLE_DEVICES); give each rank a "
             "device in [0, ", count, ")");
  FSDP_CHECK(refused.item<int>() == 0, ErrorKind::kInvalidArgument, (ErrorContext{rank_, "", op}),
             "another rank could not use the CUDA device it asked for (its own error names it); no NCCL "
             "communicator was made");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), nullptr, rank_, op, "ncclGetUniqueId");
  at::Tensor bytes = at::empty({static_cast<int64_t>(sizeof(id))}, at::kByte);  // CPU
  std::memcpy(bytes.data_ptr(), &id, sizeof(id));
  bootstrap.broadcast(bytes, 0, OpTag{"", "nccl_init"})->wait();
  std::memcpy(&id, bytes.data_ptr(), sizeof(id));
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));  // the device NCCL binds to
  ncclConfig_t config = non_blocking_config();
  check_started(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), nullptr, rank_, op,
                "ncclCommInitRankConfig");
  try {
    wait_not_in_progress(comm_, rank_, op, now_s() + bootstrap.options().timeout_s);
    init_stream_and_events();
  } catch (...) {
    release_after_failed_init();
    throw;
  }
}

NcclBackend::NcclBackend(ncclComm* comm, int device_index, std::vector<int> host_of_ranks)
    : comm_(comm), device_(device_index), host_of_ranks_(std::move(host_of_ranks)) {
  try {
    init_stream_and_events();
  } catch (...) {
    release_after_failed_init();
    throw;
  }
}

void NcclBackend::release_after_failed_init() {
  // A constructor that throws runs no destructor: the communicator is aborted (it may be half
  // made), the events and stream made so far destroyed.
  if (comm_) abort_comm();
  if (done_) cudaEventDestroy(done_);
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
  done_ = ready_ = nullptr;
  stream_ = nullptr;
}

void NcclBackend::init_stream_and_events() {
  const char* op = "nccl_init";
  check_nccl(ncclCommUserRank(comm_, &rank_), comm_, rank_, op, "ncclCommUserRank");
  check_nccl(ncclCommCount(comm_, &size_), comm_, rank_, op, "ncclCommCount");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), rank_, op, "cudaStreamCreateWithFlags");
  check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), rank_, op, "cudaEventCreateWithFlags");
  check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), rank_, op, "cudaEventCreateWithFlags");
}

NcclBackend::~NcclBackend() {
  // Errors here cannot be reported (a destructor): the group has drained its ops before.
  if (comm_ && !aborted_.load()) ncclCommDestroy(comm_);
  if (done_) cudaEventDestroy(done_);
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
}

int64_t NcclBackend::max_elements() const { return std::numeric_limits<int64_t>::max(); }

bool NcclBackend::supports(CollectiveKind kind, c10::ScalarType dtype) const {
  const bool low_precision = dtype == c10::kBFloat16 || dtype == c10::kHalf;
  if ((kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllReduce) && low_precision) return true;
  return Backend::supports(kind, dtype);
}

void NcclBackend::check_usable(const char* op) const {
  if (aborted_.load()) {
    throw_collective(rank_, op, "communicator aborted (an earlier op timed out or failed, or the job is aborting)");
  }
}

void NcclBackend::check_on_device(const char* op, const at::Tensor& t) const {
  FSDP_CHECK(t.is_cuda() && t.device().index() == device_, ErrorKind::kInvalidArgument, (ErrorContext{rank_, "", op}),
             "tensor on ", t.device(), ", expected cuda:", device_, " (the NCCL communicator's device)");
}

bool NcclBackend::abort_comm() {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (aborted_.load()) return false;
  aborted_.store(true);
  ncclCommAbort(comm_);  // its own failure leaves nothing to do: the communicator is given up
  return true;
}

template <typename Queue>
void NcclBackend::run(const char* op, Queue&& queue) {
  check_usable(op);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  try {
    cudaStream_t caller = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    check_cuda(cudaEventRecord(ready_, caller), rank_, op, "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), rank_, op, "cudaStreamWaitEvent");
    {
      // Under the abort lock: abort_job (any thread) cannot free the communicator during a call,
      // and the calls return at once ([Note: NCCL non-blocking]).
      std::lock_guard<std::mutex> lock(abort_mu_);
      check_usable(op);
      queue();
    }
    wait_enqueued(op);
    check_cuda(cudaEventRecord(done_, stream_), rank_, op, "cudaEventRecord");
    wait_done(op);
  } catch (const Error& e) {
    // A failed call or query leaves the peers halfway through the op: the communicator is given
    // up (a timeout has aborted it already), so that no later op pairs with the wrong one.
    if (e.kind() == ErrorKind::kCollective) abort_comm();
    throw;
  }
}

void NcclBackend::wait_enqueued(const char* op) {
  const double t0 = now_s();
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclInProgress;
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      check_usable(op);
      check_nccl(ncclCommGetAsyncError(comm_, &state), comm_, rank_, op, "ncclCommGetAsyncError");
    }
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) check_nccl(state, comm_, rank_, op, "the communicator");
    if (now_s() > deadline_s()) {
      abort_comm();
      throw Error(ErrorKind::kTimeout, ErrorContext{rank_, "", op},
                  str_cat("NCCL op on cuda:", device_, " not handed to the device after ", now_s() - t0,
                          " s (deadline reached: a peer missing or late); the communicator was aborted "
                          "(ncclCommAbort)"));
    }
    poll_pause(spins, t0);
  }
}

void NcclBackend::wait_done(const char* op) {
  const double t0 = now_s();
  for (int spins = 0;; ++spins) {
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) check_cuda(q, rank_, op, "cudaEventQuery");
    ncclResult_t async = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      check_usable(op);
      check_nccl(ncclCommGetAsyncError(comm_, &async), comm_, rank_, op, "ncclCommGetAsyncError");
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string last = ncclGetLastError(comm_);
      abort_comm();
      throw_collective(rank_, op, str_cat("the communicator failed: ", ncclGetErrorString(async), " (NCCL error ",
                                          static_cast<int>(async), ")", last.empty() ? "" : ": " + last,
                                          "; communicator aborted"));
    }
    if (spins < kPollSpins) continue;
    const double t = now_s();
    if (t > deadline_s()) {
      abort_comm();
      throw Error(ErrorKind::kTimeout, ErrorContext{rank_, "", op},
                  str_cat("NCCL op on cuda:", device_, " not complete after ", t - t0,
                          " s (deadline reached); the communicator was aborted (ncclCommAbort)"));
    }
    std::this_thread::sleep_for(t - t0 > kLongWait_s ? std::chrono::duration_cast<std::chrono::microseconds>(kIdleSleep)
                                                     : kPollSleep);
  }
}

void NcclBackend::all_gather(const at::Tensor& output, const at::Tensor& input) {
  const char* op = "ncclAllGather";
  check_on_device(op, input);
  check_on_device(op, output);
  run(op, [&] {
    check_started(ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                             nccl_type(input, rank_, op), comm_, stream_),
               comm_, rank_, op, op);
  });
}

void NcclBackend::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp rop) {
  const char* op = "ncclReduceScatter";
  check_on_device(op, input);
  check_on_device(op, output);
  run(op, [&] {
    check_started(ncclReduceScatter(input.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                                 nccl_type(input, rank_, op), nccl_op(rop, rank_, op), comm_, stream_),
               comm_, rank_, op, op);
  });
}

void NcclBackend::all_reduce(const at::Tensor& tensor, ReduceOp rop) {
  const char* op = "ncclAllReduce";
  check_on_device(op, tensor);
  run(op, [&] {
    check_started(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                             nccl_type(tensor, rank_, op), nccl_op(rop, rank_, op), comm_, stream_),
               comm_, rank_, op, op);
  });
}

void NcclBackend::all_to_all(const at::Tensor& output, const at::Tensor& input) {
  const char* op = "all_to_all (ncclSend/ncclRecv)";
  check_on_device(op, input);
  check_on_device(op, output);
  const size_t n = static_cast<size_t>(input.numel() / size_);
  const size_t block_bytes = n * input.element_size();
  const ncclDataType_t type = nccl_type(input, rank_, op);
  auto* in = static_cast<const char*>(input.data_ptr());
  auto* out = static_cast<char*>(output.data_ptr());
  run(op, [&] {
    check_nccl(ncclGroupStart(), comm_, rank_, op, "ncclGroupStart");
    ncclResult_t rc = ncclSuccess;
    for (int peer = 0; peer < size_ && (rc == ncclSuccess || rc == ncclInProgress); ++peer) {
      rc = ncclSend(in + peer * block_bytes, n, type, peer, comm_, stream_);
      if (rc == ncclSuccess || rc == ncclInProgress) rc = ncclRecv(out + peer * block_bytes, n, type, peer, comm_, stream_);
    }
    const ncclResult_t end = ncclGroupEnd();  // closes the group even when a call inside failed
    check_started(rc, comm_, rank_, op, "ncclSend/ncclRecv");
    check_started(end, comm_, rank_, op, "ncclGroupEnd");
  });
}

void NcclBackend::broadcast(const at::Tensor& tensor, int root) {
  const char* op = "ncclBroadcast";
  check_on_device(op, tensor);
  run(op, [&] {
    check_started(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                             nccl_type(tensor, rank_, op), root, comm_, stream_),
               comm_, rank_, op, op);
  });
}

void NcclBackend::barrier() {
  const char* op = "barrier (ncclAllReduce)";
  check_usable(op);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const at::Tensor one = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
  run(op, [&] {
    check_started(ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_, stream_), comm_, rank_,
               op, op);
  });
}

std::unique_ptr<Backend> NcclBackend::split(int color, int key) {
  const char* op = "ncclCommSplit";
  check_usable(op);
  FSDP_CHECK(color >= 0, ErrorKind::kInvalidArgument, (ErrorContext{rank_, "", op}), "color ", color,
             " < 0: every rank joins a new group (NCCL_SPLIT_NOCOLOR is not offered)");
  // Every rank's (color, key), to know the new group's members and so their hosts.
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const auto opts = at::TensorOptions().dtype(at::kLong).device(at::kCUDA, device_);
  at::Tensor mine = at::empty({2}, at::kLong);
  mine.data_ptr<int64_t>()[0] = color;
  mine.data_ptr<int64_t>()[1] = key;
  at::Tensor all = at::empty({2 * size_}, opts);
  all_gather(all, mine.to(opts.device()));
  const at::Tensor host_all = all.cpu();
  const int64_t* ck = host_all.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int>> members;  // (key, parent rank) of my color
  for (int r = 0; r < size_; ++r) {
    if (ck[2 * r] == color) members.emplace_back(ck[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  std::vector<int> hosts, id_of_host(static_cast<size_t>(size_), -1);
  int next = 0;
  for (const auto& m : members) {
    int& id = id_of_host[static_cast<size_t>(host_of_ranks_[static_cast<size_t>(m.second)])];
    if (id < 0) id = next++;
    hosts.push_back(id);
  }
  ncclComm_t sub = nullptr;
  ncclConfig_t config = non_blocking_config();
  try {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      check_usable(op);
      check_started(ncclCommSplit(comm_, color, key, &sub, &config), comm_, rank_, op, op);
    }
    wait_not_in_progress(sub, rank_, op, deadline_s());
  } catch (const Error&) {
    if (sub) ncclCommAbort(sub);
    abort_comm();  // the peers may be halfway through the split
    throw;
  }
  return std::unique_ptr<Backend>(new NcclBackend(sub, device_, std::move(hosts)));
}

void NcclBackend::abort_job(int code) {
  abort_comm();
  job_channel().abort_job(code);
  std::abort();  // abort_job does not return; this keeps the promise if it ever did
}

ProcessGroupPtr nccl_world(const ProcessGroupPtr& bootstrap, int device_index, const ProcessGroupOptions& options) {
  FSDP_CHECK(bootstrap != nullptr, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "nccl_world"}),
             "no bootstrap group: pass the job's CPU world group (mpi_world, gloo_world)");
  FSDP_CHECK(bootstrap->device_type() == c10::DeviceType::CPU && !bootstrap->simulated(), ErrorKind::kInvalidArgument,
             (ErrorContext{bootstrap->rank(), "", "nccl_world"}), "the bootstrap group must be a CPU group, got ",
             bootstrap->backend_name(), " on ", c10::DeviceTypeName(bootstrap->device_type(), true));
  // The control channel first (a collective of the bootstrap's, like the NCCL id's broadcast
  // below): the group's collective check then never touches the device ([Note: control channel]).
  std::unique_ptr<Backend> control = bootstrap->make_control_backend();
  auto data = std::make_unique<NcclBackend>(*bootstrap, device_index);
  return std::make_shared<ProcessGroup>(std::move(data), std::move(control), options, "world");
}

int device_for_rank(const ProcessGroup& group) {
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), group.rank(), "device_for_rank", "cudaGetDeviceCount");
  FSDP_CHECK(count > 0, ErrorKind::kInvalidArgument, (ErrorContext{group.rank(), "", "device_for_rank"}),
             "this process sees no CUDA device (CUDA_VISIBLE_DEVICES, the driver)");
  return local_rank_on_host(group) % count;
}

int local_rank_on_host(const ProcessGroup& group) {
  const auto& hosts = group.host_of_ranks();
  return static_cast<int>(std::count(hosts.begin(), hosts.begin() + group.rank(), group.host()));
}

}  // namespace fsdp::comm
