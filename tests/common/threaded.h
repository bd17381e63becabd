// Runs a function on every rank of a threaded in-process world (tier `dist`).
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>

#include "fsdp/comm/threaded_backend.h"

namespace fsdp_test {

/// Runs fn(rank) on n threads, one per rank; rethrows the first exception after all joined.
inline void on_threads(int n, const std::function<void(int)>& fn) {
  // libtorch makes its default CPU generator at its first use (a module's initialisation): made
  // here, on the calling thread, it is never made by one rank's thread while another reads it,
  // which ThreadSanitizer reports (it cannot see libtorch's own synchronisation).
  (void)at::detail::getDefaultCPUGenerator();
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mu;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

/// Runs fn(rank, group) on world_size threads over a threaded world; rethrows the first
/// exception after all joined.
inline void run_threaded(int world_size,
                         const std::function<void(int, fsdp::comm::ProcessGroupPtr)>& fn) {
  auto groups = fsdp::comm::threaded_world(world_size);
  on_threads(world_size, [&](int r) { fn(r, groups[r]); });
}

}  // namespace fsdp_test
