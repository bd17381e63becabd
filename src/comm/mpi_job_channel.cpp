// JobChannel over MPI_COMM_WORLD (no process group communicates on it: they use duplicates).
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "fsdp/comm/job_channel.h"
#include "fsdp/comm/mpi_backend.h"

namespace fsdp::comm {
namespace {

class MpiJobChannel final : public JobChannel {
 public:
  MpiJobChannel() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<int> gather_ints(int mine, double wait_s) override {
    if (size_ <= 1) return {mine};
    std::vector<int> all(static_cast<size_t>(size_), 0);
    MPI_Request request;
    if (MPI_Iallgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD, &request) != MPI_SUCCESS) return {};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    for (;;) {
      int done = 0;
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return {};
      if (done) return all;
      if (std::chrono::steady_clock::now() > deadline) return {};  // an abort cancels the request
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  [[noreturn]] void abort_job(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::abort();  // MPI_Abort does not return
  }

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

void install_mpi_job_channel() { set_job_channel(std::make_shared<MpiJobChannel>()); }

}  // namespace fsdp::comm
