// libFuzzer target: the bytes are a file for import_full (torch.save / export_full format), read
// into fsdp_fuzz::Net on one rank through a temporary file. Every input must end in success or an
// fsdp::Error; anything else (another exception, a crash, a sanitizer report) is a finding.
// Seeds: the fixture's export.pt and dicts written by Python's torch.save (scripts/sanitize.sh).
#include <fstream>

#include "fsdp/checkpoint/export.h"
#include "fuzz_fixture.h"

namespace {

struct State {
  std::string file;
  std::shared_ptr<fsdp_fuzz::NetImpl> net;
};

State& state() {
  static State s = [] {
    State s;
    s.file = fsdp_fuzz::private_dir("import") + "/model.pt";
    s.net = fsdp_fuzz::sharded_net(fsdp_fuzz::group());
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
  std::ofstream(s.file, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    fsdp::checkpoint::import_full(s.file, s.net, fsdp_fuzz::group());
  } catch (const fsdp::Error&) {
  }
  return 0;
}
