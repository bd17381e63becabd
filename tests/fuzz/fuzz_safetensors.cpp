// libFuzzer target: the bytes are a safetensors file (include/fsdp/checkpoint/safetensors.h). It
// is opened (the whole header validated), then every tensor is read whole and by rows (from row 1,
// a range inside the data). Every input must end in success or an fsdp::Error; anything else (a
// crash, a read past the file, a sanitizer report, another exception) is a finding. Seeds: files
// Python's safetensors and transformers' save_pretrained wrote (make_seeds.sh).
#include <fstream>

#include "fsdp/checkpoint/safetensors.h"
#include "fuzz_fixture.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fsdp_fuzz::private_dir("safetensors") + "/model.safetensors";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    fsdp::checkpoint::SafetensorsFile f(path);
    for (const auto& [name, e] : f.tensors()) {
      (void)f.read(name);
      if (!e.shape.empty() && e.shape[0] > 1) (void)f.read_rows(name, 1, e.shape[0] - 1);
    }
  } catch (const fsdp::Error&) {
  }
  return 0;
}
