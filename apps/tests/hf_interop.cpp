// The fsdp-cpp side of the Hugging Face interop test (hf_interop.py): under mpirun, builds the model
// of a Hugging Face directory's config.json (GPT2LMHeadModel: the GPT; LlamaForCausalLM: the
// Llama) on the meta device, shards it (one unit per block), imports its
// safetensors straight into the shards, and writes (rank 0) the logits of a fixed batch; then
// optionally trains K AdamW steps on that batch, exports the model as a Hugging Face directory,
// and writes the logits after training and the greedy continuation of the batch's first row.
//
//   hf_interop --hf DIR --tokens FILE --batch B --seq T --strategy S --logits OUT
//              [--train-steps K --lr LR --export DIR2 [--export-max-file-bytes N]
//               --logits-after OUT2 --greedy N --greedy-prompt P --greedy-out OUT3]
//              [--peak-json OUT4]
//
// FILE: B x T int64 token ids (raw, little-endian); OUT, OUT2: B x T x V float32 (raw); OUT3: N
// int64 ids continuing the first P tokens of the batch's first row. OUT4 (rank 0): each rank's
// counted bytes around the import (JSON; bench/hf_import_peak.py). Exit 1 with one line on stderr (rank 0) for any error.
#include <CLI/CLI.hpp>
#include <torch/optim/adamw.h>

#include <fstream>
#include <iostream>
#include <iterator>

#include "fsdp/accounting/memory.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/comm/world.h"
#include "fsdp/fsdp.h"
#include "models/gpt.h"
#include "models/model_config.h"

namespace {

// The model of a config.json (its family's: GPT or Llama), built on the meta device and sharded
// with one unit per block.
struct Model {
  apps::models::ModelConfig config;
  std::shared_ptr<apps::models::CausalLMImpl> root;
  at::Tensor forward(const at::Tensor& idx) const { return fsdp::call(root, idx); }  // (B, T) -> (B, T, V)
};

Model build(const nlohmann::json& c, const fsdp::FullyShardOptions& o, const fsdp::comm::ProcessGroupPtr& world) {
  Model m{apps::models::model_config_from_hf(c), nullptr};
  m.root = apps::models::build_model(m.config, at::kMeta);
  fsdp::fully_shard_tree(m.root, world, apps::models::block_wrap_policy(m.config), o);
  return m;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open '" + path + "'");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_raw(const std::string& path, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

at::Tensor logits_of(const Model& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model.forward(tokens).to(at::kFloat);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-cpp side of the Hugging Face interop test"};
  std::string hf, tokens_path, strategy = "full_shard", logits_out, export_dir, logits_after, greedy_out, peak_json;
  int64_t batch = 0, seq = 0, train_steps = 0, greedy = 0, greedy_prompt = 1, export_max_file_bytes = 0;
  double lr = 1e-3;
  app.add_option("--hf", hf)->required();
  app.add_option("--tokens", tokens_path)->required();
  app.add_option("--batch", batch)->required();
  app.add_option("--seq", seq)->required();
  app.add_option("--strategy", strategy);
  app.add_option("--logits", logits_out)->required();
  app.add_option("--train-steps", train_steps);
  app.add_option("--lr", lr);
  app.add_option("--export", export_dir);
  app.add_option("--export-max-file-bytes", export_max_file_bytes);
  app.add_option("--logits-after", logits_after);
  app.add_option("--greedy", greedy);
  app.add_option("--greedy-prompt", greedy_prompt);
  app.add_option("--greedy-out", greedy_out);
  app.add_option("--peak-json", peak_json);
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  fsdp::accounting::install_counting_allocator();
  fsdp::comm::init_launcher();
  auto world = fsdp::comm::world_from_env("auto");
  const int rank = world->rank(), n = world->size();
  try {
    fsdp::FullyShardOptions o;
    o.strategy = fsdp::parse_sharding_strategy(strategy);
    if (o.strategy == fsdp::ShardingStrategy::kHybridShard) o.hybrid_shard_group_size = 2;
    const Model model = build(nlohmann::json::parse(read_text(hf + "/config.json")), o, world);
    const int64_t before_bytes = fsdp::accounting::current_bytes();  // the shards, allocated by fully_shard
    fsdp::accounting::reset_peak_bytes();
    fsdp::checkpoint::import_safetensors(hf, model.root, world, apps::models::hf_import_options(model.config));
    if (!peak_json.empty()) {
      // [rank][before, peak during the import, largest tensor of the model]
      int64_t largest = 0;
      for (const auto& sp : fsdp::sharded_parameters(model.root)) {
        int64_t numel = 1;
        for (int64_t d : sp.param->shape) numel *= d;
        largest = std::max<int64_t>(largest, numel * static_cast<int64_t>(sp.tensor.element_size()));
      }
      at::Tensor mine = at::tensor({before_bytes, fsdp::accounting::peak_bytes(), largest}, at::kLong);
      at::Tensor all = at::empty({3 * n}, at::kLong);
      world->all_gather_into_tensor(all, mine)->wait();
      if (rank == 0) {
        nlohmann::json j = nlohmann::json::array();
        for (int r = 0; r < n; ++r) {
          j.push_back({{"rank", r}, {"before_bytes", all[3 * r].item<int64_t>()},
                       {"peak_bytes", all[3 * r + 1].item<int64_t>()}, {"largest_tensor_bytes", all[3 * r + 2].item<int64_t>()}});
        }
        std::ofstream(peak_json) << j.dump(2) << "\n";
      }
    }

    const std::string ids = read_text(tokens_path);
    if (static_cast<int64_t>(ids.size()) != batch * seq * 8) {
      throw std::runtime_error("--tokens holds " + std::to_string(ids.size()) + " bytes, expected B x T x 8");
    }
    at::Tensor tokens = at::empty({batch, seq}, at::kLong);
    std::memcpy(tokens.data_ptr(), ids.data(), ids.size());
    at::Tensor logits = logits_of(model, tokens);
    if (rank == 0) write_raw(logits_out, logits);

    if (train_steps > 0) {
      torch::optim::AdamW opt(fsdp::parameters(model.root), torch::optim::AdamWOptions(lr).weight_decay(0.0));
      for (int64_t k = 0; k < train_steps; ++k) {
        opt.zero_grad();
        at::Tensor out = model.forward(tokens.narrow(1, 0, seq - 1));
        apps::models::gpt_loss(out, tokens.narrow(1, 1, seq - 1)).backward();
        opt.step();
      }
    }
    if (!export_dir.empty()) {
      fsdp::checkpoint::SafetensorsExportOptions eo;
      eo.target_of = [&model](const std::string& p) { return apps::models::hf_tensor(model.config, p); };
      eo.max_file_bytes = export_max_file_bytes;
      eo.extra_files["config.json"] = apps::models::model_config_to_hf(model.config).dump(2) + "\n";
      fsdp::checkpoint::export_safetensors(export_dir, model.root, world, eo);
    }
    if (!logits_after.empty()) {
      at::Tensor after = logits_of(model, tokens);
      if (rank == 0) write_raw(logits_after, after);
    }
    if (greedy > 0) {
      at::NoGradGuard no_grad;
      at::Tensor ids_now = tokens.narrow(0, 0, 1).narrow(1, 0, greedy_prompt);
      std::vector<int64_t> out;
      for (int64_t k = 0; k < greedy; ++k) {
        const int64_t T = std::min<int64_t>(ids_now.size(1), model.config.context());
        at::Tensor next = model.forward(ids_now.narrow(1, ids_now.size(1) - T, T))
                              .select(1, T - 1)
                              .argmax(-1, /*keepdim=*/true);  // (1, 1)
        out.push_back(next.item<int64_t>());
        ids_now = at::cat({ids_now, next}, 1);
      }
      if (rank == 0) write_raw(greedy_out, at::tensor(out, at::kLong));
    }
  } catch (const std::exception& e) {
    if (rank == 0 || n == 1) std::cerr << "hf_interop: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
