// Runs a function on every rank of a threaded in-process world (tier `dist`).
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "fsdp/comm/threaded_backend.h"

namespace fsdp_test {

/// Runs fn(rank, group) on world_size threads; rethrows the first exception after all joined.
inline void run_threaded(int world_size,
                         const std::function<void(int, fsdp::comm::ProcessGroupPtr)>& fn) {
  auto groups = fsdp::comm::threaded_world(world_size);
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mu;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r, groups[r]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace fsdp_test
