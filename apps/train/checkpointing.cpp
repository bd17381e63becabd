// fsdp-train's checkpoint calls (checkpointing.h) over fsdp::checkpoint.
#include "train/checkpointing.h"

#include <ATen/ops/tensor.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "fsdp/accounting/budget.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/checkpoint/safetensors.h"
#include "models/lora.h"
#include "models/model_config.h"
#include "train/model_setup.h"
#include "fsdp/checkpoint/import_optimizer.h"
#include "fsdp/common/check.h"
#include "fsdp/optim/optimizer_state.h"
#include "fsdp/runtime/fully_shard.h"
#include "train/errors.h"
#include "train/reporting.h"
#include "train/resume_checks.h"

namespace apps::train {
namespace {

/// Runs a collective checkpoint call, turning its fsdp::Error into a CheckpointError (every rank
/// reaches it: rank 0 reports it), except a failure of this rank's own (is_per_rank_failure).
template <typename F>
auto checkpoint_call(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const fsdp::OutOfMemory&) {
    throw;  // the memory budget's report (failures.h)
  } catch (const fsdp::Error& e) {
    // A timeout inside a save or a load is this rank's to report (its peers may be the stalled
    // ones, or it is): the same error, its kind kept, with the operation in front.
    if (is_per_rank_failure(e)) throw fsdp::Error(e.kind(), e.where(), what + ": " + e.message());
    throw CheckpointError(what + ": " + e.what());
  }
}

// Test-only fault injection (apps/tests/stall_e2e.py): FSDP_TRAIN_INJECT_STALL="PHASE:RANK", PHASE
// save or load, stops rank RANK (SIGSTOP, a rank that neither dies nor answers) as it enters that
// checkpoint operation, while its peers go on into the operation's collectives. Unset: nothing.
// Throws UsageError for a malformed value.
void maybe_stall(const char* phase, int rank) {
  const char* v = std::getenv("FSDP_TRAIN_INJECT_STALL");
  if (v == nullptr || *v == '\0') return;
  char which[8] = {0};
  int victim = -1, used = 0;
  if (std::sscanf(v, "%7[a-z]:%d%n", which, &victim, &used) != 2 || v[used] != '\0' || victim < 0 ||
      (std::string(which) != "save" && std::string(which) != "load")) {
    throw UsageError(std::string("FSDP_TRAIN_INJECT_STALL='") + v + "': expected save:RANK or load:RANK");
  }
  if (std::string(which) == phase && victim == rank) std::raise(SIGSTOP);
}

// [Note: checkpoint contents] The model's settings that no parameter shape shows, recorded in the
// TrainState's doubles so that a resume with another (a Llama from --init-from-hf resumed as a
// preset of another rope_theta) is refused instead of training another function.
// The head counts are among them: nano with --n-head 2 or 8 has nano's shapes. So is LoRA's alpha
// (its rank shows in the adapters' shapes). Checkpoints written before a key existed lack it and
// are not checked for it.
std::map<std::string, double> model_settings(const models::ModelConfig& m, const TrainConfig& c) {
  std::map<std::string, double> s{{"model.n_head", static_cast<double>(m.n_head())}};
  if (m.is_llama()) {
    s["model.norm_eps"] = m.llama().rms_eps;
    s["model.rope_theta"] = m.llama().rope_theta;
    s["model.n_kv_head"] = static_cast<double>(m.n_kv_head());
  } else {
    s["model.norm_eps"] = m.gpt().layer_norm_eps;
  }
  if (c.lora_rank > 0) s["model.lora_alpha"] = c.lora_alpha;
  return s;
}

std::string shortest(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

}  // namespace

std::string resolve_auto_resume(const std::string& resume, const std::string& save_dir,
                                fsdp::comm::ProcessGroup& group) {
  if (resume != "auto") return resume;
  std::error_code ec;
  const bool mine = std::filesystem::is_directory(save_dir, ec) && !fsdp::checkpoint::list_checkpoints(save_dir).empty();
  const std::vector<std::string> all = fsdp::comm::all_gather_strings(group, mine ? "1" : "0");
  const auto found = std::count(all.begin(), all.end(), std::string("1"));
  if (found != 0 && found != static_cast<int64_t>(all.size())) {
    std::string which;
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r] == "1") which += (which.empty() ? "" : ", ") + std::to_string(r);
    }
    throw CheckpointError("--resume auto: only rank(s) " + which + " of " + std::to_string(all.size()) +
                          " find a complete checkpoint in --save " + save_dir +
                          " (give every rank the same shared directory)");
  }
  return found != 0 ? "latest" : "";
}

Resumed resume(const TrainConfig& c, const models::ModelConfig& model_config,
               const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
               LossScaling& loss_scaling, const fsdp::comm::ProcessGroupPtr& group) {
  Resumed r;
  if (c.resume.empty()) {
    if (!c.import_optimizer_path.empty()) {
      checkpoint_call("--import-optimizer " + c.import_optimizer_path, [&] {
        fsdp::checkpoint::ImportOptimizerOptions io;
        io.param_names = fsdp::checkpoint::optimizer_param_names(model, optimizer);
        fsdp::checkpoint::import_optimizer(c.import_optimizer_path, model, optimizer, group, io);
      });
      for (const auto& sp : fsdp::sharded_parameters(model)) {
        if (const auto state = fsdp::optim::get_param_state(optimizer, sp.tensor)) {
          r.progress.optimizer_step_offset = std::max(r.progress.optimizer_step_offset, state->step);
        }
      }
    }
    return r;
  }
  FSDP_CHECK(c.resume != "auto", fsdp::ErrorKind::kState, fsdp::ErrorContext{}, "--resume auto is resolved first");
  const bool in_save = c.resume == "latest";
  const std::string path = in_save ? c.save : c.resume;
  fsdp::checkpoint::TrainState st;
  const auto t0 = Clock::now();
  const std::string asked = c.resume_asked.empty() ? c.resume : c.resume_asked;  // auto resolves to latest
  const std::string what = in_save ? "--resume " + asked + " (the newest in --save " + c.save + ")"
                                   : "--resume " + path;
  if (std::error_code ec; !std::filesystem::is_directory(path, ec)) {  // named once, with what --resume takes
    throw UsageError(what + ": no such directory" + (std::filesystem::exists(path, ec) ? " (a file is there)" : "") +
                     "; --resume takes a checkpoint directory (DIR/step-000000300), a directory of checkpoints, "
                     "'latest' or 'auto' (the newest in --save)");
  }
  r.path = checkpoint_call(what, [&] {
    maybe_stall("load", group->rank());
    try {
      return fsdp::checkpoint::load_sharded(path, model, &optimizer, &st, group);
    } catch (const fsdp::Error& e) {
      // [Note: no silent fallback] The newest checkpoint's files are damaged: the run stops, and
      // says which older checkpoint an explicit --resume could take instead.
      const bool adapters = e.message().find(".lora_A.") != std::string::npos ||
                            e.message().find(".lora_B.") != std::string::npos;
      if (e.kind() == fsdp::ErrorKind::kInvalidArgument && adapters) {  // the LoRA flags differ from the writer's
        throw fsdp::Error(e.kind(), e.where(),
                          "the checkpoint's LoRA adapters are not this run's (another --lora-rank or "
                          "--lora-target-modules, or adapters on one side only): resume with the --lora-* flags "
                          "that wrote it. " + e.message());
      }
      if (!in_save || e.kind() != fsdp::ErrorKind::kCorruptData) throw;
      const std::string said = e.message();
      if (said.find("name it explicitly") != std::string::npos ||
          said.find("no other complete checkpoint") != std::string::npos) {
        throw;  // resolving the directory refused, and named the older checkpoint itself
      }
      const std::vector<std::string> all = fsdp::checkpoint::list_checkpoints(c.save);
      std::string newest;
      try {
        newest = fsdp::checkpoint::resolve_checkpoint(c.save);
      } catch (const fsdp::Error&) {
      }
      std::string older;
      for (const std::string& ck : all) {
        if (std::filesystem::path(ck).filename() != std::filesystem::path(newest).filename()) older = ck;
      }
      throw fsdp::Error(e.kind(), e.where(),
                        said + (older.empty() ? " (no other complete checkpoint in '" + c.save + "')"
                                                     : "; to resume from an older checkpoint, name it explicitly, e.g. '" +
                                                           older + "'"));
    }
  });
  r.load_s = seconds_since(t0);
  for (const auto& [key, value] : model_settings(model_config, c)) {
    const auto it = st.doubles.find(key);
    if (it != st.doubles.end() && it->second != value) {
      throw UsageError(what + ": the checkpoint's model has " + key.substr(6) + " " + shortest(it->second) +
                       ", this run's " + shortest(value) + " (resume with the flags that built it: the same --model "
                       "and overrides, --init-from-hf directory and --lora-* flags)");
    }
  }
  r.progress = validated_progress(c, r.path, st, optimizer, model);
  check_resumed_optimizer_options(c, r.path, optimizer);
  if (auto it = st.tensors.find("rng"); it != st.tensors.end()) {
    fsdp::checkpoint::set_cpu_rng_state(it->second);
  }
  loss_scaling.load_state(st);
  return r;
}

Saved save(const TrainConfig& c, const TrainProgress& progress, const models::ModelConfig& model_config,
           const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
           const LossScaling& loss_scaling, const fsdp::comm::ProcessGroupPtr& group) {
  fsdp::checkpoint::TrainState st;
  for (const auto& [key, value] : model_settings(model_config, c)) st.doubles[key] = value;
  st.ints["step"] = progress.step;
  st.ints["lr_step"] = progress.lr_step;
  if (progress.optimizer_step_offset > 0) st.ints["optimizer_step_offset"] = progress.optimizer_step_offset;
  st.ints["sampler_pos"] = progress.batch_pos * c.global_batch_size;
  st.tensors["rng"] = fsdp::checkpoint::cpu_rng_state();
  loss_scaling.save_state(st);
  fsdp::checkpoint::SaveOptions so;
  so.keep_last_k = static_cast<int>(c.keep);
  const auto t0 = Clock::now();
  std::string name = checkpoint_call("--save " + c.save, [&] {
    maybe_stall("save", group->rank());
    return fsdp::checkpoint::save_sharded(c.save, model, &optimizer, st, group, so);
  });
  const double save_s = seconds_since(t0);
  return {c.save + "/" + name, save_s};
}

double import_weights(const TrainConfig& c, const std::shared_ptr<torch::nn::Module>& model,
                      const fsdp::comm::ProcessGroupPtr& group) {
  if (c.import_path.empty()) return 0.0;
  // --import reads one torch.save file; the other kinds of weights have flags of their own.
  namespace fs = std::filesystem;
  const fs::path p(c.import_path);
  std::error_code ec;
  const auto has = [&](const char* name) { return fs::exists(p / name, ec); };
  if (fs::is_directory(p, ec)) {
    const bool sharded = has("manifest.json") || has("latest");
    const bool hf = has("config.json") && (has("model.safetensors") || has("model.safetensors.index.json"));
    throw UsageError("--import " + c.import_path + " is a directory; --import reads one file written by --export or "
                     "torch.save" + (sharded ? ": this is a sharded checkpoint, continue it with --resume " + c.import_path
                                     : hf    ? ": this is a Hugging Face model, start from it with --init-from-hf " +
                                                c.import_path
                                             : ""));
  }
  if (p.extension() == ".safetensors") {
    throw UsageError("--import " + c.import_path + " is a safetensors file; --import reads one file written by --export "
                     "or torch.save: start from a Hugging Face model with --init-from-hf " + p.parent_path().string() +
                     " (its directory, config.json beside the weights)");
  }
  const auto t0 = Clock::now();
  checkpoint_call("--import " + c.import_path,
                  [&] { fsdp::checkpoint::import_full(c.import_path, model, group); });
  return seconds_since(t0);
}

double import_hf_weights(const TrainConfig& c, const models::ModelConfig& model_config,
                         const std::shared_ptr<torch::nn::Module>& model, const fsdp::comm::ProcessGroupPtr& group) {
  if (c.init_from_hf.empty() || !c.resume.empty()) return 0.0;  // resuming: the checkpoint holds the weights
  const auto t0 = Clock::now();
  checkpoint_call("--init-from-hf " + c.init_from_hf, [&] {
    fsdp::checkpoint::SafetensorsImportOptions o = models::hf_import_options(model_config);
    if (c.lora_rank > 0) o.leave = models::is_lora_param;  // the adapters keep their initial values
    fsdp::checkpoint::import_safetensors(c.init_from_hf, model, group, o);
  });
  return seconds_since(t0);
}

double export_hf_weights(const TrainConfig& c, const models::ModelConfig& model_config,
                         const std::shared_ptr<torch::nn::Module>& model, const fsdp::comm::ProcessGroupPtr& group) {
  const auto t0 = Clock::now();
  checkpoint_call("--export-hf " + c.export_hf, [&] {
    fsdp::checkpoint::SafetensorsExportOptions o;
    o.target_of = [&model_config](const std::string& param) { return models::hf_tensor(model_config, param); };
    const bool bf16 = c.export_hf_dtype == "bf16";
    if (bf16) o.dtype = at::kBFloat16;
    o.max_file_bytes = kHfMaxFileBytes;
    nlohmann::json config = models::model_config_to_hf(model_config, bf16 ? "bfloat16" : "float32");
    if (!c.init_from_hf.empty()) {  // the source's other fields (token ids, dropout, ...) stay as they were
      std::ifstream in((std::filesystem::path(c.init_from_hf) / "config.json").string());
      nlohmann::json source = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (source.is_object()) {
        // The published dropout rates stay: fsdp-train trains without dropout, but the model is
        // the source's, and a later fine-tune in transformers expects its rates.
        for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "attention_dropout"}) {
          if (source.contains(key)) config.erase(key);
        }
        source.update(config);
        config = source;
      }
    }
    o.extra_files["config.json"] = config.dump(2) + "\n";
    if (!c.init_from_hf.empty()) {
      // The files that make the directory usable beside the weights: the tokenizer's and the
      // generation defaults, copied as they are.
      for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                               "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt"}) {
        std::ifstream in((std::filesystem::path(c.init_from_hf) / name).string(), std::ios::binary);
        if (in) o.extra_files[name] = std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
    }
    if (c.lora_rank > 0) models::merge_adapters_on_export(o, lora_config_of(c), models::gather_adapters(model));
    fsdp::checkpoint::export_safetensors(c.export_hf, model, group, o);
  });
  return seconds_since(t0);
}

double export_adapter_weights(const TrainConfig& c, const models::ModelConfig& model_config,
                              const std::shared_ptr<torch::nn::Module>& model, const fsdp::comm::ProcessGroupPtr& group) {
  const auto t0 = Clock::now();
  checkpoint_call("--export-adapter " + c.export_adapter, [&] {
    fsdp::checkpoint::export_safetensors(c.export_adapter, model, group,
                                         models::peft_export_options(lora_config_of(c), model_config, c.init_from_hf));
  });
  return seconds_since(t0);
}

double export_weights(const TrainConfig& c, const std::shared_ptr<torch::nn::Module>& model,
                      const fsdp::comm::ProcessGroupPtr& group) {
  const auto t0 = Clock::now();
  checkpoint_call("--export " + c.export_path,
                  [&] { fsdp::checkpoint::export_full(c.export_path, model, group); });
  return seconds_since(t0);
}

}  // namespace apps::train
