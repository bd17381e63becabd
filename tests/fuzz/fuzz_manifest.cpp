// libFuzzer target: the bytes are a checkpoint's manifest.json. They go through the seal check,
// then, sealed again, through the manifest parser (manifest_from_json), then, beside the real rank files of the seed checkpoint, through
// load_sharded into fsdp_fuzz::Net on one rank (manifest validation against the model, the
// resharding reads, optimizer state, train state, buffers) and verify_checkpoint. Every input must
// end in success or an fsdp::Error; any other exception, a crash or a sanitizer report is a
// finding. Seeds: the seed checkpoint's manifest.json (scripts/sanitize.sh).
#include <fstream>

#include "checkpoint/manifest.h"
#include "fuzz_fixture.h"

namespace {

struct State {
  std::string ckpt;  // private copy of the seed checkpoint; manifest.json rewritten per input
  std::shared_ptr<fsdp_fuzz::NetImpl> net;
  std::unique_ptr<torch::optim::AdamW> opt;
};

State& state() {
  static State s = [] {
    State s;
    namespace fs = std::filesystem;
    s.ckpt = fsdp_fuzz::private_dir("manifest") + "/step-000000001";
    fs::copy(fsdp_fuzz::seeds_dir() + "/checkpoint/step-000000001", s.ckpt);
    s.net = fsdp_fuzz::sharded_net(fsdp_fuzz::group());
    s.opt = std::make_unique<torch::optim::AdamW>(fsdp::parameters(s.net),
                                                  torch::optim::AdamWOptions(1e-2));
    fsdp_fuzz::train_step(s.net, *s.opt);
    return s;
  }();
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  state();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  State& s = state();
  const std::string raw(reinterpret_cast<const char*>(data), size);
  // The bytes as they are meet the seal check ([Note: manifest seal]); a mutation that leaves the
  // seal intact rarely keeps its CRC, so the body (the bytes after the seal, or all of them) is
  // sealed again and goes on to the parser and the loader.
  try {
    (void)fsdp::checkpoint::unseal_manifest(raw, "fuzzed manifest.json");
  } catch (const fsdp::Error&) {
  }
  const bool has_seal = raw.size() > fsdp::checkpoint::kSealBytes && raw.rfind("{\"manifest_crc32\"", 0) == 0;
  const std::string body = has_seal ? "{" + raw.substr(fsdp::checkpoint::kSealBytes) : raw;
  if (body.empty() || body[0] != '{') return 0;
  const std::string text = fsdp::checkpoint::seal_manifest(body);
  try {
    fsdp::checkpoint::manifest_from_json(text, "fuzzed manifest.json");
  } catch (const fsdp::Error&) {
    return 0;  // rejected by the parser: the loader would reject it the same way
  }
  std::ofstream(s.ckpt + "/manifest.json", std::ios::binary | std::ios::trunc) << text;
  try {
    fsdp::checkpoint::TrainState ts;
    fsdp::checkpoint::load_sharded(s.ckpt, s.net, s.opt.get(), &ts, fsdp_fuzz::group());
  } catch (const fsdp::Error&) {
  }
  try {
    fsdp::checkpoint::verify_checkpoint(s.ckpt);
  } catch (const fsdp::Error&) {
  }
  return 0;
}
