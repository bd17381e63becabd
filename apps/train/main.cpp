// fsdp-train: trains a GPT-2-style model on real text with Fully Sharded Data Parallel over MPI.
//
//   mpirun -n N build/bin/fsdp-train [flags]        (--help lists them; --config FILE.toml)
//
// Contents
//   1. Setup: MPI world group, counting allocator, flags, tokenizer, token datasets.
//   2. Model: identical init on every rank (checked), fully_shard_tree with one unit per Block.
//   3. Optimizer: AdamW over this rank's shards, two groups (decay / no decay).
//   4. Training loop: gradient accumulation, clipping, lr schedule, metrics, trace, evaluation.
//   5. Sample and summary.
//
// Measurement rules (docs for the JSON-lines fields):
//   * "comm" of a step is this rank's CommStats delta over the training part of the step only
//     (forwards, backwards, grad clipping, optimizer step): a snapshot is taken right before the first
//     micro-batch and right after optimizer.step(). The app's own collectives for the reported loss
//     and memory (two all-reduces after the second snapshot) and evaluation are excluded exactly.
//   * "mem" values are the MAX over ranks. param/grad/optim/unsharded/resident bytes are
//     fsdp::accounting::model_state_bytes after optimizer.step() (before zero_grad); peak_bytes is the
//     counting allocator's peak over the training part of the step (reset at its start).
//   * "loss" is the mean over the global batch (all-reduce kAvg of each rank's local mean).
//   * step_time_s / tokens_per_s cover the training part; tokens = global batch * seq len.
//   * --trace: every rank records its events; at the end they are gathered to rank 0 over the
//     process group (all_gather of the serialized JSON) and rank 0 writes one file PATH. Compute
//     events (tid 0) are timed per micro-batch forward / backward and per optimizer step. tid 1 holds
//     one event per collective of the world group as it ran on its communication thread
//     (CommStats::set_record_events / take_events, on the comm::now_s() clock, shifted to the trace
//     origin), so overlap of communication with compute is visible.
//   * Checkpoints (--save / --resume): the model shards, AdamW state and a TrainState with "step",
//     "lr_step", "sampler_pos" (sequences consumed), "rng" (CPU generator) and, for fp16,
//     "grad_scale" / "growth_tracker". A resumed run at the same world size repeats the uninterrupted
//     run's losses bit for bit (fp32); at another world size up to reduction order.
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <sys/stat.h>

#include "data/batch_sampler.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "fsdp/fsdp.h"
#include "models/gpt.h"
#include "train/op_profile.h"
#include "train/reporting.h"
#include "train/train_config.h"

// fp16 needs dynamic loss scaling; builds of fsdp-cpp without fsdp::GradScaler reject fp16.
#if __has_include("fsdp/precision/grad_scaler.h")
#include "fsdp/precision/grad_scaler.h"
#define FSDP_TRAIN_HAS_GRAD_SCALER 1
#else
#define FSDP_TRAIN_HAS_GRAD_SCALER 0
#endif

namespace apps::train {
namespace {

using namespace fsdp;  // the library's names, unqualified as before the apps left its namespace

using nlohmann::json;
using Clock = std::chrono::steady_clock;

/// A setting the run cannot honour: printed by rank 0 (every rank finds the same), exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A collective checkpoint operation failed with fsdp::Error on every rank (the library guarantees
/// the same verdict everywhere): printed by rank 0, exit code 1, no MPI_Abort needed.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Runs a collective checkpoint call, turning its fsdp::Error into a CheckpointError.
template <typename F>
auto checkpoint_call(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const fsdp::Error& e) {
    throw CheckpointError(what + ": " + e.what());
  }
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// The training and validation token streams, tokenized once (rank 0 builds the caches first).
struct Corpus {
  std::string train_path, val_path;  // val_path empty: the last 5% of train_path's tokens
  std::shared_ptr<const data::TokenDataset> train, val;
};

Corpus load_corpus(const TrainConfig& c, const data::Tokenizer& tok, comm::ProcessGroup& group,
                   Console& console) {
  Corpus corpus;
  std::string src = c.data.empty() ? c.data_dir + "/corpus" : c.data;
  if (is_dir(src)) {
    corpus.train_path = src + "/train.txt";
    corpus.val_path = src + "/val.txt";
    for (const auto& p : {corpus.train_path, corpus.val_path}) {
      if (!is_file(p)) {
        throw UsageError("--data: folder '" + src + "' has no " + p.substr(src.size() + 1) +
                         (c.data.empty() ? " (run scripts/prepare_data.sh " + c.data_dir + ")" : ""));
      }
    }
  } else if (is_file(src)) {
    corpus.train_path = src;
  } else {
    throw UsageError("--data: '" + src + "' is neither a file nor a folder" +
                     (c.data.empty() ? " (run scripts/prepare_data.sh " + c.data_dir + ")" : ""));
  }
  auto load = [&](const std::string& path) {
    bool built = false;
    auto t0 = Clock::now();
    auto d = data::TokenDataset::load_or_build(path, tok, &built);
    if (built) {
      console.line("tokenized " + path + ": " + human_count(static_cast<double>(d.size())) +
                   " tokens in " + std::to_string(seconds_since(t0)).substr(0, 4) + " s (cached as " +
                   data::TokenDataset::cache_path(path, tok) + ")");
    }
    return d;
  };
  // Rank 0 tokenizes and writes the caches; the others read them after the barrier.
  auto load_all = [&] {
    data::TokenDataset train = load(corpus.train_path);
    if (corpus.val_path.empty()) {
      int64_t cut = train.size() - train.size() / 20;
      corpus.val = std::make_shared<const data::TokenDataset>(train.slice(cut, train.size()));
      corpus.train = std::make_shared<const data::TokenDataset>(train.slice(0, cut));
    } else {
      corpus.train = std::make_shared<const data::TokenDataset>(std::move(train));
      corpus.val = std::make_shared<const data::TokenDataset>(load(corpus.val_path));
    }
  };
  if (group.rank() == 0) load_all();
  group.barrier()->wait();
  if (group.rank() != 0) load_all();
  return corpus;
}

models::GPTConfig resolve_model(const TrainConfig& c, int64_t vocab) {
  models::GPTConfig m = models::gpt_preset(c.model, vocab);
  if (c.n_layer > 0) m.n_layer = c.n_layer;
  if (c.n_head > 0) m.n_head = c.n_head;
  if (c.n_embd > 0) m.n_embd = c.n_embd;
  if (c.block_size > 0) m.block_size = c.block_size;
  m.attention = c.attention;
  if (m.n_embd % m.n_head != 0) {
    throw UsageError("--n-embd " + std::to_string(m.n_embd) + " is not divisible by --n-head " +
                     std::to_string(m.n_head));
  }
  if (c.seq_len > m.block_size) {
    throw UsageError("--seq-len " + std::to_string(c.seq_len) + " exceeds the model's context of " +
                     std::to_string(m.block_size) + " tokens (raise --block-size)");
  }
  return m;
}

FullyShardOptions resolve_fsdp_options(const TrainConfig& c) {
  FullyShardOptions o;
  try {
    o.strategy = parse_sharding_strategy(c.strategy);
  } catch (const fsdp::Error& e) {
    throw UsageError(std::string("--strategy: ") + e.what());
  }
  if (c.mixed_precision == "bf16" || c.mixed_precision == "fp16") {
    auto dt = c.mixed_precision == "bf16" ? at::kBFloat16 : at::kHalf;
    o.mixed_precision.param_dtype = dt;
    o.mixed_precision.reduce_dtype = dt;
  }
  o.forward_prefetch = c.forward_prefetch;
  o.hybrid_shard_group_size = c.hybrid_shard_group_size;
  o.bucket_cap_bytes = static_cast<int64_t>(c.bucket_cap_mb * 1024 * 1024);
  return o;
}

/// Fails unless every rank built bitwise-identical initial parameters (same seed, same library).
void check_identical_init(models::GPT& model, comm::ProcessGroup& group) {
  double sum = 0.0, abs_sum = 0.0;
  for (const auto& p : model->parameters()) {
    sum += p.sum().item<double>();
    abs_sum += p.abs().sum().item<double>();
  }
  at::Tensor mx = at::tensor(std::vector<double>{sum, abs_sum}, at::kDouble);
  at::Tensor mn = mx.clone();
  group.all_reduce(mx, comm::ReduceOp::kMax)->wait();
  group.all_reduce(mn, comm::ReduceOp::kMin)->wait();
  if (!mx.equal(mn)) {
    throw std::runtime_error("initial parameters differ across ranks (checksums " +
                             std::to_string(mn[0].item<double>()) + " vs " +
                             std::to_string(mx[0].item<double>()) + ")");
  }
}

json comm_delta(const comm::CommStats::Snapshot& before, const comm::CommStats::Snapshot& after) {
  using K = comm::CollectiveKind;
  auto kind = [&](K k) { return static_cast<int>(k); };
  json j;
  for (auto [k, name] : {std::pair{K::kAllGather, "all_gather"}, std::pair{K::kReduceScatter, "reduce_scatter"},
                         std::pair{K::kAllReduce, "all_reduce"}, std::pair{K::kBroadcast, "broadcast"},
                         std::pair{K::kBarrier, "barrier"}}) {
    const auto& a = after[kind(k)];
    const auto& b = before[kind(k)];
    j[std::string(name) + "_bytes"] = a.bytes - b.bytes;
    j[std::string(name) + "_calls"] = a.calls - b.calls;
    j[std::string(name) + "_busy_s"] = a.busy_s - b.busy_s;
  }
  return j;
}

/// Dynamic loss scaling for fp16 (fsdp::GradScaler); a pass-through for fp32 / bf16.
class LossScaling {
 public:
  explicit LossScaling(bool enabled) {
#if FSDP_TRAIN_HAS_GRAD_SCALER
    if (enabled) scaler_.emplace();
#else
    if (enabled) {
      throw UsageError("--mixed-precision fp16 needs loss scaling, and this build of fsdp-cpp has no "
                       "fsdp::GradScaler: use bf16 or fp32");
    }
#endif
  }
  bool enabled() const {
#if FSDP_TRAIN_HAS_GRAD_SCALER
    return scaler_.has_value();
#else
    return false;
#endif
  }
  at::Tensor scale(const at::Tensor& loss) const {
#if FSDP_TRAIN_HAS_GRAD_SCALER
    if (scaler_) return scaler_->scale(loss);
#endif
    return loss;
  }
  /// Unscales the sharded gradients (before clipping). Collective when enabled.
  void unscale(const std::shared_ptr<torch::nn::Module>& model) {
#if FSDP_TRAIN_HAS_GRAD_SCALER
    if (scaler_) scaler_->unscale(model);
#endif
  }
  /// optimizer.step() unless a rank found inf/NaN gradients; returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer, const std::shared_ptr<torch::nn::Module>& model) {
#if FSDP_TRAIN_HAS_GRAD_SCALER
    if (scaler_) {
      bool stepped = scaler_->step(optimizer, model);
      scaler_->update();
      return stepped;
    }
#endif
    optimizer.step();
    return true;
  }
  double current_scale() const {
#if FSDP_TRAIN_HAS_GRAD_SCALER
    if (scaler_) return scaler_->get_scale();
#endif
    return 1.0;
  }
  /// Scaler state into / out of a checkpoint's TrainState ("grad_scale", "growth_tracker").
  void save_state(checkpoint::TrainState& st) const {
#if FSDP_TRAIN_HAS_GRAD_SCALER
    if (scaler_) {
      st.doubles["grad_scale"] = scaler_->get_scale();
      st.ints["growth_tracker"] = scaler_->growth_tracker();
    }
#endif
  }
  void load_state(const checkpoint::TrainState& st) {
#if FSDP_TRAIN_HAS_GRAD_SCALER
    if (!scaler_) return;
    auto s = st.doubles.find("grad_scale");
    auto g = st.ints.find("growth_tracker");
    // A checkpoint of an fp32/bf16 run has no scaler state: fp16 then starts at the default scale.
    if (s != st.doubles.end() && g != st.ints.end()) scaler_->load_state(s->second, g->second);
#endif
  }

 private:
#if FSDP_TRAIN_HAS_GRAD_SCALER
  std::optional<GradScaler> scaler_;
#endif
};

/// Mean loss over eval_batches global validation batches (collective; no grad).
double evaluate(models::GPT& model, data::DistributedBatchSampler& val, int64_t batches,
                int64_t micro, comm::ProcessGroup& group) {
  at::NoGradGuard no_grad;
  const int64_t T = val.seq_len();
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    at::Tensor batch = val.eval_batch(b);  // (G/N, T+1)
    for (int64_t r = 0; r < batch.size(0); r += micro) {
      at::Tensor mb = batch.slice(0, r, std::min(r + micro, batch.size(0)));
      at::Tensor logits = fsdp::call(model, mb.slice(1, 0, T));
      sum += models::gpt_loss(logits.to(at::kFloat), mb.slice(1, 1, T + 1)).item<double>();
      ++count;
    }
  }
  at::Tensor mean = at::tensor(std::vector<double>{sum / count}, at::kDouble);
  group.all_reduce(mean, comm::ReduceOp::kAvg)->wait();
  return mean.item<double>();
}

/// Gathers every rank's serialized trace to rank 0 (two all-gathers) and writes it there.
void write_trace(const TraceRecorder& trace, const std::string& path, comm::ProcessGroup& group) {
  std::string mine = trace.serialize();
  const int n = group.size();
  at::Tensor len = at::tensor(std::vector<int64_t>{static_cast<int64_t>(mine.size())}, at::kLong);
  at::Tensor lens = at::zeros({n}, at::kLong);
  group.all_gather_into_tensor(lens, len)->wait();
  int64_t max_len = lens.max().item<int64_t>();
  at::Tensor buf = at::zeros({max_len}, at::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::zeros({n * max_len}, at::kByte);
  group.all_gather_into_tensor(all, buf)->wait();
  if (group.rank() != 0) return;
  std::vector<std::string> per_rank;
  const char* base = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) {
    per_rank.emplace_back(base + r * max_len, static_cast<size_t>(lens[r].item<int64_t>()));
  }
  TraceRecorder::write_merged(path, per_rank);
}

int run(int argc, char** argv) {
  // 1. Setup ----------------------------------------------------------------------------------------
  std::shared_ptr<comm::MpiProcessGroup> group = comm::MpiProcessGroup::world();
  accounting::install_counting_allocator();
  const bool heap_retained = accounting::retain_freed_heap_memory();
  const int rank = group->rank(), world = group->size();
  int exit_code = 0;
  std::optional<TrainConfig> parsed = parse_train_config(argc, argv, rank, &exit_code);
  if (!parsed) return exit_code;
  const TrainConfig cfg = *parsed;
  Console console(rank, cfg.progress == "bar" ||
                            (cfg.progress == "auto" && ::isatty(STDOUT_FILENO) != 0));
  at::set_num_threads(cfg.threads);

  // Batch geometry (rejected here, identically on every rank).
  if (cfg.global_batch_size % world != 0) {
    throw UsageError("--global-batch-size " + std::to_string(cfg.global_batch_size) +
                     " is not divisible by the world size " + std::to_string(world));
  }
  const int64_t rows = cfg.global_batch_size / world;
  const int64_t micro = cfg.micro_batch_size == 0 ? rows : cfg.micro_batch_size;
  if (rows % micro != 0) {
    throw UsageError("--micro-batch-size " + std::to_string(micro) + " does not divide the " +
                     std::to_string(rows) + " sequences per rank (--global-batch-size " +
                     std::to_string(cfg.global_batch_size) + " / " + std::to_string(world) +
                     " ranks)");
  }
  const int64_t accum = rows / micro;
  const int64_t T = cfg.seq_len;
  FullyShardOptions fsdp_options = resolve_fsdp_options(cfg);
  // The root unit (embeddings, final LayerNorm, tied head) returns fp32 logits under bf16/fp16, so
  // the loss is computed in fp32 (the blocks keep their low-precision outputs).
  FullyShardOptions root_options = fsdp_options;
  if (fsdp_options.mixed_precision.param_dtype) {
    root_options.mixed_precision.output_dtype = at::kFloat;
  }
  LossScaling loss_scaling(cfg.mixed_precision == "fp16");

  const std::string spm_path = cfg.data_dir + "/spm_" + std::to_string(cfg.vocab_size) + ".model";
  if (!is_file(spm_path)) {
    throw UsageError("no tokenizer at " + spm_path + ": run scripts/prepare_data.sh " +
                     cfg.data_dir + " " + std::to_string(cfg.vocab_size));
  }
  data::Tokenizer tokenizer(spm_path);
  Corpus corpus = load_corpus(cfg, tokenizer, *group, console);
  // The samplers check sizes the same way on every rank: a rejection is a usage error (clean exit
  // on all ranks), not a crash.
  auto make_sampler = [&](const auto& tokens, const char* split) {
    try {
      return data::DistributedBatchSampler(tokens, cfg.global_batch_size, T, rank, world, cfg.seed);
    } catch (const std::exception& e) {
      throw UsageError(std::string(split) + " data: " + e.what());
    }
  };
  data::DistributedBatchSampler train_sampler = make_sampler(corpus.train, "training");
  data::DistributedBatchSampler val_sampler = make_sampler(corpus.val, "validation");

  // 2. Model -----------------------------------------------------------------------------------------
  const models::GPTConfig mcfg = resolve_model(cfg, tokenizer.vocab_size());
  torch::manual_seed(cfg.seed);
  models::GPT model(mcfg);
  check_identical_init(model, *group);
  try {
    fully_shard_tree(model.ptr(), group, wrap_by_type<models::BlockImpl>(), fsdp_options,
                     root_options);
  } catch (const fsdp::Error& e) {
    throw UsageError(std::string("the FSDP engine rejected these settings: ") + e.what());
  }
  double import_s = 0.0;
  if (!cfg.import_path.empty()) {
    const auto t0 = Clock::now();
    checkpoint_call("--import " + cfg.import_path, [&] {
      checkpoint::import_full(cfg.import_path, model.ptr(), group);
    });
    import_s = seconds_since(t0);
  }
  const int64_t num_params = mcfg.num_params();

  // 3. Optimizer: AdamW on this rank's shards. Weight decay on the Linear weight matrices only.
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& sp : sharded_parameters(model.ptr())) {
    bool embedding = sp.name.rfind("wte.", 0) == 0 || sp.name.rfind("wpe.", 0) == 0;
    (sp.tensor.dim() >= 2 && !embedding ? decay : no_decay).push_back(sp.tensor);
  }
  auto adamw = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(cfg.lr).betas({cfg.beta1, cfg.beta2}).eps(1e-8).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, adamw(cfg.weight_decay));
  groups.emplace_back(no_decay, adamw(0.0));
  torch::optim::AdamW optimizer(std::move(groups), torch::optim::AdamWOptions(cfg.lr));

  // Resume: model shards, AdamW state, step, schedule and sampler positions, RNG, loss scaler.
  int64_t start_step = 0;   // optimizer steps already done
  int64_t lr_pos = 0;       // schedule position (lr_at(lr_pos + 1) is the next step's lr)
  int64_t batch_pos = 0;    // index of the next global batch (sampler_pos / G)
  std::string resumed_from;
  double load_s = 0.0;
  if (!cfg.resume.empty()) {
    const std::string path = cfg.resume == "latest" ? cfg.save : cfg.resume;
    checkpoint::TrainState st;
    const auto t0 = Clock::now();
    resumed_from = checkpoint_call("--resume " + path, [&] {
      return checkpoint::load_sharded(path, model.ptr(), &optimizer, &st, group);
    });
    load_s = seconds_since(t0);
    auto need = [&](const char* key) {
      auto it = st.ints.find(key);
      if (it == st.ints.end()) {
        throw CheckpointError("--resume " + resumed_from + ": the checkpoint's train state has no '" +
                              key + "' (not written by fsdp-train?)");
      }
      return it->second;
    };
    start_step = need("step");
    lr_pos = need("lr_step");
    const int64_t sampler_pos = need("sampler_pos");
    if (sampler_pos % cfg.global_batch_size != 0) {
      throw UsageError("--resume " + resumed_from + ": " + std::to_string(sampler_pos) +
                       " sequences consumed is not a whole number of global batches of " +
                       std::to_string(cfg.global_batch_size) + " (resume with the same "
                       "--global-batch-size)");
    }
    batch_pos = sampler_pos / cfg.global_batch_size;
    if (auto it = st.tensors.find("rng"); it != st.tensors.end()) {
      checkpoint::set_cpu_rng_state(it->second);
    }
    loss_scaling.load_state(st);
  }

  // --save must be a writable directory (created if missing): checked now, not at the first save.
  if (!cfg.save.empty()) {
    std::string why;
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::create_directories(cfg.save, ec);
      if (ec) why = "cannot create it: " + ec.message();
      else if (!is_dir(cfg.save)) why = "not a directory";
      else if (::access(cfg.save.c_str(), W_OK | X_OK) != 0) why = "not writable";
    }
    at::Tensor bad = at::tensor(std::vector<int64_t>{why.empty() ? 0 : 1}, at::kLong);
    group->all_reduce(bad, comm::ReduceOp::kMax)->wait();
    if (bad.item<int64_t>() != 0) {
      throw UsageError("--save '" + cfg.save + "': " + (why.empty() ? "unusable on rank 0" : why));
    }
  }
  JsonLines metrics(cfg.metrics, rank);
  TraceRecorder trace(rank, !cfg.trace.empty());
  if (rank == 0 && !cfg.trace.empty() && !std::ofstream(cfg.trace, std::ios::trunc)) {
    throw std::runtime_error("cannot open trace file '" + cfg.trace + "' for writing");
  }
  json config_event = {
      {"event", "config"},
      {"model", cfg.model},
      {"n_layer", mcfg.n_layer}, {"n_head", mcfg.n_head}, {"n_embd", mcfg.n_embd},
      {"block_size", mcfg.block_size}, {"vocab_size", mcfg.vocab_size}, {"attention", mcfg.attention},
      {"data", corpus.train_path}, {"val_data", corpus.val_path.empty() ? "last 5% of data" : corpus.val_path},
      {"data_dir", cfg.data_dir}, {"tokenizer", spm_path},
      {"train_tokens", corpus.train->size()}, {"val_tokens", corpus.val->size()},
      {"strategy", to_string(fsdp_options.strategy)}, {"mixed_precision", cfg.mixed_precision},
      {"threads", cfg.threads},
      {"global_batch_size", cfg.global_batch_size}, {"micro_batch_size", micro},
      {"accumulation_steps", accum}, {"seq_len", T}, {"tokens_per_step", cfg.global_batch_size * T},
      {"steps", cfg.steps}, {"lr", cfg.lr}, {"min_lr", cfg.min_lr}, {"warmup_steps", cfg.warmup_steps},
      {"weight_decay", cfg.weight_decay}, {"beta1", cfg.beta1}, {"beta2", cfg.beta2},
      {"grad_clip", cfg.grad_clip}, {"seed", cfg.seed},
      {"eval_every", cfg.eval_every}, {"eval_batches", cfg.eval_batches},
      {"sample_tokens", cfg.sample_tokens}, {"sample_prompt", cfg.sample_prompt},
      {"sample_temperature", cfg.sample_temperature}, {"sample_top_k", cfg.sample_top_k},
      {"progress", cfg.progress}, {"metrics", cfg.metrics}, {"trace", cfg.trace},
      {"config_file", cfg.config_file}, {"backend", group->backend_name()},
      {"forward_prefetch", fsdp_options.forward_prefetch},
      {"hybrid_shard_group_size", fsdp_options.hybrid_shard_group_size},
      {"bucket_cap_bytes", fsdp_options.bucket_cap_bytes},
      {"root_output_dtype", root_options.mixed_precision.output_dtype ? "fp32" : "unchanged"},
      {"save", cfg.save}, {"save_every", cfg.save_every}, {"keep", cfg.keep},
      {"resume", cfg.resume}, {"resumed_from", resumed_from}, {"start_step", start_step},
      {"load_s", load_s}, {"export", cfg.export_path}, {"import", cfg.import_path},
      {"import_s", import_s},
      {"world_size", world}, {"num_params", num_params}, {"heap_retained", heap_retained}};
  const CpuInfo& cpu = cpu_info();
  config_event["cpu"] = {{"model", cpu.model},
                         {"capability", cpu.capability},
                         {"avx512_bf16", cpu.avx512_bf16}, {"amx_bf16", cpu.amx_bf16},
                         {"avx512_fp16", cpu.avx512_fp16}, {"amx_fp16", cpu.amx_fp16},
                         {"bf16_accelerated", cpu.bf16_accelerated()},
                         {"fp16_accelerated", cpu.fp16_accelerated()}};
  metrics.write(config_event);
  if ((cfg.mixed_precision == "bf16" && !cpu.bf16_accelerated()) ||
      (cfg.mixed_precision == "fp16" && !cpu.fp16_accelerated())) {
    console.line("warning: --mixed-precision " + cfg.mixed_precision + " on a CPU without " +
                 cfg.mixed_precision + " matmul units: its matmuls run without them and will be slower "
                 "than fp32 (memory and communication still halve)");
  }
  if (!resumed_from.empty()) {
    console.line("resumed from " + resumed_from + " at step " + std::to_string(start_step) + " (" +
                 std::to_string(load_s).substr(0, 5) + " s)");
  }
  if (!cfg.import_path.empty()) {
    console.line("imported weights from " + cfg.import_path + " (" +
                 std::to_string(import_s).substr(0, 5) + " s)");
  }
  console.line("fsdp-train: " + cfg.model + " (" + human_count(static_cast<double>(num_params)) +
               " params, " + std::to_string(mcfg.n_layer) + " FSDP block units + root) on " +
               std::to_string(world) + " rank(s), " + to_string(fsdp_options.strategy) + ", " +
               cfg.mixed_precision + "; " + human_count(static_cast<double>(corpus.train->size())) +
               " train / " + human_count(static_cast<double>(corpus.val->size())) +
               " val tokens; batch " + std::to_string(cfg.global_batch_size) + " x " +
               std::to_string(T) + " tokens, " + std::to_string(accum) + " micro-batch(es) of " +
               std::to_string(micro) + " per rank; cpu: " + cpu.summary());

  // 4. Training loop ---------------------------------------------------------------------------------
  group->barrier()->wait();
  trace.reset_origin();
  const double trace_origin_s = comm::now_s();
  if (trace.enabled()) {
    group->stats().set_record_events(true);
    group->stats().take_events();  // drop the setup's collectives
  }
  // Collectives recorded since the last call -> tid 1 events (times relative to the trace origin).
  auto trace_collectives = [&] {
    if (!trace.enabled()) return;
    for (const auto& e : group->stats().take_events()) {
      trace.add(comm::to_string(e.kind), "comm", 1, (e.start_s - trace_origin_s) * 1e6, (e.end_s - e.start_s) * 1e6,
                {{"bytes", e.bytes}});
    }
  };
  auto save_now = [&](int64_t step) {
    checkpoint::TrainState st;
    st.ints["step"] = step;
    st.ints["lr_step"] = lr_pos;
    st.ints["sampler_pos"] = batch_pos * cfg.global_batch_size;
    st.tensors["rng"] = checkpoint::cpu_rng_state();
    loss_scaling.save_state(st);
    checkpoint::SaveOptions so;
    so.keep_last_k = static_cast<int>(cfg.keep);
    const double t0_us = trace.now_us();
    const auto t0 = Clock::now();
    std::string name = checkpoint_call("--save " + cfg.save, [&] {
      return checkpoint::save_sharded(cfg.save, model.ptr(), &optimizer, st, group, so);
    });
    const double save_s = seconds_since(t0);
    trace.add("checkpoint save", "compute", 0, t0_us, trace.now_us() - t0_us);
    const std::string path = cfg.save + "/" + name;
    metrics.write({{"event", "checkpoint"}, {"step", step}, {"path", path}, {"save_s", save_s}});
    console.line("step " + std::to_string(step) + ": checkpoint " + path + " (" +
                 std::to_string(save_s).substr(0, 5) + " s)");
  };
  const auto run_start = Clock::now();
  double train_seconds = 0.0, last_loss = NAN, first_loss = NAN, last_val = NAN;
  const double tokens_per_step = static_cast<double>(cfg.global_batch_size * T);
  auto eval_now = [&](int64_t step) {
    const double t0 = trace.now_us();
    last_val = evaluate(model, val_sampler, cfg.eval_batches, micro, *group);
    trace.add("eval", "compute", 0, t0, trace.now_us() - t0);
    metrics.write({{"event", "eval"}, {"step", step}, {"val_loss", last_val}});
    char buf[96];
    std::snprintf(buf, sizeof(buf), "step %ld: val loss %.4f", static_cast<long>(step), last_val);
    console.line(buf);
  };

  if (start_step > cfg.steps) {
    throw UsageError("--resume " + resumed_from + " is at step " + std::to_string(start_step) +
                     ", beyond --steps " + std::to_string(cfg.steps));
  }
  OpProfiler op_profiler;
  const int64_t profile_from = std::max(start_step + 1, cfg.steps - cfg.profile_steps + 1);
  double profiled_s = 0.0;
  for (int64_t step = start_step + 1; step <= cfg.steps; ++step) {
    if (!cfg.profile.empty() && step == profile_from) op_profiler.start();
    const double lr = lr_at(++lr_pos, cfg.steps, cfg.warmup_steps, cfg.lr, cfg.min_lr);
    for (auto& g : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    }
    at::Tensor batch = train_sampler.train_batch(batch_pos++);  // (G/N, T+1)

    // Training part of the step (measured).
    accounting::reset_peak_bytes();
    const auto stats_before = group->stats().snapshot();
    const auto t_step = Clock::now();
    double local_loss = 0.0;
    for (int64_t k = 0; k < accum; ++k) {
      set_requires_gradient_sync(model.ptr(), k == accum - 1);
      at::Tensor mb = batch.slice(0, k * micro, (k + 1) * micro);  // (micro, T+1)
      at::Tensor loss;
      {
        TraceScope s(trace, "forward mb" + std::to_string(k));
        at::Tensor logits = fsdp::call(model, mb.slice(1, 0, T));  // (micro, T, V)
        loss = models::gpt_loss(logits.to(at::kFloat), mb.slice(1, 1, T + 1));
      }
      {
        TraceScope s(trace, "backward mb" + std::to_string(k));
        loss_scaling.scale(loss / static_cast<double>(accum)).backward();
      }
      local_loss += loss.item<double>() / static_cast<double>(accum);
    }
    double grad_norm;
    bool stepped;
    accounting::ModelStateBytes state;
    const double loss_scale = loss_scaling.current_scale();
    {
      TraceScope s(trace, "optimizer step (clip + AdamW)");
      loss_scaling.unscale(model.ptr());
      grad_norm = clip_grad_norm(model.ptr(), cfg.grad_clip);
      stepped = loss_scaling.step(optimizer, model.ptr());
      state = accounting::model_state_bytes(model.ptr(), &optimizer);
      optimizer.zero_grad();
    }
    const double step_time = seconds_since(t_step);
    if (op_profiler.active()) {
      profiled_s += step_time;
      if (step == cfg.steps) {
        // Stopped before the last step's evaluation and checkpoint, which are not step time.
        const std::string path = rank == 0 ? cfg.profile : cfg.profile + ".rank" + std::to_string(rank);
        std::vector<OpTotals> ops = op_profiler.stop(path);
        console.line("operator profile of the last " + std::to_string(cfg.steps - profile_from + 1) +
                     " step(s), rank 0 (" + std::to_string(profiled_s * 1e3).substr(0, 7) +
                     " ms of steps; trace " + cfg.profile + "):\n" +
                     format_op_table(ops, profiled_s, 25));
      }
    }
    const auto stats_after = group->stats().snapshot();
    const int64_t peak = accounting::peak_bytes();
    train_seconds += step_time;

    // Reporting (collectives outside the measured part).
    at::Tensor loss_t = at::tensor(std::vector<double>{local_loss}, at::kDouble);
    group->all_reduce(loss_t, comm::ReduceOp::kAvg)->wait();
    at::Tensor mem_t = at::tensor(std::vector<int64_t>{state.sharded_param_bytes,
                                                       state.sharded_grad_bytes,
                                                       state.optim_state_bytes, peak,
                                                       state.unsharded_param_bytes,
                                                       state.resident_bytes()},
                                  at::kLong);
    group->all_reduce(mem_t, comm::ReduceOp::kMax)->wait();
    last_loss = loss_t.item<double>();
    if (step == start_step + 1) first_loss = last_loss;
    json comm = comm_delta(stats_before, stats_after);
    trace_collectives();
    const int64_t* m = mem_t.data_ptr<int64_t>();
    json step_event = {{"event", "step"},
                   {"step", step},
                   {"loss", last_loss},
                   {"lr", lr},
                   {"grad_norm", grad_norm},
                   {"tokens", static_cast<int64_t>(tokens_per_step)},
                   {"step_time_s", step_time},
                   {"tokens_per_s", tokens_per_step / step_time},
                   {"mem",
                    {{"param_shard_bytes", m[0]},
                     {"grad_shard_bytes", m[1]},
                     {"optim_state_bytes", m[2]},
                     {"unsharded_param_bytes", m[4]},
                     {"resident_bytes", m[5]},
                     {"peak_bytes", m[3]}}},
                   {"comm", comm}};
    if (loss_scaling.enabled()) {
      step_event["loss_scale"] = loss_scale;  // the scale this step's backward used
      step_event["optimizer_stepped"] = stepped;  // false: inf/NaN gradients, step skipped
    }
    metrics.write(step_event);
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "step %ld/%ld | loss %.4f | lr %.2e | grad norm %.3f | %s tok/s | %.0f ms | "
                  "mem/rank: state %s, peak %s",
                  static_cast<long>(step), static_cast<long>(cfg.steps), last_loss, lr, grad_norm,
                  human_count(tokens_per_step / step_time).c_str(), step_time * 1e3,
                  human_bytes(static_cast<double>(m[5])).c_str(),
                  human_bytes(static_cast<double>(m[3])).c_str());
    console.progress(buf);

    if ((cfg.eval_every > 0 && step % cfg.eval_every == 0) || step == cfg.steps) eval_now(step);
    if (!cfg.save.empty() &&
        ((cfg.save_every > 0 && step % cfg.save_every == 0) || step == cfg.steps)) {
      save_now(step);
    }
    trace_collectives();
  }

  // 5. Sample and summary ---------------------------------------------------------------------------
  if (cfg.sample_tokens > 0) {
    const double t0 = trace.now_us();
    std::vector<int32_t> prompt32 = tokenizer.encode(cfg.sample_prompt);
    std::vector<int64_t> prompt(prompt32.begin(), prompt32.end());
    std::vector<int64_t> out = model->generate(prompt, cfg.sample_tokens, cfg.sample_temperature,
                                               cfg.sample_top_k, cfg.seed);
    trace.add("generate", "compute", 0, t0, trace.now_us() - t0);
    std::vector<int32_t> out32(prompt32);  // decode prompt + continuation together (spacing)
    out32.insert(out32.end(), out.begin(), out.end());
    console.line("sample (" + std::to_string(cfg.sample_tokens) + " tokens, temperature " +
                 std::to_string(cfg.sample_temperature).substr(0, 4) + ", top-k " +
                 std::to_string(cfg.sample_top_k) + "):\n" + tokenizer.decode(out32));
  }
  if (!cfg.export_path.empty()) {
    const double t0_us = trace.now_us();
    const auto t0 = Clock::now();
    checkpoint_call("--export " + cfg.export_path, [&] {
      checkpoint::export_full(cfg.export_path, model.ptr(), group);
    });
    const double export_s = seconds_since(t0);
    trace.add("export", "compute", 0, t0_us, trace.now_us() - t0_us);
    trace_collectives();
    metrics.write({{"event", "export"}, {"path", cfg.export_path}, {"export_s", export_s}});
    console.line("exported the full state dict to " + cfg.export_path + " (" +
                 std::to_string(export_s).substr(0, 5) + " s)");
  }
  const double total_time = seconds_since(run_start);
  const int64_t steps_run = cfg.steps - start_step;
  const double mean_tps =
      train_seconds > 0 ? tokens_per_step * static_cast<double>(steps_run) / train_seconds : 0.0;
  metrics.write({{"event", "end"},
                 {"steps", cfg.steps},
                 {"start_step", start_step},
                 {"first_train_loss", first_loss},
                 {"final_train_loss", last_loss},
                 {"final_val_loss", last_val},
                 {"total_time_s", total_time},
                 {"train_time_s", train_seconds},
                 {"mean_tokens_per_s", mean_tps}});
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "done: train loss %.4f -> %.4f, val loss %.4f, %.1f s total, %s tok/s mean",
                first_loss, last_loss, last_val, total_time, human_count(mean_tps).c_str());
  console.line(buf);
  if (!cfg.trace.empty()) {
    write_trace(trace, cfg.trace, *group);
    console.line("trace written to " + cfg.trace);
  }
  group->barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace apps::train

int main(int argc, char** argv) {
  int rank = 0, size = 1;
  try {
    return apps::train::run(argc, argv);
  } catch (const apps::train::UsageError& e) {
    // Every rank reaches the same verdict: rank 0 reports it, all exit cleanly.
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
    return 2;
  } catch (const apps::train::CheckpointError& e) {
    // Checkpoint calls fail collectively (same error on every rank): rank 0 reports, all exit.
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    int init = 0;
    MPI_Initialized(&init);
    if (init) {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    std::cerr << "fsdp-train [rank " << rank << "]: error: " << e.what() << std::endl;
    // Peers may be blocked in a collective: abort the whole job instead of hanging.
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
