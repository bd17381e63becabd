#include "fsdp/comm/threaded_process_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "fsdp/common/check.h"

namespace fsdp::comm {

// Shared state of one threaded world: a cyclic barrier and one slot per rank through which ranks
// publish the tensor of the current op. Every op is: publish, barrier, read others, barrier.
struct ThreadedWorld {
  explicit ThreadedWorld(int n) : size(n), slots(n), colors(n), keys(n) {}

  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu);
    int64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }

  int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<at::Tensor> slots;
  std::vector<int> colors, keys;
  // split results: (color) -> (world, members in new-rank order), filled by the first member.
  std::map<int, std::pair<std::shared_ptr<ThreadedWorld>, std::vector<int>>> split_result;
};

std::vector<std::shared_ptr<ProcessGroup>> ThreadedProcessGroup::create_world(int world_size) {
  FSDP_CHECK(world_size >= 1, "[fsdp] threaded world size must be >= 1, got ", world_size);
  auto world = std::make_shared<ThreadedWorld>(world_size);
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  for (int r = 0; r < world_size; ++r) {
    groups.push_back(std::make_shared<ThreadedProcessGroup>(world, r, nullptr));
  }
  return groups;
}

ThreadedProcessGroup::ThreadedProcessGroup(std::shared_ptr<ThreadedWorld> world, int rank,
                                           std::shared_ptr<CommStats> stats)
    : ProcessGroup(rank, world->size, std::move(stats)), world_(std::move(world)) {}

ThreadedProcessGroup::~ThreadedProcessGroup() { shutdown(); }

namespace {
at::Tensor flat(const at::Tensor& t) { return t.reshape({-1}); }

at::Tensor combine(const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return at::maximum(a, b);
    case ReduceOp::kMin: return at::minimum(a, b);
    default: return a + b;
  }
}
}  // namespace

void ThreadedProcessGroup::run_all_gather(const at::Tensor& output, const at::Tensor& input) {
  auto& w = *world_;
  w.slots[rank()] = input;
  w.arrive_and_wait();
  auto out = flat(output);
  int64_t n = input.numel();
  for (int r = 0; r < w.size; ++r) out.narrow(0, r * n, n).copy_(flat(w.slots[r]));
  w.arrive_and_wait();
  w.slots[rank()].reset();
}

void ThreadedProcessGroup::run_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                              ReduceOp op) {
  auto& w = *world_;
  w.slots[rank()] = input;
  w.arrive_and_wait();
  int64_t n = output.numel();
  // Sum in rank order on every rank, so all ranks see bitwise the same result.
  at::Tensor acc = flat(w.slots[0]).narrow(0, rank() * n, n).clone();
  for (int r = 1; r < w.size; ++r) acc = combine(acc, flat(w.slots[r]).narrow(0, rank() * n, n), op);
  w.arrive_and_wait();
  w.slots[rank()].reset();
  flat(output).copy_(acc);
}

void ThreadedProcessGroup::run_all_reduce(const at::Tensor& tensor, ReduceOp op) {
  auto& w = *world_;
  w.slots[rank()] = tensor;
  w.arrive_and_wait();
  at::Tensor acc = flat(w.slots[0]).clone();
  for (int r = 1; r < w.size; ++r) acc = combine(acc, flat(w.slots[r]), op);
  w.arrive_and_wait();  // everyone has read every input before anyone writes in place
  w.slots[rank()].reset();
  flat(tensor).copy_(acc);
}

void ThreadedProcessGroup::run_broadcast(const at::Tensor& tensor, int root) {
  auto& w = *world_;
  w.slots[rank()] = tensor;
  w.arrive_and_wait();
  if (rank() != root) flat(tensor).copy_(flat(w.slots[root]));
  w.arrive_and_wait();
  w.slots[rank()].reset();
}

void ThreadedProcessGroup::run_barrier() { world_->arrive_and_wait(); }

std::shared_ptr<ProcessGroup> ThreadedProcessGroup::run_split(int color, int key) {
  auto& w = *world_;
  w.colors[rank()] = color;
  w.keys[rank()] = key;
  w.arrive_and_wait();
  std::vector<int> members;
  for (int r = 0; r < w.size; ++r)
    if (w.colors[r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return std::make_tuple(w.keys[a], a) < std::make_tuple(w.keys[b], b);
  });
  if (rank() == *std::min_element(members.begin(), members.end())) {
    std::lock_guard<std::mutex> lock(w.mu);
    w.split_result[color] = {std::make_shared<ThreadedWorld>(static_cast<int>(members.size())),
                             members};
  }
  w.arrive_and_wait();
  std::shared_ptr<ThreadedWorld> sub;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    sub = w.split_result.at(color).first;
  }
  int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  w.arrive_and_wait();
  if (rank() == 0) {
    std::lock_guard<std::mutex> lock(w.mu);
    w.split_result.clear();
  }
  w.arrive_and_wait();
  return std::make_shared<ThreadedProcessGroup>(sub, new_rank, stats_ptr());
}

}  // namespace fsdp::comm
