#include "fsdp/comm/threaded_backend.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "fsdp/common/check.h"

namespace fsdp::comm {
namespace {

// Shared state of one threaded world: a cyclic barrier and one slot per rank through which ranks
// publish the tensor of the current op. Every op is: publish, barrier, read others, barrier.
struct ThreadedWorld {
  ThreadedWorld(int n, std::vector<int> host_ids)
      : size(n), hosts(std::move(host_ids)), slots(n), colors(n), keys(n) {}

  // Waits until every rank arrived; throws fsdp::Error (kTimeout) past deadline_s (the world is
  // unusable afterwards, as an MPI communicator with a timed-out collective).
  void arrive_and_wait(int rank, double deadline_s) {
    std::unique_lock<std::mutex> lock(mu);
    const int64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    while (generation == gen) {
      if (std::isinf(deadline_s)) {
        cv.wait(lock);
        continue;
      }
      const double left = deadline_s - now_s();
      if (left <= 0) {
        throw Error(ErrorKind::kTimeout, ErrorContext{rank, "", "threaded"},
                    "not complete by the deadline (a rank did not arrive)");
      }
      cv.wait_for(lock, std::chrono::duration<double>(std::min(left, 0.05)));
    }
  }

  int size;
  std::vector<int> hosts;  // host of each rank, numbered as Backend::host_of_ranks()
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<at::Tensor> slots;
  std::vector<int> colors, keys;
  // split results: color -> (world, members in new-rank order), filled by the first member.
  std::map<int, std::pair<std::shared_ptr<ThreadedWorld>, std::vector<int>>> split_result;
};

at::Tensor flat(const at::Tensor& t) { return t.reshape({-1}); }

// Renumbers host labels 0, 1, ... in the order of each host's first rank.
std::vector<int> dense_hosts(const std::vector<int>& labels) {
  std::map<int, int> id;
  std::vector<int> out;
  for (int l : labels) out.push_back(id.emplace(l, static_cast<int>(id.size())).first->second);
  return out;
}

at::Tensor combine(const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return at::maximum(a, b);
    case ReduceOp::kMin: return at::minimum(a, b);
    default: return a + b;
  }
}

class ThreadedBackend final : public Backend {
 public:
  ThreadedBackend(std::shared_ptr<ThreadedWorld> world, int rank)
      : world_(std::move(world)), rank_(rank) {}

  std::string name() const override { return "threaded"; }
  int rank() const override { return rank_; }
  int size() const override { return world_->size; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
  int64_t max_elements() const override { return std::numeric_limits<int64_t>::max(); }
  const std::vector<int>& host_of_ranks() const override { return world_->hosts; }

  void all_gather(const at::Tensor& output, const at::Tensor& input) override {
    exchange(input, [&](ThreadedWorld& w) {
      at::Tensor out = flat(output);
      const int64_t n = input.numel();
      for (int r = 0; r < w.size; ++r) out.narrow(0, r * n, n).copy_(flat(w.slots[r]));
    });
  }

  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    at::Tensor acc;
    exchange(input, [&](ThreadedWorld& w) {
      const int64_t n = output.numel();
      // Sum in rank order on every rank.
      acc = flat(w.slots[0]).narrow(0, rank_ * n, n).clone();
      for (int r = 1; r < w.size; ++r) acc = combine(acc, flat(w.slots[r]).narrow(0, rank_ * n, n), op);
    });
    flat(output).copy_(acc);  // after the second barrier: output may alias input
  }

  void all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    at::Tensor acc;
    exchange(tensor, [&](ThreadedWorld& w) {
      acc = flat(w.slots[0]).clone();
      for (int r = 1; r < w.size; ++r) acc = combine(acc, flat(w.slots[r]), op);
    });
    flat(tensor).copy_(acc);  // everyone has read every input before anyone writes in place
  }

  void all_to_all(const at::Tensor& output, const at::Tensor& input) override {
    at::Tensor received = at::empty_like(flat(output));
    exchange(input, [&](ThreadedWorld& w) {
      const int64_t n = input.numel() / w.size;
      for (int q = 0; q < w.size; ++q) received.narrow(0, q * n, n).copy_(flat(w.slots[q]).narrow(0, rank_ * n, n));
    });
    flat(output).copy_(received);
  }

  void broadcast(const at::Tensor& tensor, int root) override {
    at::Tensor copy;
    exchange(tensor, [&](ThreadedWorld& w) {
      if (rank_ != root) copy = flat(w.slots[root]).clone();
    });
    if (copy.defined()) flat(tensor).copy_(copy);
  }

  void barrier() override { wait_all(); }
  [[noreturn]] void abort_job(int) override { std::abort(); }

  std::unique_ptr<Backend> split(int color, int key) override {
    auto& w = *world_;
    w.colors[rank_] = color;
    w.keys[rank_] = key;
    wait_all();
    std::vector<int> members;
    for (int r = 0; r < w.size; ++r) {
      if (w.colors[r] == color) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return std::make_tuple(w.keys[a], a) < std::make_tuple(w.keys[b], b);
    });
    if (rank_ == *std::min_element(members.begin(), members.end())) {
      std::lock_guard<std::mutex> lock(w.mu);
      std::vector<int> member_hosts;
      for (int m : members) member_hosts.push_back(w.hosts[static_cast<size_t>(m)]);
      w.split_result[color] = {
          std::make_shared<ThreadedWorld>(static_cast<int>(members.size()), dense_hosts(member_hosts)), members};
    }
    wait_all();
    std::shared_ptr<ThreadedWorld> sub;
    {
      std::lock_guard<std::mutex> lock(w.mu);
      sub = w.split_result.at(color).first;
    }
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    wait_all();
    if (rank_ == 0) {
      std::lock_guard<std::mutex> lock(w.mu);
      w.split_result.clear();
    }
    wait_all();
    return std::make_unique<ThreadedBackend>(sub, new_rank);
  }

  // A channel of its own over the same ranks: split with one color, ordered by rank.
  std::unique_ptr<Backend> make_control_channel() override { return split(0, rank_); }

 private:
  // Publishes `mine`, waits for every rank, runs read(world) over the published slots, waits again
  // (no rank may change its input before every rank has read it).
  template <typename Read>
  void exchange(const at::Tensor& mine, Read&& read) {
    auto& w = *world_;
    w.slots[rank_] = mine;
    wait_all();
    read(w);
    wait_all();
    w.slots[rank_].reset();
  }
  void wait_all() { world_->arrive_and_wait(rank_, deadline_s()); }

  std::shared_ptr<ThreadedWorld> world_;
  int rank_;
};

}  // namespace

std::vector<ProcessGroupPtr> threaded_world(int world_size, ProcessGroupOptions options) {
  return threaded_world(world_size, world_size, std::move(options));
}

std::vector<std::unique_ptr<Backend>> threaded_backends(int world_size, int ranks_per_host) {
  FSDP_CHECK(world_size >= 1, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "threaded_world"}),
             "world size must be >= 1, got ", world_size);
  FSDP_CHECK(ranks_per_host >= 1 && world_size % ranks_per_host == 0, ErrorKind::kInvalidArgument,
             (ErrorContext{-1, "", "threaded_world"}), "ranks_per_host must be >= 1 and divide the world size ",
             world_size, ", got ", ranks_per_host);
  std::vector<int> hosts;
  for (int r = 0; r < world_size; ++r) hosts.push_back(r / ranks_per_host);
  auto world = std::make_shared<ThreadedWorld>(world_size, std::move(hosts));
  std::vector<std::unique_ptr<Backend>> backends;
  for (int r = 0; r < world_size; ++r) backends.push_back(std::make_unique<ThreadedBackend>(world, r));
  return backends;
}

std::vector<ProcessGroupPtr> threaded_world(int world_size, int ranks_per_host, ProcessGroupOptions options) {
  // Two in-process worlds over the same ranks: the data one, and the groups' control channels
  // (made here: one thread builds every rank's group, so make_control_channel's collective split
  // cannot run).
  auto data = threaded_backends(world_size, ranks_per_host);
  auto control = threaded_backends(world_size, ranks_per_host);
  std::vector<ProcessGroupPtr> groups;
  for (int r = 0; r < world_size; ++r) {
    groups.push_back(std::make_shared<ProcessGroup>(std::move(data[static_cast<size_t>(r)]),
                                                    std::move(control[static_cast<size_t>(r)]), options, "world"));
  }
  return groups;
}

}  // namespace fsdp::comm
