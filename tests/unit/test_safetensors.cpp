// Tier `unit`: the safetensors reader and writer (include/fsdp/checkpoint/safetensors.h). Files
// written tensor by tensor read back bit-exactly, whole and by rows; a file Python's safetensors
// wrote reads as Python saved it; every malformed header or layout is refused with the file and the
// tensor named, before any data is read.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/common/check.h"

namespace fs = std::filesystem;
using fsdp::checkpoint::SafetensorsCheckpoint;
using fsdp::checkpoint::SafetensorsFile;
using fsdp::checkpoint::SafetensorsWriter;

namespace {

std::string temp_dir(const std::string& tag) {
  std::string tmpl = (fs::temp_directory_path() / ("fsdp-safetensors-" + tag + "-XXXXXX")).string();
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file from a header (JSON text) and `data_bytes` bytes of data.
std::string file_bytes(const std::string& header, size_t data_bytes, uint64_t claimed_len = UINT64_MAX) {
  const uint64_t len = claimed_len == UINT64_MAX ? header.size() : claimed_len;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(len >> (8 * i));
  return out + header + std::string(data_bytes, '\x01');
}

// fn must throw fsdp::Error of `kind` whose message holds every string of `want`.
void expect_refused(const std::function<void()>& fn, fsdp::ErrorKind kind, const std::vector<std::string>& want) {
  try {
    fn();
    ADD_FAILURE() << "accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& w : want) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << w << " in " << e.what();
  }
}

}  // namespace

TEST(Safetensors, WrittenTensorByTensorReadsBackExactlyWholeAndByRows) {
  const std::string dir = temp_dir("roundtrip");
  const std::string path = dir + "/model.safetensors";
  torch::manual_seed(0);
  const std::vector<std::pair<std::string, at::Tensor>> tensors{
      {"h.0.w", at::randn({5, 3})},
      {"h.0.b", at::randn({7}).to(at::kBFloat16)},
      {"h.1.w", at::randn({4, 2, 3}).to(at::kHalf).transpose(0, 1)},  // not contiguous
      {"ids", at::arange(6, at::kLong)},
      {"scale", at::tensor(2.5, at::kDouble)},  // a scalar
      {"empty", at::empty({0, 4})},
  };
  std::vector<SafetensorsWriter::Spec> specs;
  for (const auto& [n, t] : tensors) specs.push_back({n, t.scalar_type(), t.sizes().vec()});
  {
    SafetensorsWriter w(path, specs, {{"format", "pt"}});
    for (const auto& [n, t] : tensors) w.append(n, t);
    EXPECT_FALSE(fs::exists(path)) << "visible before finish()";
    w.finish();
  }
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (const auto& [n, t] : tensors) {
    const at::Tensor back = f.read(n);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << n;
    EXPECT_TRUE(at::equal(back, t.contiguous())) << n;
    if (t.dim() > 0 && t.size(0) > 1) {
      EXPECT_TRUE(at::equal(f.read_rows(n, 1, t.size(0) - 1), t.contiguous().narrow(0, 1, t.size(0) - 1))) << n;
    }
  }
  EXPECT_EQ(f.entry("h.0.w").dtype, "F32");
  EXPECT_EQ(f.entry("h.0.b").dtype, "BF16");
  expect_refused([&] { f.read_rows("h.0.w", 4, 2); }, fsdp::ErrorKind::kInvalidArgument, {"rows [4, 6)", "'h.0.w'"});
  expect_refused([&] { f.read("nope"); }, fsdp::ErrorKind::kInvalidArgument, {"no tensor 'nope'", path});
  // An unfinished writer leaves nothing behind.
  {
    SafetensorsWriter w(dir + "/unfinished.safetensors", specs);
    w.append(tensors[0].first, tensors[0].second);
    expect_refused([&] { w.append("ids", tensors[3].second); }, fsdp::ErrorKind::kInvalidArgument,
                   {"appended 'ids', expected 'h.0.b'"});
  }
  EXPECT_FALSE(fs::exists(dir + "/unfinished.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/unfinished.safetensors.tmp"));
  fs::remove_all(dir);
}

// Python's safetensors (what transformers' save_pretrained uses) writes a file; every tensor reads
// as Python had it (compared through a raw dump of each tensor's bytes Python writes beside it).
TEST(Safetensors, ReadsWhatPythonWrote) {
  if (std::system("python3 -c 'import safetensors.torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3 with safetensors is not installed (scripts/setup.sh installs it)";
  }
  const std::string dir = temp_dir("python");
  const std::string script = dir + "/w.py";
  write_bytes(script,
              "import sys, torch\n"
              "from safetensors.torch import save_file\n"
              "torch.manual_seed(0)\n"
              "t = {'a.weight': torch.randn(6, 4), 'a.bias': torch.randn(6).bfloat16(),\n"
              "     'b': torch.randn(3, 2, 2).half(), 'pos': torch.arange(5), 'one': torch.tensor(1.5)}\n"
              "save_file(t, sys.argv[1] + '/model.safetensors', metadata={'format': 'pt'})\n"
              "for k, v in t.items():\n"
              "    open(sys.argv[1] + '/' + k + '.raw', 'wb').write(v.contiguous().view(torch.uint8).numpy().tobytes()"
              " if v.dim() else v.reshape(1).view(torch.uint8).numpy().tobytes())\n");
  ASSERT_EQ(std::system(("python3 " + script + " " + dir).c_str()), 0);
  SafetensorsCheckpoint ck(dir);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a.bias", "a.weight", "b", "one", "pos"}));
  for (const auto& n : ck.names()) {
    const at::Tensor t = ck.file_of(n).read(n);
    std::ifstream raw(dir + "/" + n + ".raw", std::ios::binary);
    const std::string want((std::istreambuf_iterator<char>(raw)), std::istreambuf_iterator<char>());
    ASSERT_EQ(static_cast<size_t>(t.nbytes()), want.size()) << n;
    EXPECT_EQ(std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()), want) << n;
  }
  EXPECT_EQ(ck.entry("pos").scalar_type, at::kLong);
  EXPECT_EQ(ck.entry("one").shape, std::vector<int64_t>{});
  fs::remove_all(dir);
}

TEST(Safetensors, MalformedFilesAreRefusedNamingTheFileAndTensor) {
  const std::string dir = temp_dir("bad");
  const std::string p = dir + "/x.safetensors";
  auto refused = [&](const std::string& bytes, fsdp::ErrorKind kind, std::vector<std::string> want) {
    write_bytes(p, bytes);
    want.push_back(p);
    expect_refused([&] { SafetensorsFile f(p); }, kind, want);
  };
  using K = fsdp::ErrorKind;
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  refused("abc", K::kCorruptData, {"fewer than the 8"});
  refused(file_bytes(ok, 8, 1000), K::kCorruptData, {"header length"});
  refused(file_bytes(ok, 4), K::kCorruptData, {"tensor 'a'", "not inside the file's 4 data bytes"});
  refused(file_bytes(ok, 12), K::kCorruptData, {"bytes past the last tensor"});
  refused(file_bytes("{not json", 0), K::kCorruptData, {"not valid JSON"});
  refused(file_bytes("[1,2]", 0), K::kCorruptData, {"not an object"});
  refused(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
          K::kCorruptData, {"names 'a' twice"});
  refused(file_bytes(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2), K::kUnsupported,
          {"tensor 'a'", "dtype 'F8_E4M3'"});
  refused(file_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), K::kCorruptData,
          {"tensor 'a'", "needs 12"});
  refused(file_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), K::kCorruptData,
          {"tensor 'a'", "not an integer >= 0"});
  refused(file_bytes(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8), K::kCorruptData,
          {"not an integer >= 0"});
  refused(file_bytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
          K::kCorruptData, {"more elements than any file"});
  refused(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), K::kCorruptData,
          {"not inside"});
  refused(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
          K::kCorruptData, {"tensor 'b'", "overlap those of 'a'"});
  refused(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), K::kCorruptData,
          {"tensor 'a'", "a hole"});
  refused(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8), K::kCorruptData,
          {"tensor 'a'", "exactly dtype, shape and data_offsets"});
  refused(file_bytes(R"({"__metadata__":{"format":1}})", 0), K::kCorruptData, {"__metadata__ value of 'format'"});
  fs::remove(p);
  expect_refused([&] { SafetensorsFile f(p); }, K::kIo, {p});

  // A split checkpoint whose index disagrees with its files.
  const std::string one = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_bytes(dir + "/model-00001-of-00002.safetensors", file_bytes(one, 8));
  write_bytes(dir + "/model-00002-of-00002.safetensors",
              file_bytes(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  auto index = [&](const nlohmann::json& weight_map) {
    write_bytes(dir + "/model.safetensors.index.json", nlohmann::json{{"metadata", {}}, {"weight_map", weight_map}}.dump());
  };
  index({{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}});
  SafetensorsCheckpoint good(dir);
  EXPECT_EQ(good.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(good.file_of("b").path(), dir + "/model-00002-of-00002.safetensors");
  index({{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00003-of-00002.safetensors"}});
  expect_refused([&] { SafetensorsCheckpoint c(dir); }, K::kIo, {"model-00003-of-00002.safetensors", "'b'", "missing"});
  index({{"a", "model-00002-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}});
  expect_refused([&] { SafetensorsCheckpoint c(dir); }, K::kCorruptData, {"tensor 'a' is not in 'model-00002-of-00002"});
  write_bytes(dir + "/model-00001-of-00002.safetensors",
              file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12));
  index({{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}});
  expect_refused([&] { SafetensorsCheckpoint c(dir); }, K::kCorruptData, {"holds tensor 'c'", "does not name"});
  index({{"a", "../etc/passwd"}});
  expect_refused([&] { SafetensorsCheckpoint c(dir); }, K::kCorruptData, {"not a file name"});
  fs::remove_all(dir);
}
