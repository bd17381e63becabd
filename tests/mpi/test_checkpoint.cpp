// Tier `mpi`: sharded checkpoints (save / resume at the same and at other world sizes, crashes at
// any point of a save, corruption detection) and the full export PyTorch reads. Runs at any N.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/serialize.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "mpi_world.h"
#include "shared_dir.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
namespace fs = std::filesystem;
namespace ckpt = fsdp::checkpoint;
using Stage = ckpt::FaultInjection::Stage;

namespace {

constexpr int64_t kVocab = 37, kDim = 16, kHeads = 2, kLayers = 2, kCtx = 8;
constexpr int64_t kGlobalBatch = 12;  // divisible by every group size 1..4

std::shared_ptr<TinyTransformerImpl> make_transformer(uint64_t seed) {
  torch::manual_seed(seed);
  return TinyTransformer(kVocab, kDim, kHeads, kLayers, kCtx).ptr();
}

std::shared_ptr<TinyTransformerImpl> sharded_transformer(uint64_t seed, fsdp::comm::ProcessGroupPtr g) {
  auto m = make_transformer(seed);
  fsdp::fully_shard_tree(m, g, fsdp::wrap_by_type<TinyBlockImpl>());
  return m;
}

std::pair<at::Tensor, at::Tensor> token_batch(int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  at::Tensor tok = at::randint(0, kVocab, {kGlobalBatch, kCtx + 1}, gen);
  return {tok.narrow(1, 0, kCtx).contiguous(), tok.narrow(1, 1, kCtx).contiguous()};
}

at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& y) {
  return F::cross_entropy(logits.reshape({-1, kVocab}), y.reshape({-1}));
}

/// One training step of the sharded model on this rank's slice of the global batch; returns the
/// global mean loss (identical on every rank of g).
float sharded_step(const std::shared_ptr<TinyTransformerImpl>& m, torch::optim::Optimizer& opt,
                   const fsdp::comm::ProcessGroupPtr& g, int step) {
  auto [x, y] = token_batch(step);
  const int64_t rows = kGlobalBatch / g->size();
  opt.zero_grad();
  at::Tensor loss = lm_loss(fsdp::call(m, x.narrow(0, g->rank() * rows, rows)),
                            y.narrow(0, g->rank() * rows, rows));
  loss.backward();
  opt.step();
  at::Tensor global = loss.detach().clone().reshape({1});
  g->all_reduce(global, fsdp::comm::ReduceOp::kAvg)->wait();
  return global.item<float>();
}

/// Losses of an unsharded single-process run on the whole global batch, steps [0, steps).
std::vector<double> reference_losses(uint64_t seed, int steps, double lr, double wd) {
  auto m = make_transformer(seed);
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(lr).weight_decay(wd));
  std::vector<double> out;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = token_batch(s);
    opt.zero_grad();
    at::Tensor loss = lm_loss(m->forward(x), y);
    loss.backward();
    opt.step();
    out.push_back(loss.item<double>());
  }
  return out;
}

using OptFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

std::map<std::string, at::Tensor> full_dict(const std::shared_ptr<torch::nn::Module>& m) {
  auto v = fsdp::full_state_dict(m);
  return {v.begin(), v.end()};
}

void expect_dicts_equal(const std::map<std::string, at::Tensor>& a,
                        const std::map<std::string, at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [k, t] : a) {
    auto it = b.find(k);
    ASSERT_TRUE(it != b.end()) << what << ": missing " << k;
    EXPECT_TRUE(at::equal(t, it->second)) << what << ": " << k << " differs, " << err_summary(t, it->second);
  }
}

std::string error_text_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fsdp::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

/// Runs a shell command on rank 0; returns its exit code on every rank.
int run_on_rank0(const std::string& cmd) {
  auto g = world();
  at::Tensor rc = at::zeros({1}, at::kLong);
  if (g->rank() == 0) rc[0] = static_cast<int64_t>(std::system(cmd.c_str()));
  g->broadcast(rc, 0)->wait();
  return static_cast<int>(rc.item<int64_t>());
}

bool python_torch_available() {
  static int rc = run_on_rank0("OMP_NUM_THREADS=1 python3 -c 'import torch' >/dev/null 2>&1");
  return rc == 0;
}

}  // namespace

// (a) Save after 3 steps, keep training 3 steps; a fresh model and optimizer (other seed) loaded
// from `latest` continue with bit-identical losses (fp32, same world size), for AdamW, Adam and
// SGD with momentum. TrainState (ints, doubles, RNG) comes back exactly.
TEST(Checkpoint, ResumeSameWorldSizeIsBitExact) {
  auto g = world();
  SharedDir dir("resume");
  std::vector<std::pair<std::string, OptFactory>> opts = {
      {"adamw", adamw(1e-2, 0.1)}, {"adam", adam(1e-2)}, {"sgd", sgd(0.1, 0.9)}};
  for (const auto& [oname, make_opt] : opts) {
    SCOPED_TRACE(oname);
    const std::string d = dir.sub(oname);
    auto m = sharded_transformer(3, g);
    auto opt = make_opt(fsdp::parameters(m));
    for (int s = 0; s < 3; ++s) sharded_step(m, *opt, g, s);
    ckpt::TrainState st;
    st.ints = {{"step", 3}, {"sampler_pos", 3 * kGlobalBatch}, {"growth_tracker", 7}};
    st.doubles = {{"grad_scale", 1024.5}, {"lr", 1.0 / 3.0}};
    st.tensors["rng"] = ckpt::cpu_rng_state();
    std::string name = ckpt::save_sharded(d, m, opt.get(), st, g);
    EXPECT_EQ(name, "step-000000003");
    at::Tensor draws = torch::rand({4});
    std::vector<float> expected;
    for (int s = 3; s < 6; ++s) expected.push_back(sharded_step(m, *opt, g, s));

    auto m2 = sharded_transformer(77, g);
    auto opt2 = make_opt(fsdp::parameters(m2));
    ckpt::TrainState back;
    torch::rand({100});  // move the generator away
    std::string loaded = ckpt::load_sharded(d, m2, opt2.get(), &back, g);
    EXPECT_EQ(fs::path(loaded).filename().string(), name);
    EXPECT_EQ(back.ints, st.ints);
    EXPECT_EQ(back.doubles, st.doubles);
    ASSERT_TRUE(back.tensors.count("rng"));
    ckpt::set_cpu_rng_state(back.tensors["rng"]);
    EXPECT_TRUE(at::equal(torch::rand({4}), draws)) << "RNG state not restored";
    for (int s = 3; s < 6; ++s) {
      float l = sharded_step(m2, *opt2, g, s);
      EXPECT_EQ(l, expected[s - 3]) << "loss at step " << s << " after resume (bitwise)";
    }
    expect_dicts_equal(full_dict(m2), full_dict(m), "params after resumed steps");
  }
}

// (b) Saved on all N ranks after 3 AdamW steps; for every M in 1..N, ranks [0, M) form a group of
// M and ranks [M, N) a group of N-M; each group loads into a fresh model sharded over it and trains
// 3 more steps. Losses match an uninterrupted single-process run on the global batch (rel 1e-5).
TEST(Checkpoint, ReshardAcrossWorldSizes) {
  auto g = world();
  const int N = g->size();
  SharedDir dir("reshard");
  const auto ref = reference_losses(5, 6, 1e-3, 0.1);
  auto m = sharded_transformer(5, g);
  torch::optim::AdamW opt(fsdp::parameters(m), torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
  for (int s = 0; s < 3; ++s) {
    float l = sharded_step(m, opt, g, s);
    EXPECT_NEAR(l, ref[s], 1e-5 * std::abs(ref[s])) << "N=" << N << " step " << s;
  }
  ckpt::TrainState st;
  st.ints["step"] = 3;
  ckpt::save_sharded(dir.path, m, &opt, st, g);
  for (int M = 1; M <= N; ++M) {
    const int color = g->rank() < M ? 0 : 1;
    auto sub = g->split(color, g->rank());
    SCOPED_TRACE("saved on " + std::to_string(N) + " ranks, loaded on " + std::to_string(sub->size()));
    auto m2 = sharded_transformer(1000 + M, sub);
    torch::optim::AdamW opt2(fsdp::parameters(m2), torch::optim::AdamWOptions(0.5));
    ckpt::TrainState back;
    ckpt::load_sharded(dir.path, m2, &opt2, &back, sub);
    EXPECT_EQ(back.ints["step"], 3);
    EXPECT_DOUBLE_EQ(opt2.param_groups()[0].options().get_lr(), 1e-3) << "group lr restored";
    for (int s = 3; s < 6; ++s) {
      float l = sharded_step(m2, opt2, sub, s);
      EXPECT_NEAR(l, ref[s], 1e-5 * std::abs(ref[s])) << "step " << s << " on " << sub->size();
    }
    g->barrier()->wait();
  }
}

// (c) A save that crashes at any point (mid-file on any rank, before the manifest, before the
// rename, before `latest`) throws on every rank, and `latest` still loads the previous checkpoint
// exactly; the torn directory is never used, and the next save cleans it up and succeeds.
TEST(Checkpoint, CrashAtAnyPointKeepsPreviousCheckpoint) {
  auto g = world();
  const int N = g->size();
  SharedDir dir("crash");
  torch::manual_seed(21);
  auto m = MLP(6, 10, 3).ptr();
  fsdp::fully_shard(m->fc1.ptr(), g);
  fsdp::fully_shard(m->fc2.ptr(), g);
  fsdp::fully_shard(m, g);
  auto opt = sgd(0.1, 0.9)(fsdp::parameters(m));
  auto step = [&](int s) {
    auto [x, y] = regression_batch(s, N * 2, 6, 3);
    opt->zero_grad();
    F::mse_loss(fsdp::call(m, x.narrow(0, g->rank() * 2, 2)), y.narrow(0, g->rank() * 2, 2)).backward();
    opt->step();
  };
  step(0);
  ckpt::TrainState st;
  st.ints["step"] = 1;
  ckpt::SaveOptions so;
  so.chunk_bytes = 16;  // many chunks even for this small model
  const std::string first = ckpt::save_sharded(dir.path, m, opt.get(), st, g, so);
  const auto A = full_dict(m);
  step(1);
  st.ints["step"] = 2;

  std::vector<ckpt::FaultInjection> faults;
  std::mt19937 rng(1234);  // same sequence on every rank
  for (int i = 0; i < 6; ++i) {
    ckpt::FaultInjection f;
    f.stage = Stage::kWrite;
    f.rank = static_cast<int>(rng() % N);
    // every rank's file has >= 80 bytes (N=4: header, one row of fc1 and its momentum)
    f.after_bytes = i == 0 ? 0 : (i == 1 ? 10 : static_cast<int64_t>(rng() % 80));
    faults.push_back(f);
  }
  for (Stage s : {Stage::kBeforeManifest, Stage::kBeforeRename, Stage::kBeforeLatest}) {
    ckpt::FaultInjection f;
    f.stage = s;
    faults.push_back(f);
  }
  for (const auto& f : faults) {
    SCOPED_TRACE("fault stage " + std::to_string(static_cast<int>(f.stage)) + " rank " +
                 std::to_string(f.rank) + " after " + std::to_string(f.after_bytes) + " bytes");
    ckpt::SaveOptions bad = so;
    bad.fault = f;
    std::string err = error_text_of([&] { ckpt::save_sharded(dir.path, m, opt.get(), st, g, bad); });
    EXPECT_TRUE(contains(err, "injected fault")) << err;
    EXPECT_EQ(fs::path(ckpt::resolve_checkpoint(dir.path)).filename().string(), first);
    torch::manual_seed(99);
    auto fresh = MLP(6, 10, 3).ptr();
    fsdp::fully_shard(fresh->fc1.ptr(), g);
    fsdp::fully_shard(fresh->fc2.ptr(), g);
    fsdp::fully_shard(fresh, g);
    ckpt::load_sharded(dir.path, fresh, nullptr, nullptr, g);
    expect_dicts_equal(full_dict(fresh), A, "after a crashed save, latest");
    g->barrier()->wait();
  }
  // the next save succeeds (also over the published-but-not-latest step-2) and removes debris
  ckpt::save_sharded(dir.path, m, opt.get(), st, g, so);
  EXPECT_EQ(fs::path(ckpt::resolve_checkpoint(dir.path)).filename().string(), "step-000000002");
  g->barrier()->wait();
  for (const auto& e : fs::directory_iterator(dir.path)) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << "debris " << e.path();
  }
  g->barrier()->wait();  // every rank has listed the folder before rank 0 starts the next save
  ckpt::verify_checkpoint(dir.sub("step-000000002"));
  // an interrupted directory is refused with a clear error, never loaded
  ckpt::SaveOptions bad = so;
  bad.name = "torn";
  bad.fault.stage = Stage::kBeforeManifest;
  EXPECT_THROW(ckpt::save_sharded(dir.path, m, opt.get(), st, g, bad), fsdp::Error);
  std::string err = error_text_of([&] { ckpt::load_sharded(dir.sub(".tmp-torn"), m, nullptr, nullptr, g); });
  EXPECT_TRUE(contains(err, "incomplete checkpoint")) << err;
}

// keep_last_k keeps the newest k complete checkpoints; `latest` names the newest.
TEST(Checkpoint, KeepLastK) {
  auto g = world();
  SharedDir dir("keep");
  torch::manual_seed(4);
  auto m = torch::nn::Linear(5, 7).ptr();
  fsdp::fully_shard(m, g);
  ckpt::SaveOptions so;
  so.keep_last_k = 2;
  for (int s = 1; s <= 4; ++s) {
    ckpt::TrainState st;
    st.ints["step"] = s;
    ckpt::save_sharded(dir.path, m, nullptr, st, g, so);
  }
  auto all = ckpt::list_checkpoints(dir.path);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(fs::path(all[0]).filename().string(), "step-000000003");
  EXPECT_EQ(fs::path(all[1]).filename().string(), "step-000000004");
  EXPECT_EQ(ckpt::resolve_checkpoint(dir.path), all[1]);
}

// (c) Truncated, corrupted or missing files, a missing manifest, another model: every rank throws
// fsdp::Error naming the file / tensor, and the model is untouched (no partial load).
TEST(Checkpoint, CorruptionIsDetectedBeforeAnyWrite) {
  auto g = world();
  const int N = g->size();
  SharedDir dir("corrupt");
  auto build = [&](uint64_t seed, int64_t hidden) {
    torch::manual_seed(seed);
    auto m = MLP(6, hidden, 3).ptr();
    fsdp::fully_shard(m->fc1.ptr(), g);
    fsdp::fully_shard(m->fc2.ptr(), g);
    fsdp::fully_shard(m, g);
    return m;
  };
  auto src = build(1, 10);
  ckpt::SaveOptions so;
  so.chunk_bytes = 32;
  ckpt::save_sharded(dir.sub("good"), src, nullptr, {}, g, so);
  const std::string good = dir.sub("good/step-000000000");
  const std::string rank0 = "rank-00000-of-" + std::string(5 - std::to_string(N).size(), '0') +
                            std::to_string(N) + ".bin";
  auto target = build(2, 10);
  const auto before = full_dict(target);

  struct Case {
    std::string name;
    std::function<void(const std::string&)> damage;  // rank 0, on a copy
    std::vector<std::string> expect;                  // substrings of every rank's error
  };
  std::vector<Case> cases = {
      {"truncated", [&](const std::string& d) { fs::resize_file(fs::path(d) / rank0, fs::file_size(fs::path(d) / rank0) - 5); },
       {"truncated", rank0}},
      {"flipped byte",
       [&](const std::string& d) {
         std::fstream f(fs::path(d) / rank0, std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(-3, std::ios::end);
         char c = 0;
         f.read(&c, 1);
         c = static_cast<char>(c ^ 0x10);
         f.seekp(-3, std::ios::end);
         f.write(&c, 1);
       },
       {"checksum mismatch", rank0}},
      {"missing rank file", [&](const std::string& d) { fs::remove(fs::path(d) / rank0); },
       {"cannot open", rank0}},
      {"missing manifest", [&](const std::string& d) { fs::remove(fs::path(d) / "manifest.json"); },
       {"incomplete checkpoint"}},
      {"garbage manifest",
       [&](const std::string& d) { std::ofstream(fs::path(d) / "manifest.json") << "{\"format\": 3"; },
       {"has no seal", "manifest.json"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string copy = dir.sub("case-" + std::to_string(&c - cases.data()));
    if (g->rank() == 0) {
      fs::copy(good, copy, fs::copy_options::recursive);
      c.damage(copy);
    }
    g->barrier()->wait();
    std::string err = error_text_of([&] { ckpt::load_sharded(copy, target, nullptr, nullptr, g); });
    for (const auto& s : c.expect) EXPECT_TRUE(contains(err, s)) << "want '" << s << "' in: " << err;
    expect_dicts_equal(full_dict(target), before, "model after a failed load");
    if (c.name == "flipped byte" && g->rank() == 0) {
      std::string verr = error_text_of([&] { ckpt::verify_checkpoint(copy); });
      EXPECT_TRUE(contains(verr, "CRC-32 mismatch")) << verr;
    }
  }
  // another model: the fingerprint differs; the error names the parameter and both shapes
  auto other = build(3, 12);
  std::string err = error_text_of([&] { ckpt::load_sharded(good, other, nullptr, nullptr, g); });
  EXPECT_TRUE(contains(err, "another model")) << err;
  EXPECT_TRUE(contains(err, "fc1.weight") && contains(err, "[10, 6]") && contains(err, "[12, 6]")) << err;
  // wrong optimizer kind
  auto opt = adam(0.1)(fsdp::parameters(target));
  err = error_text_of([&] { ckpt::load_sharded(good, target, opt.get(), nullptr, g); });
  EXPECT_TRUE(contains(err, "optimizer")) << err;
  expect_dicts_equal(full_dict(target), before, "model after failed loads");
  // the intact copy still loads
  ckpt::load_sharded(good, target, nullptr, nullptr, g);
  expect_dicts_equal(full_dict(target), full_dict(src), "good load");
}

// (d) export_full writes a file that Python's torch.load (weights_only=True) reads; its values
// equal the sharded model's full_state_dict exactly.
TEST(Checkpoint, ExportIsReadableByPython) {
  auto g = world();
  if (!python_torch_available()) GTEST_SKIP() << "python3 with torch is not available";
  SharedDir dir("export");
  auto m = sharded_transformer(8, g);
  torch::optim::AdamW opt(fsdp::parameters(m), torch::optim::AdamWOptions(1e-2));
  for (int s = 0; s < 2; ++s) sharded_step(m, opt, g, s);
  const std::string path = dir.sub("model.pt"), expected = dir.sub("expected.pt");
  ckpt::export_full(path, m, g);
  auto full = fsdp::full_state_dict(m);
  if (g->rank() == 0) {  // the expected values, written independently of export_full
    c10::Dict<std::string, at::Tensor> d;
    for (auto& [k, v] : full) d.insert(k, v);
    auto bytes = torch::pickle_save(c10::IValue(d));
    std::ofstream(expected, std::ios::binary).write(bytes.data(), bytes.size());
  }
  const std::string script =
      "import sys, torch\n"
      "d = torch.load(sys.argv[1], weights_only=True)\n"
      "e = torch.load(sys.argv[2], weights_only=False)  # pickle_save tags typed dicts\n"
      "assert isinstance(d, dict), type(d)\n"
      "assert sorted(d) == sorted(e), (sorted(d), sorted(e))\n"
      "for k in d:\n"
      "    assert d[k].dtype == torch.float32 and d[k].shape == e[k].shape, k\n"
      "    assert torch.equal(d[k], e[k]), k\n"
      "print(len(d), sum(v.numel() for v in d.values()))\n";
  if (g->rank() == 0) std::ofstream(dir.sub("check.py")) << script;
  const std::string out = dir.sub("out.txt");
  int rc = run_on_rank0("OMP_NUM_THREADS=1 python3 " + dir.sub("check.py") + " " + path + " " +
                        expected + " > " + out + " 2>&1");
  if (g->rank() == 0) {
    std::stringstream ss;
    ss << std::ifstream(out).rdbuf();
    ASSERT_EQ(rc, 0) << "python check failed:\n" << ss.str();
    int64_t n = 0, numel = 0, want = 0;
    ss >> n >> numel;
    for (auto& kv : full) want += kv.second.numel();
    EXPECT_EQ(n, static_cast<int64_t>(full.size()));
    EXPECT_EQ(numel, want);
  }
}

// (e) import_full of an exported file into a model of another seed gives the source's values
// exactly; a file written by Python's torch.save imports too; a mismatching model is refused.
TEST(Checkpoint, ImportEqualsSource) {
  auto g = world();
  SharedDir dir("import");
  auto src = sharded_transformer(8, g);
  const std::string path = dir.sub("model.pt");
  ckpt::export_full(path, src, g);
  auto dst = sharded_transformer(9, g);
  ckpt::import_full(path, dst, g);
  const auto want = full_dict(src);
  expect_dicts_equal(full_dict(dst), want, "imported");
  // a model of another shape is refused before anything is written
  torch::manual_seed(1);
  auto small = TinyTransformer(kVocab, kDim, kHeads, kLayers + 1, kCtx).ptr();
  fsdp::fully_shard_tree(small, g, fsdp::wrap_by_type<TinyBlockImpl>());
  std::string err = error_text_of([&] { ckpt::import_full(path, small, g); });
  EXPECT_TRUE(contains(err, "h2.") && contains(err, "missing")) << err;

  if (!python_torch_available()) GTEST_SKIP() << "python3 with torch is not available";
  const std::string doubled = dir.sub("doubled.pt");
  int rc = run_on_rank0("OMP_NUM_THREADS=1 python3 -c \"import torch,sys; d=torch.load(sys.argv[1]);"
                        " torch.save({k: v * 2 for k, v in d.items()}, sys.argv[2])\" " +
                        path + " " + doubled);
  ASSERT_EQ(rc, 0);
  ckpt::import_full(doubled, dst, g);
  auto got = full_dict(dst);
  for (const auto& [k, v] : want) EXPECT_TRUE(at::equal(got[k], v * 2)) << k;
}

// Timing of save / load for a model of ~4.2M parameters with AdamW state (run by hand:
// --gtest_also_run_disabled_tests --gtest_filter='*SaveLoadTiming').
TEST(Checkpoint, DISABLED_SaveLoadTiming) {
  auto g = world();
  SharedDir dir("timing");
  torch::manual_seed(1);
  auto m = Chain(std::vector<int64_t>{1024, 1024, 1024, 1024, 1024}).ptr();
  fsdp::fully_shard_tree(m, g, fsdp::wrap_by_type<torch::nn::LinearImpl>());
  torch::optim::AdamW opt(fsdp::parameters(m), torch::optim::AdamWOptions(1e-3));
  at::Tensor x = torch::randn({4, 1024});
  fsdp::call(m, x).sum().backward();
  opt.step();
  int64_t numel = 0;
  for (auto& kv : m->named_parameters()) numel += kv.value().numel();
  auto time = [&](const std::function<void()>& fn) {
    g->barrier()->wait();
    auto t0 = std::chrono::steady_clock::now();
    fn();
    g->barrier()->wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int rep = 0; rep < 2; ++rep) {
    double save_s = time([&] { ckpt::save_sharded(dir.path, m, &opt, {}, g, {}); });
    double load_s = time([&] { ckpt::load_sharded(dir.path, m, &opt, nullptr, g); });
    double export_s = time([&] { ckpt::export_full(dir.sub("full.pt"), m, g); });
    if (g->rank() == 0) {
      std::printf("[timing] N=%d params=%lld (+AdamW state, %.1f MiB total): save %.3f s, load %.3f s, "
                  "export %.3f s\n",
                  g->size(), static_cast<long long>(numel), numel * 12.0 / (1 << 20), save_s, load_s,
                  export_s);
    }
  }
}
