// libFuzzer target: the bytes are rank 0's shard file (rank-00000-of-00002.bin) of the seed
// checkpoint, whose manifest and rank 1 file stay real. Every tensor of the manifest is read
// through the range reader (RankFileReader::read_rows, which checks the size, the header and the
// chunk CRCs), then the whole checkpoint through verify_checkpoint and load_sharded. Every input
// must end in success or an fsdp::Error; anything else is a finding. Seeds: the real rank files.
#include <fstream>

#include "checkpoint/dtypes.h"
#include "checkpoint/manifest.h"
#include "checkpoint/rank_file.h"
#include "fuzz_fixture.h"

namespace {

struct State {
  std::string ckpt;
  fsdp::checkpoint::Manifest manifest;
  std::shared_ptr<fsdp_fuzz::NetImpl> net;
  std::unique_ptr<torch::optim::AdamW> opt;
};

State& state() {
  static State s = [] {
    State s;
    namespace fs = std::filesystem;
    s.ckpt = fsdp_fuzz::private_dir("rank-file") + "/step-000000001";
    fs::copy(fsdp_fuzz::seeds_dir() + "/checkpoint/step-000000001", s.ckpt);
    s.manifest = fsdp::checkpoint::read_manifest(s.ckpt);
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
  namespace ckpt = fsdp::checkpoint;
  State& s = state();
  std::ofstream(s.ckpt + "/" + ckpt::rank_file_name(0, 2), std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    ckpt::RankFileReader files(s.ckpt, s.manifest, fsdp::ErrorContext{0, "", "fuzz_rank_file"});
    for (const auto& [name, e] : s.manifest.tensors) {
      const int64_t rows = ckpt::row_shape(e.shape)[0];
      files.read_rows(name, e, 0, rows);
      if (rows > 1) files.read_rows(name, e, 1, rows - 1);  // a range starting inside a chunk
    }
  } catch (const fsdp::Error&) {
  }
  try {
    ckpt::verify_checkpoint(s.ckpt);
  } catch (const fsdp::Error&) {
  }
  try {
    ckpt::TrainState ts;
    ckpt::load_sharded(s.ckpt, s.net, s.opt.get(), &ts, fsdp_fuzz::group());
  } catch (const fsdp::Error&) {
  }
  return 0;
}
