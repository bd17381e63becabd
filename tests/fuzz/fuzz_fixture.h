// The fixture of the checkpoint and import fuzz targets: a small model with two units, a buffer
// and AdamW state, sharded over a one-rank threaded group, and the files fuzz_make_seeds writes
// for it (a 2-rank sharded checkpoint and a full export). See docs/testing.md, "Fuzzing".
#pragma once

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/comm/threaded_backend.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp_fuzz {

/// Two linears of awkward sizes (rows do not divide by 2) and a buffer.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 5));
    fc2 = register_module("fc2", torch::nn::Linear(5, 3));
    scale = register_buffer("scale", torch::full({3}, 0.5));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fsdp::call(fc2, torch::relu(fsdp::call(fc1, x))) * scale;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(Net);

inline std::shared_ptr<NetImpl> sharded_net(const fsdp::comm::ProcessGroupPtr& g) {
  torch::manual_seed(7);
  auto net = Net().ptr();
  fsdp::fully_shard(net->fc1.ptr(), g);
  fsdp::fully_shard(net->fc2.ptr(), g);
  fsdp::fully_shard(net, g);
  return net;
}

/// One AdamW step on a fixed batch (every rank of g the same rows): gives the optimizer state.
inline void train_step(const std::shared_ptr<NetImpl>& net, torch::optim::Optimizer& opt) {
  torch::manual_seed(11);
  at::Tensor x = torch::randn({4, 6}), y = torch::randn({4, 3});
  opt.zero_grad();
  torch::mse_loss(net->forward(x), y).backward();
  opt.step();
}

/// $FSDP_FUZZ_SEEDS: the directory fuzz_make_seeds wrote (checkpoint/, export.pt).
inline std::string seeds_dir() {
  const char* d = std::getenv("FSDP_FUZZ_SEEDS");
  if (!d || !std::filesystem::is_directory(std::string(d) + "/checkpoint")) {
    std::fprintf(stderr, "FSDP_FUZZ_SEEDS must name the directory written by fuzz_make_seeds\n");
    std::abort();
  }
  return d;
}

/// A fresh private directory under the system temp directory.
inline std::string private_dir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("fsdp-fuzz-" + tag + "-XXXXXX")).string();
  if (!mkdtemp(tmpl.data())) {
    std::perror("mkdtemp");
    std::abort();
  }
  return tmpl;
}

/// The one-rank world every target loads into (created once per process).
///
/// Its flight recorder keeps one collective, not 2048: the recorder is global state that grows
/// with every collective until it is full, so with the default each input would end with more
/// allocations than frees (the records of its collectives) and libFuzzer would answer every input
/// with a full LeakSanitizer scan of the process (libtorch's heap: ~0.1-0.5 s under ASan). With one
/// entry each record replaces the previous one, what an input leaves behind depends only on the
/// input, and the per-input leak check stays on for real leaks. The readers under test never read
/// the recorder.
inline const fsdp::comm::ProcessGroupPtr& group() {
  static const fsdp::comm::ProcessGroupPtr g = [] {
    fsdp::comm::ProcessGroupOptions o = fsdp::comm::threaded_defaults();
    o.flight_recorder_entries = 1;
    return fsdp::comm::threaded_world(1, o)[0];
  }();
  return g;
}

}  // namespace fsdp_fuzz
