#include "fsdp/comm/mpi_process_group.h"

#include <climits>
#include <cstdlib>

#include "fsdp/common/check.h"

namespace fsdp::comm {
namespace {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

int world_rank_or_minus1() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return -1;
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void check_mpi(int code, const char* what) {
  FSDP_CHECK(code == MPI_SUCCESS, "[fsdp rank ", world_rank_or_minus1(), "] MPI error in ", what,
             ": ", mpi_error_string(code), " (code ", code, ")");
}

MPI_Datatype mpi_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kBFloat16:
    case at::kHalf: return MPI_UINT16_T;  // moved as raw bits; never reduced (see ProcessGroup)
    default: break;
  }
  throw Error(str_cat("[fsdp] no MPI datatype for ", t.scalar_type()));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kAvg: break;
  }
  throw Error("[fsdp] kAvg reaches the MPI backend only as kSum");
}

int count_of(const at::Tensor& t, const char* what) {
  FSDP_CHECK(t.numel() <= INT_MAX, "[fsdp rank ", world_rank_or_minus1(), "] ", what, ": ",
             t.numel(), " elements exceed MPI's int count limit ", INT_MAX,
             "; split the FSDP unit into smaller units");
  return static_cast<int>(t.numel());
}

void check_cpu(const at::Tensor& t, const char* what) {
  FSDP_CHECK(t.device().is_cpu(), "[fsdp rank ", world_rank_or_minus1(), "] ", what,
             ": the MPI backend takes CPU tensors, got ", t.device());
}

}  // namespace

void MpiProcessGroup::init_mpi() {
  int init = 0;
  MPI_Initialized(&init);
  if (init) {
    int provided = 0;
    MPI_Query_thread(&provided);
    FSDP_CHECK(provided == MPI_THREAD_MULTIPLE,
               "[fsdp] MPI was initialised elsewhere with thread level ", provided,
               "; fsdp-cpp needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE, ")");
    return;
  }
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  FSDP_CHECK(provided == MPI_THREAD_MULTIPLE, "[fsdp] MPI library provides thread level ", provided,
             ", fsdp-cpp needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
             "): use an MPI built with thread support (Debian's OpenMPI has it)");
  std::atexit([] {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  });
}

std::shared_ptr<MpiProcessGroup> MpiProcessGroup::world() {
  init_mpi();
  MPI_Comm dup;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  return std::shared_ptr<MpiProcessGroup>(new MpiProcessGroup(dup, nullptr));
}

namespace {
int comm_rank(MPI_Comm c) {
  int r = 0;
  check_mpi(MPI_Comm_rank(c, &r), "MPI_Comm_rank");
  return r;
}
int comm_size(MPI_Comm c) {
  int s = 0;
  check_mpi(MPI_Comm_size(c, &s), "MPI_Comm_size");
  return s;
}
}  // namespace

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, std::shared_ptr<CommStats> stats)
    : ProcessGroup(comm_rank(comm), comm_size(comm), std::move(stats)), comm_(comm) {
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
}

MpiProcessGroup::~MpiProcessGroup() {
  shutdown();
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Comm_free(&comm_);
}

void MpiProcessGroup::run_all_gather(const at::Tensor& output, const at::Tensor& input) {
  check_cpu(input, "all_gather_into_tensor");
  check_cpu(output, "all_gather_into_tensor");
  int n = count_of(input, "all_gather_into_tensor");
  check_mpi(MPI_Allgather(input.data_ptr(), n, mpi_type(input), output.data_ptr(), n,
                          mpi_type(output), comm_),
            "MPI_Allgather");
}

void MpiProcessGroup::run_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                         ReduceOp op) {
  check_cpu(input, "reduce_scatter_tensor");
  check_cpu(output, "reduce_scatter_tensor");
  int n = count_of(output, "reduce_scatter_tensor");
  check_mpi(MPI_Reduce_scatter_block(input.data_ptr(), output.data_ptr(), n, mpi_type(input),
                                     mpi_op(op), comm_),
            "MPI_Reduce_scatter_block");
}

void MpiProcessGroup::run_all_reduce(const at::Tensor& tensor, ReduceOp op) {
  check_cpu(tensor, "all_reduce");
  int n = count_of(tensor, "all_reduce");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), n, mpi_type(tensor), mpi_op(op), comm_),
            "MPI_Allreduce");
}

void MpiProcessGroup::run_broadcast(const at::Tensor& tensor, int root) {
  check_cpu(tensor, "broadcast");
  int n = count_of(tensor, "broadcast");
  check_mpi(MPI_Bcast(tensor.data_ptr(), n, mpi_type(tensor), root, comm_), "MPI_Bcast");
}

void MpiProcessGroup::run_barrier() { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

std::shared_ptr<ProcessGroup> MpiProcessGroup::run_split(int color, int key) {
  MPI_Comm sub;
  check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  return std::shared_ptr<MpiProcessGroup>(new MpiProcessGroup(sub, stats_ptr()));
}

}  // namespace fsdp::comm
