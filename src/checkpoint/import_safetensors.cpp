// import_safetensors and export_safetensors: a safetensors checkpoint straight into the shards,
// and out of them unit by unit (safetensors.h).
#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "agreement.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/runtime/fsdp_unit.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/state_dict.h"
#include "io.h"
#include "fsdp/shard/layout.h"
#include "param_views.h"

namespace fsdp::checkpoint {

namespace {

struct Planned {
  ParamView view;
  SafetensorsSource source;
};

std::string shape_str(const std::vector<int64_t>& s) { return shard::shape_to_string(s); }

}  // namespace

SafetensorsImportReport import_safetensors(const std::string& dir, const std::shared_ptr<torch::nn::Module>& root,
                                           const comm::ProcessGroupPtr& group, const SafetensorsImportOptions& options) {
  FSDP_CHECK(group && root, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "import_safetensors"}),
             "null process group or root module");
  const std::string op = "import_safetensors '" + dir + "'";
  const ErrorContext who{group->rank(), "", op};
  Agreement agree(*group, op);
  std::unique_ptr<SafetensorsCheckpoint> ck;
  std::vector<Planned> plan;
  SafetensorsImportReport report;
  uint64_t fingerprint = 0;
  agree.run("reading and validating", [&] {
    check_no_pending_gradients(root, who);
    ck = std::make_unique<SafetensorsCheckpoint>(dir);
    fingerprint = ck->fingerprint();
    std::set<std::string> taken;
    std::set<const FSDPUnit*> pending;  // units still without values (a meta build)
    for (const auto& u : units_of(root)) {
      if (u->values_pending()) pending.insert(u.get());
    }
    for (auto& v : param_views(root, *group, who)) {
      if (options.leave && options.leave(v.name)) {
        FSDP_CHECK(!pending.count(v.unit), ErrorKind::kInvalidArgument, who, "parameter '", v.name,
                   "' is left to its value (SafetensorsImportOptions::leave), but its unit was built on the meta "
                   "device and holds none yet: fsdp::materialize the model first (the import then overwrites the "
                   "parameters it reads)");
        report.left.push_back(v.name);
        continue;
      }
      report.filled.push_back(v.name);
      SafetensorsSource src = options.source_of ? options.source_of(v.name) : SafetensorsSource{v.name, false};
      const std::string what = "parameter '" + v.name + "' (tensor '" + src.tensor + "')";
      FSDP_CHECK(ck->contains(src.tensor), ErrorKind::kInvalidArgument, who, what, " is missing from the checkpoint");
      FSDP_CHECK(taken.insert(src.tensor).second, ErrorKind::kInvalidArgument, who, what,
                 ": the tensor is the source of another parameter too");
      const SafetensorsEntry& e = ck->entry(src.tensor);
      std::vector<int64_t> want = v.shape;
      if (src.transposed) {
        FSDP_CHECK(want.size() == 2, ErrorKind::kInvalidArgument, who, what, " is declared transposed but is ",
                   shape_str(want), ", not 2-D");
        std::swap(want[0], want[1]);
      }
      FSDP_CHECK(e.shape == want, ErrorKind::kInvalidArgument, who, what, " is ", shape_str(e.shape),
                 " in the checkpoint; the model needs ", shape_str(want), src.transposed ? " (stored transposed)" : "");
      const bool both_float = at::isFloatingType(e.scalar_type) && at::isFloatingType(v.tensor.scalar_type());
      FSDP_CHECK(both_float || e.scalar_type == v.tensor.scalar_type(), ErrorKind::kInvalidArgument, who, what,
                 " is ", e.dtype, " in the checkpoint; the model's parameter is ", v.tensor.scalar_type());
      plan.push_back({std::move(v), std::move(src)});
    }
    std::vector<std::string> unexpected;
    for (const auto& name : ck->names()) {
      if (!taken.count(name) && !(options.ignore && options.ignore(name))) unexpected.push_back(name);
    }
    FSDP_CHECK(unexpected.empty(), ErrorKind::kInvalidArgument, who, "the checkpoint has ", unexpected.size(),
               " tensor(s) no parameter of the model takes, e.g. '", unexpected.empty() ? "" : unexpected.front(),
               "' (a model of another shape or architecture?)");
    for (const auto& kv : root->named_buffers(/*recurse=*/true)) {
      FSDP_CHECK(!kv.value().is_meta(), ErrorKind::kInvalidArgument, who, "buffer '", kv.key(),
                 "' is still on the meta device: the checkpoint holds parameters only; give the buffers their values "
                 "(build them off the meta device) first");
    }
  });
  // Every rank must read the same checkpoint: the same path may hold different copies on
  // different hosts (or a copy being replaced).
  agree.check_same_contents(fingerprint);
  agree.run("reading the rows", [&] {
    at::NoGradGuard no_grad;
    for (const auto& [v, src] : plan) {
      if (v.rows == 0) continue;
      const SafetensorsFile& f = ck->file_of(src.tensor);
      at::Tensor rows = src.transposed ? f.read(src.tensor).t().narrow(0, v.row_begin, v.rows)
                                       : f.read_rows(src.tensor, v.row_begin, v.rows);
      v.tensor.narrow(0, 0, v.rows).copy_(rows.to(v.tensor.scalar_type()));
    }
    for (const auto& u : units_of(root)) {
      if (u->values_pending()) u->set_values_materialized();  // every row came from the file
    }
    invalidate_unsharded(root);
  });
  return report;
}

void export_safetensors(const std::string& dir, const std::shared_ptr<torch::nn::Module>& root,
                        const comm::ProcessGroupPtr& group, const SafetensorsExportOptions& options) {
  FSDP_CHECK(group && root, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "export_safetensors"}),
             "null process group or root module");
  namespace fs = std::filesystem;
  const int rank = group->rank();
  const std::string op = "export_safetensors '" + dir + "'";
  Agreement agree(*group, op);
  // Plan on every rank (the same answer): names, shapes, dtypes, and the file of each tensor.
  struct Item {
    ShardedParameter sp;
    SafetensorsSource target;
    SafetensorsWriter::Spec spec;
    int64_t bytes;
  };
  std::vector<Item> items;
  std::vector<std::vector<size_t>> files;  // tensors of each file, in order
  agree.run("planning", [&] {
    std::set<std::string> names;
    int64_t in_file = 0;
    for (const auto& sp : sharded_parameters(root)) {
      if (options.skip && options.skip(sp.name)) continue;
      SafetensorsSource t = options.target_of ? options.target_of(sp.name) : SafetensorsSource{sp.name, false};
      FSDP_CHECK(names.insert(t.tensor).second, ErrorKind::kInvalidArgument, (ErrorContext{rank, "", op}),
                 "tensor name '", t.tensor, "' is given to two parameters (the second: '", sp.name, "')");
      std::vector<int64_t> shape = sp.param->shape;
      FSDP_CHECK(!t.transposed || shape.size() == 2, ErrorKind::kInvalidArgument, (ErrorContext{rank, "", op}),
                 "parameter '", sp.name, "' is to be written transposed but is ", shard::shape_to_string(shape));
      if (t.transposed) std::swap(shape[0], shape[1]);
      const at::ScalarType dtype = options.dtype.value_or(sp.tensor.scalar_type());
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
      if (files.empty() || (options.max_file_bytes > 0 && in_file > 0 && in_file + bytes > options.max_file_bytes)) {
        files.emplace_back();
        in_file = 0;
      }
      files.back().push_back(items.size());
      in_file += bytes;
      items.push_back({sp, t, {t.tensor, dtype, shape}, bytes});
    }
    if (rank == 0) fs::create_directories(dir);
  });
  const bool split = options.max_file_bytes > 0 && files.size() > 1;
  const std::string& stem = options.file_stem;
  const std::string index_name = stem + ".safetensors.index.json";
  auto file_name = [&](size_t k) {
    if (!split) return stem + ".safetensors";
    char buf[64];
    std::snprintf(buf, sizeof(buf), "-%05zu-of-%05zu.safetensors", k + 1, files.size());
    return stem + buf;
  };
  // Every rank takes part in every gather; rank 0 writes. A write failure on rank 0 is kept, the
  // gathers go on (its peers are in them), and the agreement below reports it on every rank.
  std::optional<Error> failed;
  for (size_t k = 0; k < files.size(); ++k) {
    std::unique_ptr<SafetensorsWriter> writer;
    if (rank == 0 && !failed) {
      try {
        std::vector<SafetensorsWriter::Spec> specs;
        for (size_t i : files[k]) specs.push_back(items[i].spec);
        writer = std::make_unique<SafetensorsWriter>((fs::path(dir) / file_name(k)).string(), specs, options.metadata);
      } catch (const Error& e) {
        failed = e;
      }
    }
    for (size_t i : files[k]) {
      const Item& it = items[i];
      at::Tensor full = gather_full_tensor(*it.sp.unit, *it.sp.param, /*grad=*/false);  // collective
      if (!writer || failed) continue;
      try {
        at::Tensor t = full;
        if (options.value_of) {
          t = options.value_of(it.sp.name, full);
          FSDP_CHECK(t.sizes() == full.sizes(), ErrorKind::kInvalidArgument, (ErrorContext{rank, "", op}),
                     "SafetensorsExportOptions::value_of gave parameter '", it.sp.name, "' the shape ",
                     shard::shape_to_string(t.sizes().vec()), ", not its own ", shard::shape_to_string(full.sizes().vec()));
        }
        if (it.target.transposed) t = t.t();
        writer->append(it.target.tensor, t.to(at::kCPU, it.spec.dtype));
      } catch (const Error& e) {
        failed = e;
      }
    }
    if (writer && !failed) {
      try {
        writer->finish();
      } catch (const Error& e) {
        failed = e;
      }
    }
  }
  agree.run("writing", [&] {
    if (failed) throw *failed;
    if (rank != 0) return;
    // The weights of an earlier export into this directory that this one did not replace (a split
    // checkpoint under a single file, or more files than now) would make it two checkpoints.
    std::set<std::string> written;
    for (size_t k = 0; k < files.size(); ++k) written.insert(file_name(k));
    if (split) written.insert(index_name);
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      const bool weights = name == stem + ".safetensors" || name == index_name ||
                           (name.rfind(stem + "-", 0) == 0 && name.size() > 12 &&
                            name.compare(name.size() - 12, 12, ".safetensors") == 0 &&
                            name.find("-of-") != std::string::npos);
      if (weights && !written.count(name)) {
        std::error_code rm;
        fs::remove(entry.path(), rm);
        FSDP_CHECK(!rm, ErrorKind::kIo, (ErrorContext{rank, "", "export_safetensors '" + dir + "'"}),
                   "cannot remove the earlier export's '", name, "': ", rm.message());
      }
    }
    if (split) {
      nlohmann::json weight_map = nlohmann::json::object();
      int64_t total = 0;
      for (size_t k = 0; k < files.size(); ++k) {
        for (size_t i : files[k]) {
          weight_map[items[i].target.tensor] = file_name(k);
          total += items[i].bytes;
        }
      }
      const nlohmann::json index{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      io::atomic_write_file((fs::path(dir) / index_name).string(), index.dump(2) + "\n", true);
    }
    for (const auto& [name, contents] : options.extra_files) {
      io::atomic_write_file((fs::path(dir) / name).string(), contents, true);
    }
  });
}

}  // namespace fsdp::checkpoint
