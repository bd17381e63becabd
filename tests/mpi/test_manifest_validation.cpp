// A manifest is input from disk ([Note: manifest validation] in src/checkpoint/manifest_check.cpp):
// an edited field is refused on every rank with kCorruptData naming the field, the model stays
// untouched, and resolving a directory whose latest checkpoint is damaged refuses to fall back
// silently ([Note: no silent fallback] in src/checkpoint/directory.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../common/models.h"
#include "checkpoint/manifest.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/check.h"
#include "mpi_world.h"
#include "shared_dir.h"

namespace ckpt = fsdp::checkpoint;
namespace fs = std::filesystem;
using fsdp_test::SharedDir;
using fsdp_test::world;
using nlohmann::json;

namespace {

struct Outcome {
  bool threw = false;
  fsdp::ErrorKind kind = fsdp::ErrorKind::kInvalidArgument;
  std::string what;
};

Outcome outcome_of(const std::function<void()>& fn) {
  Outcome o;
  try {
    fn();
  } catch (const fsdp::Error& e) {
    o = {true, e.kind(), e.what()};
  }
  return o;
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

// Rank 0 writes j to path, sealed again as a save does ([Note: manifest seal]), or with `seal`
// false as an edit by hand leaves it: the old seal (when j has one) in front of the new body.
// Every rank waits for it.
void write_json_on_rank0(const std::string& path, json j, bool seal = true) {
  const std::string old_seal = j.value("manifest_crc32", std::string());
  j.erase("manifest_crc32");
  std::string text = j.dump(1);
  if (seal) {
    text = ckpt::seal_manifest(text);
  } else if (!old_seal.empty()) {
    text = "{\"manifest_crc32\": \"" + old_seal + "\"," + text.substr(1);
  }
  if (world()->rank() == 0) std::ofstream(path, std::ios::trunc) << text;
  world()->barrier()->wait();
}

std::shared_ptr<fsdp_test::MLPImpl> sharded_mlp(uint64_t seed) {
  torch::manual_seed(seed);
  auto m = fsdp_test::MLP(6, 10, 3).ptr();
  fsdp::fully_shard(m->fc1.ptr(), world());
  fsdp::fully_shard(m->fc2.ptr(), world());
  fsdp::fully_shard(m, world());
  return m;
}

at::Tensor local_rows(const std::shared_ptr<fsdp_test::MLPImpl>& m) {
  std::vector<at::Tensor> parts;
  for (const auto& sp : fsdp::sharded_parameters(m)) parts.push_back(sp.tensor.detach().flatten().clone());
  return at::cat(parts);
}

}  // namespace

// One real checkpoint, then one edited copy of its manifest per case: each is refused before
// anything is written, with the field named; the untouched manifest still loads.
TEST(ManifestValidation, EditedFieldsAreRefusedBeforeAnyWrite) {
  auto g = world();
  SharedDir dir("manifest-edit");
  auto m = sharded_mlp(1);
  auto opt = std::make_unique<torch::optim::AdamW>(fsdp::parameters(m), torch::optim::AdamWOptions(1e-2));
  at::Tensor x = torch::randn({4, 6});
  fsdp::call(m, x).sum().backward();
  opt->step();
  ckpt::TrainState st;
  st.ints["step"] = 1;
  const std::string name = ckpt::save_sharded(dir.path, m, opt.get(), st, g);
  const std::string mpath = dir.sub(name + "/manifest.json");
  const json good = read_json(mpath);
  g->barrier()->wait();  // every rank has read it before rank 0 edits it

  const std::string w1 = "model/fc1.weight";
  using Edit = std::function<void(json&)>;
  const std::vector<std::tuple<std::string, Edit, std::string>> cases = {
      {"chunk_rows -1", [&](json& j) { j["tensors"][w1]["shards"][0]["chunk_rows"] = -1; }, "chunk_rows: expected >= 1, got -1"},
      {"chunk_rows 0", [&](json& j) { j["tensors"][w1]["shards"][0]["chunk_rows"] = 0; }, "chunk_rows: expected >= 1, got 0"},
      {"chunk_rows a float", [&](json& j) { j["tensors"][w1]["shards"][0]["chunk_rows"] = 1.5; }, "field 'chunk_rows' is not an integer"},
      {"rows a string", [&](json& j) { j["tensors"][w1]["shards"][0]["rows"] = "3"; }, "field 'rows' is not an integer"},
      {"offset past the file", [&](json& j) { j["tensors"][w1]["shards"][0]["offset"] = 1 << 30; }, "lie outside its file"},
      {"rows beyond dim 0", [&](json& j) { j["tensors"][w1]["shards"][0]["rows"] = 1000; }, "lie outside its file"},
      {"shape vs row_numel", [&](json& j) { j["tensors"][w1]["row_numel"] = 7; }, "row_numel of shape [10, 6]: expected 6, got 7"},
      {"negative dim", [&](json& j) { j["tensors"][w1]["shape"] = {-10, 6}; }, "a negative dimension"},
      {"world_size", [&](json& j) { j["world_size"] = g->size() + 1; }, "files (one per rank)"},
      {"world_size 0", [&](json& j) { j["world_size"] = 0; }, "world_size: expected in [1,"},
      {"unknown dtype", [&](json& j) { j["tensors"][w1]["dtype"] = "float8"; }, "unknown dtype 'float8'"},
      {"param vs its tensor", [&](json& j) {
         for (auto& p : j["params"]) {
           if (p["name"] == "fc1.weight") p["shape"] = {11, 6};
         }
       }, "its tensor is [10, 6]"},
      {"fingerprint", [&](json& j) { j["fingerprint"] = "0x0"; }, "fingerprint of the parameters listed"},
      {"optimizer step", [&](json& j) { j["optimizer"]["state"]["fc1.weight"]["step"] = -3; }, "step: expected in [0,"},
      {"learning rate", [&](json& j) { j["optimizer"]["group_lrs"][0]["bits"] = "0x7ff8000000000000"; }, "learning rate: expected finite"},
      {"double bits", [&](json& j) { j["optimizer"]["group_lrs"][0]["bits"] = "zz"; }, "16 hex digits"},
      {"negative crc", [&](json& j) { j["files"][0]["crc32"] = -1; }, "not a CRC-32"},
      {"file name", [&](json& j) { j["files"][0]["path"] = "../../etc/passwd"; }, "file name of rank 0"},
  };
  const at::Tensor before = local_rows(m);
  for (const auto& [what, edit, expect] : cases) {
    SCOPED_TRACE(what);
    json bad = good;
    edit(bad);
    write_json_on_rank0(mpath, bad);
    auto fresh = sharded_mlp(2);
    auto fresh_opt = std::make_unique<torch::optim::AdamW>(fsdp::parameters(fresh), torch::optim::AdamWOptions(1e-2));
    const at::Tensor fresh_before = local_rows(fresh);
    Outcome o = outcome_of([&] { ckpt::load_sharded(dir.sub(name), fresh, fresh_opt.get(), nullptr, g); });
    EXPECT_TRUE(o.threw);
    EXPECT_EQ(o.kind, fsdp::ErrorKind::kCorruptData) << o.what;
    EXPECT_NE(o.what.find(expect), std::string::npos) << o.what;
    EXPECT_TRUE(at::equal(local_rows(fresh), fresh_before)) << "a refused load wrote the model";
  }
  // Edits by hand that leave every field valid (AdamW's beta1, the step counter), not sealed again:
  // the seal refuses them, naming the file ([Note: manifest seal]); so does a manifest without it.
  const std::vector<std::tuple<std::string, Edit, bool, std::string>> by_hand = {
      {"beta1 0.5", [&](json& j) { j["optimizer"]["groups"][0]["options"]["beta1"] = {{"value", 0.5}, {"bits", "0x3fe0000000000000"}}; },
       false, "does not match its seal: manifest_crc32 0x"},
      {"step 7", [&](json& j) { j["train_state"]["ints"]["step"] = 7; }, false, "does not match its seal"},
      {"no seal", [&](json& j) { j.erase("manifest_crc32"); }, false, "has no seal"},
  };
  for (const auto& [what, edit, seal, expect] : by_hand) {
    SCOPED_TRACE(what);
    json bad = good;
    edit(bad);
    write_json_on_rank0(mpath, bad, seal);
    auto fresh = sharded_mlp(2);
    auto fresh_opt = std::make_unique<torch::optim::AdamW>(fsdp::parameters(fresh), torch::optim::AdamWOptions(1e-2));
    Outcome o = outcome_of([&] { ckpt::load_sharded(dir.sub(name), fresh, fresh_opt.get(), nullptr, g); });
    EXPECT_EQ(o.kind, fsdp::ErrorKind::kCorruptData) << o.what;
    EXPECT_NE(o.what.find(expect), std::string::npos) << o.what;
    EXPECT_NE(o.what.find(mpath), std::string::npos) << o.what;
  }
  write_json_on_rank0(mpath, good);
  auto fresh = sharded_mlp(3);
  ckpt::load_sharded(dir.sub(name), fresh, nullptr, nullptr, g);
  EXPECT_TRUE(at::equal(local_rows(fresh), before));
}

// Two checkpoints of `m` in dir: step-000000001 and step-000000002 (`latest`).
template <typename Dir, typename Model, typename Group>
void save_steps_1_and_2(const Dir& dir, const Model& m, const Group& g) {
  for (int s = 1; s <= 2; ++s) {
    ckpt::TrainState st;
    st.ints["step"] = s;
    ckpt::save_sharded(dir.path, m, nullptr, st, g);
  }
}

// Resolving dir, with `latest` naming its damaged newest checkpoint and then with no `latest`,
// refuses (kCorruptData) naming newest, `why`, and the older checkpoint to name instead; then
// also_check(outcome) for the test's own assertions. Collective: every rank calls it.
template <typename Dir, typename Group, typename Check>
void expect_refused_with_and_without_latest(const Dir& dir, const Group& g, const std::string& newest,
                                            const std::string& older, const std::string& why, Check&& also_check) {
  for (bool with_latest : {true, false}) {
    SCOPED_TRACE(with_latest ? "latest names the damaged one" : "no latest file");
    if (!with_latest && g->rank() == 0) fs::remove(dir.sub("latest"));
    g->barrier()->wait();
    Outcome o = outcome_of([&] { ckpt::resolve_checkpoint(dir.path); });
    EXPECT_TRUE(o.threw);
    EXPECT_EQ(o.kind, fsdp::ErrorKind::kCorruptData);
    EXPECT_NE(o.what.find(newest), std::string::npos) << o.what;
    EXPECT_NE(o.what.find(why), std::string::npos) << o.what;
    EXPECT_NE(o.what.find("name it explicitly, e.g. '" + older + "'"), std::string::npos) << o.what;
    also_check(o);
    g->barrier()->wait();  // every rank resolved before rank 0 removes `latest` for the next round
  }
}

// The newest checkpoint's manifest is damaged: resolving the directory refuses (naming it, why,
// and the older checkpoint that could be named instead), with `latest` and without it.
TEST(ManifestValidation, DamagedLatestIsRefusedNotSkipped) {
  auto g = world();
  SharedDir dir("manifest-latest");
  auto m = sharded_mlp(4);
  save_steps_1_and_2(dir, m, g);
  const std::string newest = dir.sub("step-000000002"), older = dir.sub("step-000000001");
  json bad = read_json(newest + "/manifest.json");
  g->barrier()->wait();  // every rank has read it before rank 0 edits it
  bad["tensors"]["model/fc1.weight"]["shards"][0]["chunk_rows"] = 0;
  write_json_on_rank0(newest + "/manifest.json", bad);
  expect_refused_with_and_without_latest(dir, g, newest, older, "chunk_rows: expected >= 1, got 0", [&](const Outcome&) {
    Outcome l = outcome_of([&] { ckpt::load_sharded(dir.path, m, nullptr, nullptr, g); });
    EXPECT_TRUE(l.threw && l.kind == fsdp::ErrorKind::kCorruptData) << l.what;
  });
  // Named explicitly, the older checkpoint loads.
  EXPECT_EQ(ckpt::load_sharded(older, m, nullptr, nullptr, g), older);
}

// The same with the newest checkpoint's manifest gone (its shards still there), `latest` naming it
// and then no `latest`:
// a published directory without a manifest is damage, refused, never skipped for the older one.
TEST(ManifestValidation, PublishedCheckpointWithoutManifestIsRefusedNotSkipped) {
  auto g = world();
  SharedDir dir("manifest-gone");
  auto m = sharded_mlp(4);
  save_steps_1_and_2(dir, m, g);
  const std::string newest = dir.sub("step-000000002"), older = dir.sub("step-000000001");
  g->barrier()->wait();
  if (g->rank() == 0) fs::remove(newest + "/manifest.json");
  expect_refused_with_and_without_latest(dir, g, newest, older, "shard files but no manifest.json", [](const Outcome& o) {
    EXPECT_EQ(o.what.find("interrupted"), std::string::npos) << o.what;  // published: damage
  });
  EXPECT_EQ(ckpt::load_sharded(older, m, nullptr, nullptr, g), older);
}
