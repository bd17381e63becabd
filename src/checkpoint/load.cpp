// load_sharded. Resharding rule and load phases: docs/checkpoints.md, "Resharding rule".
// Phases end with an Agreement (agreement.h, [Note: error agreement]).
#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <string>

#include "fsdp/common/hash.h"
#include "agreement.h"
#include "dtypes.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/common/check.h"
#include "fsdp/shard/layout.h"
#include "io.h"
#include "manifest.h"
#include "optimizer_section.h"
#include "param_views.h"
#include "rank_file.h"

namespace fsdp::checkpoint {

namespace {

// Everything a load writes, read and verified before anything is written.
struct Staged {
  std::vector<ParamView> views;
  std::vector<at::Tensor> params;  // per view: (rows, row_numel)
  StagedOptimizer optimizer;       // per view and group, when the optimizer is loaded
  std::map<std::string, at::Tensor> extra, buffers;
};

at::Tensor read_whole(RankFileReader& files, const std::string& tn, const TensorEntry& e) {
  return files.read_rows(tn, e, 0, row_shape(e.shape)[0]);
}

void stage_model(Staged& s, const Manifest& m, RankFileReader& files,
                 const std::shared_ptr<torch::nn::Module>& root, const comm::ProcessGroup& g) {
  const ErrorContext& where = files.where();
  s.views = param_views(root, g, where);
  const auto model = param_infos(s.views, where);
  FSDP_CHECK(m.fingerprint == fingerprint(model), ErrorKind::kInvalidArgument, where,
             "the checkpoint is of another model (fingerprint ", m.fingerprint, ", model's ",
             fingerprint(model), "):", describe_param_diff(m.params, model));
  for (const auto& v : s.views) {
    const std::string tn = "model/" + v.name;
    auto it = m.tensors.find(tn);
    FSDP_CHECK(it != m.tensors.end(), ErrorKind::kCorruptData, where, "tensor '", tn,
               "' is missing from the manifest");
    const auto& e = it->second;
    const std::string dt = dtype_name(v.tensor.scalar_type(), where);
    FSDP_CHECK(e.shape == v.shape && e.dtype == dt, ErrorKind::kInvalidArgument, where, "tensor '",
               tn, "' is ", shard::shape_to_string(e.shape), " ", e.dtype,
               " in the checkpoint, the model has ", shard::shape_to_string(v.shape), " ", dt);
    s.params.push_back(files.read_rows(tn, e, v.row_begin, v.rows));
  }
}

void stage_extra_and_buffers(Staged& s, const Manifest& m, RankFileReader& files,
                             const std::shared_ptr<torch::nn::Module>& root, bool with_extra) {
  const ErrorContext& where = files.where();
  if (with_extra) {
    for (const auto& k : m.extra_tensors) {
      const std::string tn = "extra/" + k;
      auto it = m.tensors.find(tn);
      FSDP_CHECK(it != m.tensors.end(), ErrorKind::kCorruptData, where, "tensor '", tn,
                 "' is missing from the manifest");
      s.extra[k] = read_whole(files, tn, it->second).reshape(it->second.shape);
    }
  }
  for (const auto& kv : root->named_buffers(/*recurse=*/true)) {
    if (!kv.value().defined()) continue;
    const std::string tn = "buffer/" + kv.key();
    auto it = m.tensors.find(tn);
    FSDP_CHECK(it != m.tensors.end(), ErrorKind::kInvalidArgument, where, "buffer '", kv.key(),
               "' is not in the checkpoint");
    FSDP_CHECK(it->second.shape == kv.value().sizes().vec(), ErrorKind::kInvalidArgument, where,
               "buffer '", kv.key(), "' is ", shard::shape_to_string(it->second.shape),
               " in the checkpoint, the model has ", kv.value().sizes());
    s.buffers[kv.key()] = read_whole(files, tn, it->second);
  }
}

}  // namespace

std::string load_sharded(const std::string& path, const std::shared_ptr<torch::nn::Module>& root,
                         torch::optim::Optimizer* optimizer, TrainState* extra,
                         const comm::ProcessGroupPtr& group, const LoadOptions& options) {
  FSDP_CHECK(group, ErrorKind::kInvalidArgument, ErrorContext{-1, "", "load_sharded"},
             "null process group");
  auto& g = *group;
  const int rank = g.rank();
  const std::string op = "load_sharded '" + path + "'";
  Agreement agree(g, op);

  // Phase 0: every rank resolves the same checkpoint (a hash of its path, seq and manifest text,
  // max == -min). The manifest names every file's CRC-32: the same path on hosts with disks of
  // their own may hold another run's checkpoint, with the same name and sequence number.
  std::string ckpt;
  Manifest m;
  at::Tensor id = at::zeros({2}, at::kLong);
  agree.run("resolving the checkpoint", [&] {
    ckpt = resolve_checkpoint(path);
    m = read_manifest(ckpt);
    const std::string text = io::read_file((std::filesystem::path(ckpt) / "manifest.json").string());
    const int64_t h = static_cast<int64_t>(fnv1a64(ckpt + "#" + std::to_string(m.seq) + "#" + text) >> 2);
    id[0] = h;
    id[1] = -h;
  });
  g.all_reduce(id, comm::ReduceOp::kMax, comm::OpTag{"", "checkpoint load"})->wait();
  FSDP_CHECK(id[0].item<int64_t>() == -id[1].item<int64_t>(), ErrorKind::kMismatch,
             ErrorContext{rank, "", op}, "ranks resolved different checkpoints (this rank: '", ckpt,
             "'; another path, or another manifest at the same path); is the directory shared by all ranks?");

  // Phase 1: validate and stage everything (no model / optimizer / extra write yet).
  Staged s;
  const bool do_opt = optimizer && options.load_optimizer;
  agree.run("validating and reading", [&] {
    RankFileReader files(ckpt, m, ErrorContext{rank, "", "load_sharded '" + ckpt + "'"});
    stage_model(s, m, files, root, g);
    if (do_opt) s.optimizer = stage_optimizer_state(m, files, *optimizer, s.views, files.where());
    stage_extra_and_buffers(s, m, files, root, extra != nullptr);
  });

  // Phase 2: every rank has everything it needs; write.
  agree.run("applying", [&] {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < s.views.size(); ++i) {
      const auto& v = s.views[i];
      if (v.rows > 0) v.tensor.view(s.params[i].sizes()).copy_(s.params[i]);
    }
    fsdp::invalidate_unsharded(root);  // no unit may keep computing with the old values
    if (do_opt) apply_optimizer_state(*optimizer, s.views, s.optimizer, ErrorContext{rank, "", op});
    if (extra) {
      extra->ints = m.ints;
      extra->doubles = m.doubles;
      extra->tensors = s.extra;
    }
    for (const auto& kv : root->named_buffers(/*recurse=*/true)) {
      auto it = s.buffers.find(kv.key());
      if (it != s.buffers.end()) kv.value().copy_(it->second.view(kv.value().sizes()));
    }
  });
  return ckpt;
}

}  // namespace fsdp::checkpoint
