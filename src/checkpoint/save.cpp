// save_sharded. Protocol and format: docs/checkpoints.md, "Atomicity protocol (save)".
// Phases end with an Agreement (agreement.h, [Note: error agreement]).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "agreement.h"
#include "dtypes.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/check.h"
#include "io.h"
#include "manifest.h"
#include "optimizer_section.h"
#include "param_views.h"
#include "publish.h"
#include "rank_file.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string default_name(const TrainState& extra) {
  auto it = extra.ints.find("step");
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%09lld",
                static_cast<long long>(it == extra.ints.end() ? 0 : it->second));
  return buf;
}

// Test-only crash simulation: kWrite on `rank` stops its writes after fault.after_bytes bytes.
std::function<size_t(size_t)> write_budget(const FaultInjection& fault, int rank, int64_t& left) {
  if (fault.stage != FaultInjection::Stage::kWrite || fault.rank != rank) return {};
  left = fault.after_bytes;
  return [&left](size_t n) {
    const size_t ok = static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(left, n)));
    left -= static_cast<int64_t>(ok);
    return ok;
  };
}

TensorEntry whole_tensor_entry(const char* kind, const at::Tensor& t, const ErrorContext& where) {
  const auto shape = t.sizes().vec();
  return TensorEntry{kind, dtype_name(t.scalar_type(), where), shape, row_shape(shape)[1], {}};
}

// Rank 0: the manifest of what every rank wrote (reports: each rank's RankReport as JSON).
Manifest build_manifest(const std::string& dir, const std::string& name,
                        const std::shared_ptr<torch::nn::Module>& root,
                        const torch::optim::Optimizer* optimizer, const TrainState& extra,
                        const std::vector<ParamView>& views, const std::vector<int64_t>& step_flags,
                        const std::vector<std::string>& reports, const ErrorContext& where) {
  Manifest m;
  m.name = name;
  m.world_size = static_cast<int>(reports.size());
  m.params = param_infos(views, where);
  m.fingerprint = fingerprint(m.params);
  int64_t seq = 0;
  for (const auto& c : list_checkpoints(dir)) seq = std::max(seq, read_manifest(c).seq);
  m.seq = seq + 1;
  for (const auto& v : views) {
    m.tensors["model/" + v.name] = TensorEntry{"param", dtype_name(v.tensor.scalar_type(), where),
                                               v.shape, row_shape(v.shape)[1], {}};
  }
  describe_optimizer(m, optimizer, views, step_flags, where);
  m.ints = extra.ints;
  m.doubles = extra.doubles;
  for (const auto& [k, t] : extra.tensors) {
    m.extra_tensors.push_back(k);
    m.tensors["extra/" + k] = whole_tensor_entry("extra", t, where);
  }
  for (const auto& kv : root->named_buffers(/*recurse=*/true)) {
    if (kv.value().defined()) m.tensors["buffer/" + kv.key()] = whole_tensor_entry("buffer", kv.value(), where);
  }
  for (int r = 0; r < m.world_size; ++r) {
    RankReport rr = report_from_json(reports[r]);
    m.files.push_back(rr.file);
    for (auto& [tn, s] : rr.shards) {
      auto it = m.tensors.find(tn);
      FSDP_CHECK(it != m.tensors.end(), ErrorKind::kMismatch, where, "rank ", r,
                 " wrote unknown tensor '", tn, "'");
      FSDP_CHECK(rr.dtypes[tn] == it->second.dtype, ErrorKind::kMismatch, where, "rank ", r,
                 " wrote '", tn, "' as ", rr.dtypes[tn], ", expected ", it->second.dtype);
      it->second.shards.push_back(s);
    }
  }
  return m;
}

}  // namespace

std::string save_sharded(const std::string& dir, const std::shared_ptr<torch::nn::Module>& root,
                         torch::optim::Optimizer* optimizer, const TrainState& extra,
                         const comm::ProcessGroupPtr& group, const SaveOptions& options) {
  FSDP_CHECK(group, ErrorKind::kInvalidArgument, ErrorContext{-1, "", "save_sharded"},
             "null process group");
  auto& g = *group;
  const int rank = g.rank(), world = g.size();
  const std::string name = options.name.empty() ? default_name(extra) : options.name;
  const std::string op = "save_sharded '" + (fs::path(dir) / name).string() + "'";
  const ErrorContext where{rank, "", op};
  Agreement agree(g, op);

  std::vector<ParamView> views;
  agree.run("validation", [&] {
    FSDP_CHECK(!name.empty() && name[0] != '.' && name.find('/') == std::string::npos &&
                   name != kLatestFile,
               ErrorKind::kInvalidArgument, where, "invalid checkpoint name '", name, "'");
    FSDP_CHECK(options.chunk_bytes > 0, ErrorKind::kInvalidArgument, where,
               expected_actual("SaveOptions::chunk_bytes", "> 0", options.chunk_bytes));
    views = param_views(root, g, where);
    if (optimizer) optim::optimizer_kind(*optimizer, where);
    if (rank == 0) prepare_save_dir(dir, name, where);
  });

  // Which params have optimizer state anywhere (a rank with no rows may have none): 1 + step.
  OptimizerStates states;
  at::Tensor flags = at::zeros({static_cast<int64_t>(views.size()) + 1}, at::kLong);
  agree.run("optimizer state", [&] {
    states = local_optimizer_states(optimizer, views, where);
    int64_t* flag = flags.data_ptr<int64_t>();
    for (size_t i = 0; i < states.size(); ++i) {
      if (states[i]) flag[i] = states[i]->step + 1;
    }
  });
  g.all_reduce(flags, comm::ReduceOp::kMax, comm::OpTag{"", "checkpoint save"})->wait();
  const std::vector<int64_t> step_flags(flags.data_ptr<int64_t>(),
                                        flags.data_ptr<int64_t>() + views.size());

  const std::string tmp = tmp_dir_of(dir, name);
  RankReport report;
  agree.run("writing shard files", [&] {
    int64_t budget_left = 0;
    const std::string file_name = rank_file_name(rank, world);
    RankFileWriter w((fs::path(tmp) / file_name).string(), rank, world, options.chunk_bytes,
                     write_budget(options.fault, rank, budget_left), where);
    for (const auto& v : views) {
      if (v.writer && v.rows > 0) w.add("model/" + v.name, v.tensor, v.row_begin, v.rows);
    }
    if (optimizer) write_optimizer_rows(w, *optimizer, views, states, step_flags, where);
    if (rank == 0) {
      for (const auto& [k, t] : extra.tensors) {
        FSDP_CHECK(t.defined(), ErrorKind::kInvalidArgument, where, "TrainState tensor '", k,
                   "' is undefined");
        w.add("extra/" + k, t, 0, row_shape(t.sizes().vec())[0]);
      }
      for (const auto& kv : root->named_buffers(/*recurse=*/true)) {
        if (!kv.value().defined()) continue;
        w.add("buffer/" + kv.key(), kv.value(), 0, row_shape(kv.value().sizes().vec())[0]);
      }
    }
    report = w.finish(options.durable, file_name);
  });

  // Every rank's report (offsets, CRCs) reaches rank 0 (every rank receives them).
  const std::vector<std::string> reports = comm::all_gather_strings(g, report_to_json(report));

  agree.run("publishing", [&] {
    if (rank != 0) return;
    FSDP_CHECK(options.fault.stage != FaultInjection::Stage::kBeforeManifest, ErrorKind::kIo, where,
               "injected fault: simulated crash before writing the manifest");
    const Manifest m =
        build_manifest(dir, name, root, optimizer, extra, views, step_flags, reports, where);
    io::write_file((fs::path(tmp) / kManifestFile).string(), manifest_to_json(m), options.durable);
    if (options.durable) io::fsync_dir(tmp);
    publish(dir, name, options, where);
  });
  return name;
}

}  // namespace fsdp::checkpoint
