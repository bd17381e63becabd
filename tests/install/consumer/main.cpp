// Shards a Linear over the launcher's world (mpirun: MPI; torchrun: Gloo) and checks one SGD step
// against the closed form, and a safetensors round trip through <fsdp/fsdp.h> alone.
#include <fsdp/fsdp.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <string>
#include <vector>

int main() {
  auto world = fsdp::comm::world_from_env();
  auto lin = torch::nn::Linear(torch::nn::LinearOptions(3, 2).bias(false)).ptr();
  {
    torch::NoGradGuard g;
    lin->weight.fill_(1.0);
  }
  fsdp::fully_shard(lin, world);
  torch::optim::SGD opt(fsdp::parameters(lin), torch::optim::SGDOptions(0.5));
  at::Tensor x = at::ones({1, 3});
  fsdp::call(lin, x).sum().backward();  // d(sum(Wx))/dW = 1 everywhere
  opt.step();
  auto full = fsdp::full_state_dict(lin);
  bool ok = full.size() == 1 && at::allclose(full[0].second, at::full({2, 3}, 0.5));
  // The safetensors API comes with <fsdp/fsdp.h>: the weight out and back in, reported as filled.
  const std::string dir = "consumer-safetensors";
  fsdp::checkpoint::export_safetensors(dir, lin, world);
  const fsdp::checkpoint::SafetensorsImportReport report = fsdp::checkpoint::import_safetensors(dir, lin, world);
  ok = ok && report.filled == std::vector<std::string>{"weight"} && report.left.empty();
  if (world->rank() == 0) std::printf("consumer: %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
