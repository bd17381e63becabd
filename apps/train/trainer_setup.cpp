// fsdp-train's set-up (trainer_impl.h): data, model, sharding, import or resume, in the order of
// their collectives.
#include "train/trainer_impl.h"

#include <ATen/Parallel.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "fsdp/accounting/budget.h"
#include "fsdp/common/activity.h"
#include "fsdp/common/check.h"
#include "fsdp/common/cpu_info.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/materialize.h"
#include "train/checkpointing.h"
#include "train/errors.h"
#include "train/preflight.h"
#include "train/rank_agreement.h"

namespace apps::train {

Trainer::Trainer(const TrainConfig& c, fsdp::comm::ProcessGroupPtr group, bool heap_retained)
    : cfg_(c),
      group_(std::move(group)),
      rank_(group_->rank()),
      world_(group_->size()),
      console_(rank_,
               c.progress == "bar" || (c.progress == "auto" && ::isatty(STDOUT_FILENO) != 0)),
      batch_(resolve_batch(c, world_)),
      fsdp_options_(resolve_fsdp_options(c, *group_)),
      root_options_(root_options_of(fsdp_options_)),
      loss_scaling_(c.mixed_precision == "fp16"),
      trace_(rank_, !c.trace.empty()),
      inject_nonfinite_(nonfinite_injection_from_env()) {
  facts_.threads = resolve_threads(cfg_);
  at::set_num_threads(facts_.threads);
  // Data: rank 0 tokenizes first (a barrier).
  // Pre-tokenized --data (uint16 ids) needs no tokenizer: the vocabulary is --init-from-hf's, or
  // --vocab-size.
  const bool pretokenized = pretokenized_data(cfg_);
  if (pretokenized && !cfg_.tokenizer.empty()) {
    throw UsageError("--tokenizer: a pre-tokenized --data (" + cfg_.data + ") has no text to read with it");
  }
  if (!pretokenized && cfg_.data_dtype != "uint16") {
    throw UsageError("--data-dtype " + cfg_.data_dtype + " applies to pre-tokenized .bin ids, not the text of " +
                     (cfg_.data.empty() ? cfg_.data_dir + "/corpus" : cfg_.data));
  }
  if (!pretokenized) {
    facts_.tokenizer_path = tokenizer_path(cfg_);
    try {  // the same file on every rank: the same verdict, a usage error rather than an abort
      tokenizer_ = std::make_unique<data::Tokenizer>(facts_.tokenizer_path);
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string(cfg_.tokenizer.empty() ? "--data-dir / --vocab-size: " : "--tokenizer: ") + e.what());
    }
  } else if (cfg_.sample_tokens > 0) {
    throw UsageError("--sample-tokens: a pre-tokenized --data (" + cfg_.data +
                     ") comes with no tokenizer to encode the prompt and decode the sample");
  }
  model_config_ =
      resolve_model(cfg_, tokenizer_ ? tokenizer_->vocab_size() : cfg_.vocab_size, /*tokenizer_vocab=*/!pretokenized);
  if (cfg_.init_from_hf.empty()) {
    const int64_t preset_vocab = fsdp::planner::preset_vocab_size(cfg_.model);
    if (preset_vocab != model_config_.vocab_size()) {
      console_.line("note: " + cfg_.model + " is built at " + (tokenizer_ ? "the tokenizer's" : "--vocab-size's") +
                    " vocabulary of " + std::to_string(model_config_.vocab_size()) + " tokens (" +
                    human_count(static_cast<double>(model_config_.num_params())) + " params); fsdp-plan and --dry-run take "
                    "the preset at its own " + std::to_string(preset_vocab) + " unless given --vocab-size " +
                    std::to_string(model_config_.vocab_size()));
    }
  }
  // Everything the end of the run needs is checked now, before any data or training.
  const models::ModelConfig& mcfg = model_config_;
  PreflightFacts pf;
  pf.vocab_size = mcfg.vocab_size();
  pf.prompt_tokens = tokenizer_ ? static_cast<int64_t>(tokenizer_->encode(cfg_.sample_prompt).size()) : 0;
  pf.checkpoint_bytes = checkpoint_bytes_of(mcfg.num_params());
  pf.export_bytes = export_bytes_of(mcfg.num_params());
  pf.build_bytes = cfg_.meta_init ? 16 * mcfg.num_params() / world_ : 4 * mcfg.num_params();
  preflight(cfg_, pf, *group_);
  // Data: rank 0 tokenizes first (a barrier).
  {
    const fsdp::ActivityScope activity(nullptr, "loading data");
    corpus_ = load_corpus(cfg_, tokenizer_.get(), mcfg.vocab_size(), *group_, console_);
    check_ranks_agree(data_settings(*corpus_.train, *corpus_.val), *group_,
                      "every rank must read the same text with the same tokenizer: --data, --data-dir");
    train_sampler_.emplace(make_sampler(corpus_.train, cfg_, rank_, world_, "training"));
    val_sampler_.emplace(make_sampler(corpus_.val, cfg_, rank_, world_, "validation"));
    // A validation pass covers the set at most once: batches past its end would repeat windows.
    const int64_t whole = std::max<int64_t>(1, val_sampler_->eval_windows() / val_sampler_->global_batch_size());
    eval_batches_ = std::min(cfg_.eval_batches, whole);
    if (eval_batches_ < cfg_.eval_batches) {
      console_.line("validation: --eval-batches " + std::to_string(cfg_.eval_batches) + " is more than the set holds (" +
                    std::to_string(val_sampler_->eval_windows()) + " sequences of " +
                    std::to_string(val_sampler_->seq_len()) + " tokens, " + std::to_string(whole) +
                    " global batch(es)): each pass evaluates " + std::to_string(whole));
    }
  }

  // Model: identical init on every rank (checked), then one unit per block plus the root.
  // --meta-init: built on the meta device, sharded, then each rank writes its rows module by
  // module with the values of the CPU build (no rank holds the full model, so the checksum check
  // of the full parameters cannot run; every rank draws the same stream from --seed).
  torch::manual_seed(cfg_.seed);
  const models::LoraConfig lora = lora_config_of(cfg_);
  {
    const fsdp::ActivityScope activity(nullptr, "model build");
    model_ = models::build_model(mcfg, cfg_.meta_init ? at::kMeta : at::kCPU);
    if (lora.enabled()) {
      try {
        facts_.lora_layers = models::add_lora(*model_, lora, mcfg, at::TensorOptions().device(cfg_.meta_init ? at::kMeta : at::kCPU),
                                              cfg_.seed);
      } catch (const std::invalid_argument& e) {
        throw UsageError(std::string("--lora-target-modules: ") + e.what());
      }
      facts_.lora_trainable = models::lora_counts(*model_).trainable;
      if (cfg_.init_from_hf.empty()) {
        console_.line("note: LoRA over a randomly initialised " + cfg_.model + " (no --init-from-hf): the adapters "
                      "fit this base only; --export-hf writes it merged with them, --export-adapter's "
                      "base_model_name_or_path is null");
      }
    }
    model_->set_activation_checkpointing(cfg_.activation_checkpointing);
    if (!cfg_.meta_init) check_identical_init(*model_, *group_);
  }
  try {
    const fsdp::ActivityScope activity(nullptr, "fully_shard");
    fsdp::fully_shard_tree(model_, group_, models::block_wrap_policy(mcfg), fsdp_options_, root_options_);
  } catch (const fsdp::OutOfMemory&) {
    throw;  // the memory budget, not the settings
  } catch (const fsdp::Error& e) {
    if (is_per_rank_failure(e)) throw;  // a stalled or failed collective, not the settings
    throw UsageError(std::string("the FSDP engine rejected these settings: ") + e.what());
  }
  // --init-from-hf writes every parameter's rows from the file: a meta build needs no init.
  // With adapters, the meta build is materialised first in any case: the adapters take their
  // initial values (and a base that an import overwrites is zeroed, not drawn).
  if (cfg_.meta_init && lora.enabled()) {
    fsdp::materialize(model_, models::lora_init(cfg_.init_from_hf.empty() ? models::model_init(mcfg) : nullptr, cfg_.seed));
  } else if (cfg_.meta_init && cfg_.init_from_hf.empty()) {
    fsdp::materialize(model_, models::model_init(mcfg));
  }
  facts_.import_s = import_weights(cfg_, model_, group_) + import_hf_weights(cfg_, mcfg, model_, group_);
  // The generator training draws from (LoRA's dropout masks) starts from --seed, whatever the build
  // drew before (a meta build of a base read from a file draws nothing): --meta-init changes no step.
  torch::manual_seed(cfg_.seed);
  optimizer_ = make_optimizer(model_, mcfg, cfg_);
  const Resumed resumed = resume(cfg_, mcfg, model_, *optimizer_, loss_scaling_, group_);
  progress_ = resumed.progress;

  // A run asked to resume appends, also when --resume auto found no checkpoint yet (an elastic
  // restart before the first save keeps its earlier attempts' events).
  metrics_.emplace(cfg_.metrics, rank_, cfg_.on_output_error == "stop", !cfg_.resume_asked.empty() || !cfg_.resume.empty());
  facts_.model = cfg_.init_from_hf.empty() ? cfg_.model : mcfg.hf_architecture() + " from " + cfg_.init_from_hf;
  facts_.family = mcfg.family();
  facts_.n_layer = mcfg.n_layer();
  facts_.n_head = mcfg.n_head();
  facts_.n_kv_head = mcfg.n_kv_head();
  facts_.n_embd = mcfg.width();
  facts_.block_size = mcfg.context();
  facts_.vocab_size = mcfg.vocab_size();
  facts_.attention = mcfg.attention();
  facts_.num_params = mcfg.num_params();
  facts_.train_path = corpus_.train_path;
  facts_.val_path = corpus_.val_path;
  facts_.train_tokens = corpus_.train->size();
  facts_.val_tokens = corpus_.val->size();
  facts_.backend = group_->backend_name();
  facts_.world_size = world_;
  facts_.host_of_ranks = group_->host_of_ranks();
  facts_.strategy = fsdp::to_string(fsdp_options_.strategy);
  facts_.forward_prefetch = fsdp_options_.forward_prefetch;
  facts_.hybrid_shard_group_size = fsdp_options_.hybrid_shard_group_size;
  {  // the effective size: the shard group's own is off (the backward gathers over it anyway)
    const int g = fsdp_options_.reshard_after_forward_group_size;
    const int shard = fsdp_options_.hybrid_shard_group_size > 0 ? fsdp_options_.hybrid_shard_group_size : world_;
    facts_.reshard_after_forward_group_size = g < shard ? g : 0;
    const int h = fsdp_options_.collective_host_size;  // 1 or the shard group's size: one stage, off
    facts_.collective_host_size = h > 1 && h < shard ? h : 0;
  }
  facts_.bucket_cap_bytes = fsdp_options_.bucket_cap_bytes.value_or(fsdp::kDefaultBucketCapBytes);
  facts_.root_output_fp32 = root_options_.mixed_precision.output_dtype.has_value();
  facts_.micro_batch_size = batch_.micro;
  facts_.accumulation_steps = batch_.accum;
  facts_.heap_retained = heap_retained;
  facts_.resumed_from = resumed.path;
  facts_.start_step = resumed.progress.step;
  facts_.load_s = resumed.load_s;
  const fsdp::CpuInfo& cpu = fsdp::cpu_info();
  metrics_->write(config_event(cfg_, facts_, cpu));
  print_start(console_, cfg_, facts_, cpu);
}

}  // namespace apps::train
