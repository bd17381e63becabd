// NCCL backend of ProcessGroup (CUDA builds only: FSDP_WITH_CUDA), and the world group over it.
// The header names no CUDA or NCCL type, so that a consumer compiles it without their headers.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fsdp/comm/backend.h"
#include "fsdp/comm/process_group.h"

struct ncclComm;     // ncclComm_t is ncclComm*
struct CUstream_st;  // cudaStream_t is CUstream_st*
struct CUevent_st;   // cudaEvent_t is CUevent_st*

namespace fsdp::comm {

/// Backend over one NCCL communicator, on one CUDA device of this process. Tensors live on that
/// device (device_type() kCUDA); counts are size_t, so one tensor may exceed 2^31 elements.
///
/// Every op runs on the calling thread (the group's communication thread) and blocks it until
/// the op is complete on the device: it records an event on the calling thread's current stream
/// of the device (the default stream on the communication thread, where the runtime queued the
/// op's input: the cast, the packed gradients), makes the backend's own NCCL stream wait for that
/// event, queues the NCCL call(s) there on its non-blocking communicator, waits until NCCL has
/// handed them to the device, then polls the stream's completion event and
/// ncclCommGetAsyncError with short sleeps until deadline_s() ([Note: NCCL polling], [Note: NCCL
/// non-blocking] in nccl_backend.cpp): no NCCL call holds the thread past the deadline. The
/// backend's output is written once the call returns. What ProcessGroup queues after it on the
/// communication thread (kAvg's division) goes to the device's legacy default stream, which the
/// caller's default stream is: a caller that reads on another stream orders it after the default
/// stream first. Input queued on another stream than the default one is not covered by the start
/// event either: the caller orders it first (the runtime queues on the default stream).
///
/// Collectives map to NCCL's: all_gather -> ncclAllGather, reduce_scatter -> ncclReduceScatter,
/// all_reduce -> ncclAllReduce (in place), broadcast -> ncclBroadcast (in place), all_to_all ->
/// one ncclSend and one ncclRecv per peer inside ncclGroupStart/End, barrier -> an all-reduce of
/// one float32 element. bfloat16 and float16 are reduced by NCCL itself (supports() is true for
/// them), in their own precision. Every op refuses CPU tensors with fsdp::Error
/// kInvalidArgument: the group's CPU control traffic (the collective check) travels on its
/// control channel (make_control_channel is the default's, which refuses; nccl_world pairs this
/// backend with a CPU backend made by the bootstrap group).
///
/// Errors: an NCCL or CUDA failure (a return code, or an asynchronous error of the communicator)
/// aborts the communicator (ncclCommAbort) and throws fsdp::Error kCollective naming the rank,
/// the op, the NCCL or CUDA call and its error string; an op (split included) not complete by
/// deadline_s() aborts it and throws fsdp::Error kTimeout naming the rank and the op. After
/// either the communicator is gone and every later op throws kCollective ("communicator
/// aborted"). Not thread-safe (the group calls it from one thread), except abort_job, which may
/// run on any thread: every NCCL call and query of the communication thread holds the lock that
/// abort takes.
class NcclBackend final : public Backend {
 public:
  /// Collective over `bootstrap` (a CPU group: MPI or Gloo world, or a threaded group in tests):
  /// every rank says whether `device_index` is a device of its process (an all-reduce, so that
  /// one rank's refusal ends it on all ranks at once), rank 0 makes an ncclUniqueId, which is
  /// broadcast over `bootstrap` (a uint8 CPU tensor of 128 bytes), then every rank joins a
  /// non-blocking communicator on CUDA device `device_index` (made current for it, then the
  /// caller's current device is restored) and waits until it is ready, at most bootstrap's
  /// timeout_s. Rank, size and host_of_ranks() are the bootstrap's. Throws fsdp::Error
  /// kInvalidArgument when device_index is not a device of this process or of another rank's,
  /// kCollective when CUDA or NCCL fails, kTimeout when the communicator is not ready in time,
  /// and what the bootstrap's collectives throw. Every rank must call it in the same order
  /// relative to its other collectives on `bootstrap`.
  NcclBackend(ProcessGroup& bootstrap, int device_index);
  ~NcclBackend() override;
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CUDA; }
  /// INT64_MAX: NCCL counts elements in size_t.
  int64_t max_elements() const override;
  /// The bootstrap group's hosts (for a split group: those of its members).
  const std::vector<int>& host_of_ranks() const override { return host_of_ranks_; }
  /// The default's dtypes, plus bfloat16 and float16 reductions (NCCL reduces them).
  bool supports(CollectiveKind kind, c10::ScalarType dtype) const override;
  /// The CUDA device index the communicator runs on.
  int device_index() const { return device_; }

  void all_gather(const at::Tensor& output, const at::Tensor& input) override;
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  void all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  void all_to_all(const at::Tensor& output, const at::Tensor& input) override;
  void broadcast(const at::Tensor& tensor, int root) override;
  void barrier() override;
  /// Collective: exchanges every rank's (color, key) (an NCCL all-gather, to learn the new
  /// group's hosts), then ncclCommSplit (non-blocking, waited for until deadline_s()). The new
  /// backend runs on the same device. Throws kInvalidArgument for a negative color.
  std::unique_ptr<Backend> split(int color, int key) override;
  /// Aborts the communicator (ncclCommAbort, unless already gone), then ends every process of
  /// the job through this process's job channel (job_channel.h: MPI_Abort under MPI; under
  /// torchrun this process exits and the launcher ends the others). Callable from any thread.
  [[noreturn]] void abort_job(int code) override;

 private:
  NcclBackend(ncclComm* comm, int device_index, std::vector<int> host_of_ranks);
  // The stream and events of a new communicator; rank_ and size_ from it.
  void init_stream_and_events();
  // Records the caller-stream event, makes stream_ wait on it, runs queue() (the NCCL calls on
  // stream_), then waits for stream_ against the deadline. `op` names the op in errors.
  template <typename Queue>
  void run(const char* op, Queue&& queue);
  // Polls the communicator's state until the queued calls are handed to the device, or
  // deadline_s() ([Note: NCCL non-blocking]).
  void wait_enqueued(const char* op);
  // Polls done_ and the communicator's async error until complete or deadline_s().
  void wait_done(const char* op);
  // A constructor's clean-up when it throws: aborts the communicator, frees stream and events.
  void release_after_failed_init();
  // Throws kCollective once the communicator is aborted.
  void check_usable(const char* op) const;
  // ncclCommAbort once (any thread); true if this call aborted it.
  bool abort_comm();
  // Throws kInvalidArgument unless `t` is on this backend's device.
  void check_on_device(const char* op, const at::Tensor& t) const;

  ncclComm* comm_ = nullptr;
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> host_of_ranks_;
  CUstream_st* stream_ = nullptr;  // the NCCL stream (non-blocking w.r.t. the legacy stream)
  CUevent_st* ready_ = nullptr;    // recorded on the caller's stream: the op's input is written
  CUevent_st* done_ = nullptr;     // recorded on stream_ after the NCCL calls
  std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};
};

/// The group of all processes of `bootstrap` over NCCL, named "world": NcclBackend(*bootstrap,
/// device_index) in a ProcessGroup with `options`, its control channel (the collective check) a
/// CPU backend over the same ranks made by `bootstrap` (ProcessGroup::make_control_backend). Collective over `bootstrap` (every rank calls
/// it once, in the same order as its other collectives there; blocks until every rank joined).
/// Keep `bootstrap` alive as the job's CPU group: it made the job channel that abort_job uses.
/// Errors: those of NcclBackend's constructor.
ProcessGroupPtr nccl_world(const ProcessGroupPtr& bootstrap, int device_index,
                           const ProcessGroupOptions& options = ProcessGroupOptions::from_env());

/// This rank's index among the ranks of `group` on its host (0 for the host's lowest rank):
/// the usual CUDA device of the rank when each host runs one rank per device. Not collective.
int local_rank_on_host(const ProcessGroup& group);

/// The CUDA device this rank of `group` uses: local_rank_on_host(group) modulo the devices this
/// process sees (one device per rank on each host, whether every process sees all of the host's
/// devices or, with CUDA_VISIBLE_DEVICES set per rank, only its own). Not collective. Throws
/// fsdp::Error kInvalidArgument when the process sees no device, kCollective when CUDA fails.
int device_for_rank(const ProcessGroup& group);

}  // namespace fsdp::comm
