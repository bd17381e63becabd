// Writes the fuzz targets' fixture and seeds into DIR (docs/testing.md, "Fuzzing"):
//   DIR/checkpoint/step-000000001/   a sharded checkpoint of fsdp_fuzz::Net saved by 2 threaded
//                                    ranks (manifest.json, rank-0000{0,1}-of-00002.bin)
//   DIR/export.pt                    export_full of the same model (torch.load format)
//   DIR/token_cache_{16,32}.tok       token caches of the fixture's ids (token_cache_fixture.h),
//                                    uint16 and int32 ids
#include <thread>

#include "fsdp/checkpoint/export.h"
#include "fuzz_fixture.h"
#include "token_cache_fixture.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir);
  auto groups = fsdp::comm::threaded_world(2);
  std::vector<std::thread> ranks;
  std::vector<std::string> errors(2);
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto net = fsdp_fuzz::sharded_net(groups[r]);
        torch::optim::AdamW opt(fsdp::parameters(net), torch::optim::AdamWOptions(1e-2));
        fsdp_fuzz::train_step(net, opt);
        fsdp::checkpoint::TrainState ts;
        ts.ints["step"] = 1;
        ts.doubles["grad_scale"] = 65536.0;
        ts.tensors["rng"] = torch::arange(4, torch::kLong);
        fsdp::checkpoint::save_sharded(dir + "/checkpoint", net, &opt, ts, groups[r]);
        fsdp::checkpoint::export_full(dir + "/export.pt", net, groups[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    if (!errors[r].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, errors[r].c_str());
      return 1;
    }
  }
  for (bool wide : {false, true}) {
    apps::data::write_token_cache(dir + (wide ? "/token_cache_32.tok" : "/token_cache_16.tok"),
                                  fsdp_fuzz::token_cache_key(wide), fsdp_fuzz::token_cache_ids(wide));
  }
  std::printf("fuzz seeds written to %s\n", dir.c_str());
  return 0;
}
