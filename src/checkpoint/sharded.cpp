// save_sharded / load_sharded. Protocol and format: docs/checkpoints.md.
// Phases end with an Agreement (see agreement.h, [Note: error agreement]).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <set>
#include <unordered_map>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"
#include "agreement.h"
#include "io.h"
#include "manifest.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

// ---- dtypes -------------------------------------------------------------------------------------

const std::vector<std::pair<c10::ScalarType, const char*>>& dtype_names() {
  static const std::vector<std::pair<c10::ScalarType, const char*>> names = {
      {at::kFloat, "float32"}, {at::kDouble, "float64"}, {at::kBFloat16, "bfloat16"},
      {at::kHalf, "float16"},  {at::kLong, "int64"},     {at::kInt, "int32"},
      {at::kShort, "int16"},   {at::kChar, "int8"},      {at::kByte, "uint8"},
      {at::kBool, "bool"}};
  return names;
}
std::string dtype_name(c10::ScalarType t) {
  for (const auto& [d, n] : dtype_names()) {
    if (d == t) return n;
  }
  throw Error(str_cat("[fsdp] checkpoint: dtype ", t, " is not supported"));
}
c10::ScalarType dtype_from(const std::string& name, const std::string& where) {
  for (const auto& [d, n] : dtype_names()) {
    if (n == name) return d;
  }
  throw Error(str_cat(where, ": unknown dtype '", name, "' in the manifest"));
}

std::vector<int64_t> row_shape(const std::vector<int64_t>& shape) {  // (rows, row_numel)
  int64_t d0 = shape.empty() ? 1 : shape[0];
  int64_t rn = 1;
  for (size_t i = 1; i < shape.size(); ++i) rn *= shape[i];
  return {d0, rn};
}

// ---- model and optimizer views ------------------------------------------------------------------

// One sharded parameter as the checkpoint sees it: the global rows this rank holds.
struct ParamView {
  std::string name;
  at::Tensor tensor;  // this rank's rows (leaf), shape (rows, ...)
  std::vector<int64_t> shape;
  int64_t row_begin = 0, rows = 0;
  bool writer = false;  // this rank writes these rows (false for replicated copies on rank > 0)
};

std::vector<ParamView> param_views(const std::shared_ptr<torch::nn::Module>& root,
                                   const comm::ProcessGroup& g, const std::string& op) {
  std::vector<ParamView> out;
  std::unordered_map<const void*, bool> managed;
  for (const auto& sp : sharded_parameters(root)) {
    const auto& s = sp.param->spec;
    const auto& ug = *sp.unit->group();
    ParamView v{sp.name, sp.tensor, sp.param->shape};
    if (ug.size() == g.size()) {
      FSDP_CHECK(ug.rank() == g.rank(), "[fsdp rank ", g.rank(), "] ", op, ": unit '",
                 sp.unit->name(), "' ranks its group differently (rank ", ug.rank(),
                 ") from the checkpoint group (rank ", g.rank(), "): unsupported");
      // Rows are indexed by the shard rank (no_shard: 0 and all rows; hybrid: the position in the
      // shard group). Replicated rows are written once, by replica 0; every rank reads its rows.
      const int64_t sr = sp.unit->shard_rank();
      v.row_begin = s.row_offset(sr);
      v.rows = s.real_rows(sr);
      v.writer = sp.unit->num_replicas() == 1 || sp.unit->replicate_group()->rank() == 0;
    } else if (ug.size() == 1) {  // replicated on every rank: rank 0 writes, all read all rows
      v.row_begin = 0;
      v.rows = s.dim0;
      v.writer = g.rank() == 0;
    } else {
      throw Error(str_cat("[fsdp rank ", g.rank(), "] ", op, ": parameter '", sp.name,
                          "' is sharded over a group of ", ug.size(),
                          " ranks; the checkpoint group has ", g.size()));
    }
    managed[sp.param->module_param.unsafeGetTensorImpl()] = true;
    out.push_back(std::move(v));
  }
  for (const auto& kv : root->named_parameters(/*recurse=*/true)) {
    FSDP_CHECK(managed.count(kv.value().unsafeGetTensorImpl()), "[fsdp rank ", g.rank(), "] ", op,
               ": parameter '", kv.key(),
               "' is not managed by any FSDP unit (wrap the root with fsdp::fully_shard or "
               "fully_shard_tree before checkpointing)");
  }
  return out;
}

enum class OptKind { kNone, kAdamW, kAdam, kSGD };

const char* opt_name(OptKind k) {
  switch (k) {
    case OptKind::kAdamW: return "adamw";
    case OptKind::kAdam: return "adam";
    case OptKind::kSGD: return "sgd";
    default: return "";
  }
}

OptKind opt_kind(torch::optim::Optimizer* o, int rank, const std::string& op) {
  if (!o) return OptKind::kNone;
  if (dynamic_cast<torch::optim::AdamW*>(o)) return OptKind::kAdamW;
  if (dynamic_cast<torch::optim::Adam*>(o)) return OptKind::kAdam;
  if (dynamic_cast<torch::optim::SGD*>(o)) return OptKind::kSGD;
  throw Error(str_cat("[fsdp rank ", rank, "] ", op,
                      ": unsupported optimizer type (supported: torch::optim::AdamW, Adam, SGD)"));
}

// The state tensors an optimizer keeps for one parameter, by name.
struct LocalOptState {
  bool has = false;
  int64_t step = 0;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

LocalOptState local_state(torch::optim::Optimizer* o, OptKind k, const at::Tensor& p) {
  LocalOptState st;
  if (!o) return st;
  auto it = o->state().find(p.unsafeGetTensorImpl());
  if (it == o->state().end() || !it->second) return st;
  st.has = true;
  auto add = [&](const char* n, const at::Tensor& t) {
    if (t.defined()) st.tensors.emplace_back(n, t);
  };
  if (k == OptKind::kAdamW) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    st.step = s.step();
    add("exp_avg", s.exp_avg());
    add("exp_avg_sq", s.exp_avg_sq());
    add("max_exp_avg_sq", s.max_exp_avg_sq());
  } else if (k == OptKind::kAdam) {
    auto& s = static_cast<torch::optim::AdamParamState&>(*it->second);
    st.step = s.step();
    add("exp_avg", s.exp_avg());
    add("exp_avg_sq", s.exp_avg_sq());
    add("max_exp_avg_sq", s.max_exp_avg_sq());
  } else if (k == OptKind::kSGD) {
    auto& s = static_cast<torch::optim::SGDParamState&>(*it->second);
    add("momentum_buffer", s.momentum_buffer());
  }
  return st;
}

// Which state tensors a parameter has, from the optimizer's kind and the parameter's group.
std::vector<std::string> expected_state_names(torch::optim::Optimizer* o, OptKind k,
                                              const at::Tensor& p) {
  if (k == OptKind::kSGD) return {"momentum_buffer"};
  bool amsgrad = false;
  for (auto& grp : o->param_groups()) {
    for (auto& q : grp.params()) {
      if (q.unsafeGetTensorImpl() != p.unsafeGetTensorImpl()) continue;
      if (k == OptKind::kAdamW) amsgrad = static_cast<torch::optim::AdamWOptions&>(grp.options()).amsgrad();
      if (k == OptKind::kAdam) amsgrad = static_cast<torch::optim::AdamOptions&>(grp.options()).amsgrad();
    }
  }
  std::vector<std::string> out{"exp_avg", "exp_avg_sq"};
  if (amsgrad) out.push_back("max_exp_avg_sq");
  return out;
}

bool optimizer_holds(torch::optim::Optimizer* o, const at::Tensor& p) {
  for (auto& grp : o->param_groups()) {
    for (auto& q : grp.params()) {
      if (q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return true;
    }
  }
  return false;
}

std::string default_name(const TrainState& extra) {
  auto it = extra.ints.find("step");
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%09lld",
                static_cast<long long>(it == extra.ints.end() ? 0 : it->second));
  return buf;
}

// ---- shard file writing -------------------------------------------------------------------------

class RankFileWriter {
 public:
  RankFileWriter(const std::string& path, int rank, int world, int64_t chunk_bytes,
                 std::function<size_t(size_t)> budget)
      : w_(path, std::move(budget)), rank_(rank), chunk_bytes_(chunk_bytes) {
    uint32_t hdr[4] = {static_cast<uint32_t>(kFormatVersion), static_cast<uint32_t>(rank),
                       static_cast<uint32_t>(world), 0};
    w_.write(kMagic, sizeof(kMagic));
    w_.write(hdr, sizeof(hdr));
  }

  // Writes rows [row_begin, row_begin + rows) of tensor `name` (t holds exactly those rows).
  void add(const std::string& name, const at::Tensor& t, int64_t row_begin, int64_t rows) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const int64_t row_bytes = rows > 0 ? static_cast<int64_t>(c.nbytes()) / rows : 0;
    ShardEntry s;
    s.rank = rank_;
    s.offset = w_.bytes();
    s.row_begin = row_begin;
    s.rows = rows;
    s.chunk_rows = std::max<int64_t>(1, row_bytes > 0 ? chunk_bytes_ / row_bytes : 1);
    const char* p = static_cast<const char*>(c.data_ptr());
    for (int64_t r0 = 0; r0 < rows; r0 += s.chunk_rows) {
      const size_t n = static_cast<size_t>(std::min(s.chunk_rows, rows - r0) * row_bytes);
      s.chunk_crc32.push_back(io::crc32_update(0, p + r0 * row_bytes, n));
      w_.write(p + r0 * row_bytes, n);
    }
    report_.shards.emplace_back(name, std::move(s));
    report_.dtypes[name] = dtype_name(c.scalar_type());
  }

  RankReport finish(bool durable, const std::string& file_name) {
    w_.close(durable);
    report_.file = {rank_, file_name, w_.bytes(), w_.crc32()};
    return report_;
  }

 private:
  io::FileWriter w_;
  int rank_;
  int64_t chunk_bytes_;
  RankReport report_;
};

// ---- shard file reading -------------------------------------------------------------------------

class RankFiles {
 public:
  RankFiles(const std::string& dir, const Manifest& m, int my_rank)
      : dir_(dir), m_(m), my_rank_(my_rank) {}

  const io::FileReader& get(int rank) {
    auto it = open_.find(rank);
    if (it != open_.end()) return *it->second;
    const FileEntry* fe = nullptr;
    for (const auto& f : m_.files) {
      if (f.rank == rank) fe = &f;
    }
    FSDP_CHECK(fe, where(), ": the manifest lists no file for rank ", rank);
    const std::string path = (fs::path(dir_) / fe->path).string();
    auto r = std::make_unique<io::FileReader>(path);  // throws "cannot open" if missing
    FSDP_CHECK(r->size() == fe->bytes, where(), ": file '", path, "' has ", r->size(),
               " bytes, the manifest says ", fe->bytes,
               r->size() < fe->bytes ? " (truncated)" : " (extra bytes)");
    char hdr[kHeaderBytes];
    r->read_at(0, hdr, sizeof(hdr));
    uint32_t fields[4];
    std::memcpy(fields, hdr + 8, sizeof(fields));
    FSDP_CHECK(std::memcmp(hdr, kMagic, 8) == 0 && fields[1] == static_cast<uint32_t>(rank),
               where(), ": file '", path, "' has a bad header (not rank ", rank,
               "'s shard file of this checkpoint)");
    return *open_.emplace(rank, std::move(r)).first->second;
  }

  // Rows [lo, lo + n) of tensor `name` as (n, row_numel), reading and verifying only the chunks
  // that overlap them.
  at::Tensor read_rows(const std::string& name, const TensorEntry& e, int64_t lo, int64_t n) {
    const c10::ScalarType dt = dtype_from(e.dtype, where());
    at::Tensor out = at::empty({n, e.row_numel}, at::TensorOptions().dtype(dt));
    const int64_t row_bytes = e.row_numel * static_cast<int64_t>(c10::elementSize(dt));
    // coverage: shards sorted by row_begin must tile [0, dim0)
    std::vector<const ShardEntry*> shards;
    for (const auto& s : e.shards) shards.push_back(&s);
    std::sort(shards.begin(), shards.end(),
              [](auto* a, auto* b) { return a->row_begin < b->row_begin; });
    const int64_t dim0 = row_shape(e.shape)[0];
    int64_t next = 0;
    for (auto* s : shards) {
      FSDP_CHECK(s->row_begin == next, where(), ": tensor '", name, "': shards leave rows [", next,
                 ", ", s->row_begin, ") uncovered or overlapping");
      next = s->row_begin + s->rows;
    }
    FSDP_CHECK(next == dim0, where(), ": tensor '", name, "': shards cover ", next, " of ", dim0,
               " rows");
    char* dst = static_cast<char*>(out.data_ptr());
    std::vector<char> buf;
    for (auto* s : shards) {
      const int64_t ov_lo = std::max(lo, s->row_begin);
      const int64_t ov_hi = std::min(lo + n, s->row_begin + s->rows);
      if (ov_lo >= ov_hi) continue;
      const int64_t c0 = (ov_lo - s->row_begin) / s->chunk_rows;
      const int64_t c1 = (ov_hi - 1 - s->row_begin) / s->chunk_rows;
      FSDP_CHECK(c1 < static_cast<int64_t>(s->chunk_crc32.size()), where(), ": tensor '", name,
                 "': manifest has ", s->chunk_crc32.size(), " chunk checksums, need ", c1 + 1);
      const auto& file = get(s->rank);
      for (int64_t c = c0; c <= c1; ++c) {
        const int64_t c_lo = s->row_begin + c * s->chunk_rows;
        const int64_t c_rows = std::min(s->chunk_rows, s->row_begin + s->rows - c_lo);
        const int64_t off = s->offset + c * s->chunk_rows * row_bytes;
        buf.resize(static_cast<size_t>(c_rows * row_bytes));
        file.read_at(off, buf.data(), buf.size());
        const uint32_t crc = io::crc32_update(0, buf.data(), buf.size());
        char want[11], got[11];
        std::snprintf(want, sizeof(want), "0x%08x", s->chunk_crc32[c]);
        std::snprintf(got, sizeof(got), "0x%08x", crc);
        FSDP_CHECK(crc == s->chunk_crc32[c], where(), ": checksum mismatch in '", file.path(),
                   "' (tensor '", name, "', rows [", c_lo, ", ", c_lo + c_rows, "), bytes [", off,
                   ", ", off + c_rows * row_bytes, ")): manifest CRC-32 ", want, ", data ", got,
                   " (corrupted file)");
        const int64_t a = std::max(ov_lo, c_lo), b = std::min(ov_hi, c_lo + c_rows);
        if (a < b) {
          std::memcpy(dst + (a - lo) * row_bytes, buf.data() + (a - c_lo) * row_bytes,
                      static_cast<size_t>((b - a) * row_bytes));
        }
      }
    }
    return out;
  }

  std::string where() const {
    return str_cat("[fsdp rank ", my_rank_, "] load_sharded '", dir_, "'");
  }

 private:
  std::string dir_;
  const Manifest& m_;
  int my_rank_;
  std::map<int, std::unique_ptr<io::FileReader>> open_;
};

std::vector<ParamInfo> param_infos(const std::vector<ParamView>& views) {
  std::vector<ParamInfo> out;
  for (const auto& v : views) out.push_back({v.name, v.shape, dtype_name(v.tensor.scalar_type())});
  return out;
}

void publish(const std::string& dir, const std::string& name, const std::string& tmp,
             const SaveOptions& o) {
  using Stage = FaultInjection::Stage;
  auto fault = [&](Stage s, const char* what) {
    FSDP_CHECK(o.fault.stage != s, "[fsdp rank 0] injected fault: simulated crash ", what);
  };
  const fs::path final_path = fs::path(dir) / name;
  const fs::path trash = fs::path(dir) / (kTrashPrefix + name);
  fault(Stage::kBeforeRename, "before renaming the checkpoint directory");
  std::error_code ec;
  if (fs::exists(final_path, ec)) {  // re-save under the same name: move the old one aside
    fs::rename(final_path, trash);
  }
  fs::rename(tmp, final_path);
  if (o.durable) io::fsync_dir(dir);
  fs::remove_all(trash, ec);
  fault(Stage::kBeforeLatest, "after publishing, before updating 'latest'");
  io::atomic_write_file((fs::path(dir) / kLatestFile).string(), name + "\n", o.durable);
  if (o.keep_last_k > 0) {
    auto all = list_checkpoints(dir);
    int64_t excess = static_cast<int64_t>(all.size()) - o.keep_last_k;
    for (const auto& victim : all) {
      if (excess <= 0) break;
      if (fs::path(victim).filename() == name) continue;
      // rename first: a half-deleted directory must never look like a complete checkpoint
      const fs::path t = fs::path(dir) / (kTrashPrefix + fs::path(victim).filename().string());
      fs::rename(victim, t);
      fs::remove_all(t, ec);
      --excess;
    }
  }
}

}  // namespace

at::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// ---- save ---------------------------------------------------------------------------------------

std::string save_sharded(const std::string& dir, const std::shared_ptr<torch::nn::Module>& root,
                         torch::optim::Optimizer* optimizer, const TrainState& extra,
                         const comm::ProcessGroupPtr& group, const SaveOptions& options) {
  FSDP_CHECK(group, "[fsdp] save_sharded: null process group");
  auto& g = *group;
  const int rank = g.rank(), world = g.size();
  const std::string name = options.name.empty() ? default_name(extra) : options.name;
  const std::string op = "save_sharded '" + (fs::path(dir) / name).string() + "'";
  const std::string who = str_cat("[fsdp rank ", rank, "] ", op);
  Agreement agree(g, op);
  const std::string tmp = (fs::path(dir) / (kTmpPrefix + name)).string();

  std::vector<ParamView> views;
  OptKind kind = OptKind::kNone;
  agree.run("validation", [&] {
    FSDP_CHECK(!name.empty() && name[0] != '.' && name.find('/') == std::string::npos &&
                   name != kLatestFile,
               who, ": invalid checkpoint name '", name, "'");
    FSDP_CHECK(options.chunk_bytes > 0, who, ": chunk_bytes must be > 0");
    views = param_views(root, g, "save_sharded");
    kind = opt_kind(optimizer, rank, "save_sharded");
    if (rank == 0) {  // fresh temporary directory; leftovers of interrupted saves go
      fs::create_directories(dir);
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(kTmpPrefix, 0) == 0 || n.rfind(kTrashPrefix, 0) == 0) fs::remove_all(e.path(), ec);
      }
      fs::create_directory(tmp);
    }
  });

  // Which params have optimizer state anywhere (a rank with no rows may have none): step + 1.
  at::Tensor flags = at::zeros({static_cast<int64_t>(views.size()) + 1}, at::kLong);
  std::vector<LocalOptState> states(views.size());
  int64_t* flag = flags.data_ptr<int64_t>();
  agree.run("optimizer state", [&] {
    for (size_t i = 0; i < views.size(); ++i) {
      states[i] = local_state(optimizer, kind, views[i].tensor);
      if (states[i].has) flag[i] = states[i].step + 1;
    }
  });
  g.all_reduce(flags, comm::ReduceOp::kMax)->wait();

  RankReport report;
  agree.run("writing shard files", [&] {
    int64_t budget_left = options.fault.after_bytes;
    std::function<size_t(size_t)> budget;
    if (options.fault.stage == FaultInjection::Stage::kWrite && options.fault.rank == rank) {
      budget = [&budget_left](size_t n) {
        size_t ok = static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(budget_left, n)));
        budget_left -= static_cast<int64_t>(ok);
        return ok;
      };
    }
    const std::string file_name = rank_file_name(rank, world);
    RankFileWriter w((fs::path(tmp) / file_name).string(), rank, world, options.chunk_bytes, budget);
    for (const auto& v : views) {
      if (v.writer && v.rows > 0) w.add("model/" + v.name, v.tensor, v.row_begin, v.rows);
    }
    for (size_t i = 0; i < views.size(); ++i) {
      const auto& v = views[i];
      if (flag[i] == 0 || !v.writer || v.rows == 0) continue;
      auto want = expected_state_names(optimizer, kind, v.tensor);
      FSDP_CHECK(states[i].has, who, ": parameter '", v.name,
                 "' has optimizer state on another rank but not on this one, which holds ",
                 v.rows, " of its rows");
      for (const auto& sn : want) {
        at::Tensor t;
        for (const auto& kv : states[i].tensors) {
          if (kv.first == sn) t = kv.second;
        }
        FSDP_CHECK(t.defined() && t.numel() == v.tensor.numel(), who, ": optimizer state '", sn,
                   "' of parameter '", v.name, "' is ", t.defined() ? "of the wrong size" : "missing",
                   " (", t.defined() ? t.numel() : 0, " elements, expected ", v.tensor.numel(), ")");
        w.add("optim/" + v.name + "/" + sn, t, v.row_begin, v.rows);
      }
    }
    if (rank == 0) {
      for (const auto& [k, t] : extra.tensors) {
        FSDP_CHECK(t.defined(), who, ": TrainState tensor '", k, "' is undefined");
        w.add("extra/" + k, t, 0, row_shape(t.sizes().vec())[0]);
      }
      for (const auto& kv : root->named_buffers(/*recurse=*/true)) {
        if (!kv.value().defined()) continue;
        w.add("buffer/" + kv.key(), kv.value(), 0, row_shape(kv.value().sizes().vec())[0]);
      }
    }
    report = w.finish(options.durable, file_name);
  });

  // Rank reports to rank 0 (every rank receives them: one all-gather of padded JSON).
  std::string mine = report_to_json(report);
  at::Tensor len = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
  g.all_reduce(len, comm::ReduceOp::kMax)->wait();
  const int64_t L = len.item<int64_t>() + 1;
  at::Tensor buf = at::zeros({L}, at::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::empty({world * L}, at::kByte);
  g.all_gather_into_tensor(all, buf)->wait();

  agree.run("publishing", [&] {
    if (rank != 0) return;
    FSDP_CHECK(options.fault.stage != FaultInjection::Stage::kBeforeManifest,
               "[fsdp rank 0] injected fault: simulated crash before writing the manifest");
    Manifest m;
    m.name = name;
    m.world_size = world;
    m.params = param_infos(views);
    m.fingerprint = fingerprint(m.params);
    int64_t seq = 0;
    for (const auto& c : list_checkpoints(dir)) seq = std::max(seq, read_manifest(c).seq);
    m.seq = seq + 1;
    for (const auto& v : views) {
      TensorEntry e{"param", dtype_name(v.tensor.scalar_type()), v.shape, row_shape(v.shape)[1], {}};
      m.tensors["model/" + v.name] = e;
    }
    m.optimizer = opt_name(kind);
    if (optimizer) {
      for (auto& grp : optimizer->param_groups()) m.group_lrs.push_back(grp.options().get_lr());
    }
    for (size_t i = 0; i < views.size(); ++i) {
      const int64_t f = flag[i];
      if (f == 0) continue;
      const auto& v = views[i];
      auto names = expected_state_names(optimizer, kind, v.tensor);
      m.optim_step[v.name] = f - 1;
      m.optim_state[v.name] = names;
      for (const auto& sn : names) {
        m.tensors["optim/" + v.name + "/" + sn] =
            TensorEntry{"optim", dtype_name(v.tensor.scalar_type()), v.shape, row_shape(v.shape)[1], {}};
      }
    }
    m.ints = extra.ints;
    m.doubles = extra.doubles;
    for (const auto& [k, t] : extra.tensors) {
      m.extra_tensors.push_back(k);
      m.tensors["extra/" + k] = TensorEntry{"extra", dtype_name(t.scalar_type()), t.sizes().vec(),
                                            row_shape(t.sizes().vec())[1], {}};
    }
    for (const auto& kv : root->named_buffers(true)) {
      if (!kv.value().defined()) continue;
      auto shape = kv.value().sizes().vec();
      m.tensors["buffer/" + kv.key()] =
          TensorEntry{"buffer", dtype_name(kv.value().scalar_type()), shape, row_shape(shape)[1], {}};
    }
    for (int r = 0; r < world; ++r) {
      RankReport rr = report_from_json(
          std::string(reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * L));
      m.files.push_back(rr.file);
      for (auto& [tn, s] : rr.shards) {
        auto it = m.tensors.find(tn);
        FSDP_CHECK(it != m.tensors.end(), who, ": rank ", r, " wrote unknown tensor '", tn, "'");
        FSDP_CHECK(rr.dtypes[tn] == it->second.dtype, who, ": rank ", r, " wrote '", tn, "' as ",
                   rr.dtypes[tn], ", expected ", it->second.dtype);
        it->second.shards.push_back(s);
      }
    }
    io::write_file((fs::path(tmp) / kManifestFile).string(), manifest_to_json(m), options.durable);
    if (options.durable) io::fsync_dir(tmp);
    publish(dir, name, tmp, options);
  });
  return name;
}

// ---- load ---------------------------------------------------------------------------------------

std::string load_sharded(const std::string& path, const std::shared_ptr<torch::nn::Module>& root,
                         torch::optim::Optimizer* optimizer, TrainState* extra,
                         const comm::ProcessGroupPtr& group, const LoadOptions& options) {
  FSDP_CHECK(group, "[fsdp] load_sharded: null process group");
  auto& g = *group;
  const int rank = g.rank();
  Agreement agree(g, "load_sharded '" + path + "'");

  std::string ckpt;
  Manifest m;
  at::Tensor id = at::zeros({2}, at::kLong);
  agree.run("resolving the checkpoint", [&] {
    ckpt = resolve_checkpoint(path);
    m = read_manifest(ckpt);
    const int64_t h = static_cast<int64_t>(io::fnv1a64(ckpt + "#" + std::to_string(m.seq)) >> 2);
    id[0] = h;
    id[1] = -h;
  });
  g.all_reduce(id, comm::ReduceOp::kMax)->wait();
  FSDP_CHECK(id[0].item<int64_t>() == -id[1].item<int64_t>(), "[fsdp rank ", rank,
             "] load_sharded '", path, "': ranks resolved different checkpoints (this rank: '", ckpt,
             "'); is the directory shared by all ranks?");

  // Phase 1: validate and stage everything (no model / optimizer / extra write yet).
  std::vector<ParamView> views;
  OptKind kind = OptKind::kNone;
  std::vector<at::Tensor> staged_params;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> staged_opt;
  std::vector<bool> has_state;
  std::map<std::string, at::Tensor> staged_extra, staged_buffers;
  const bool do_opt = optimizer && options.load_optimizer;
  agree.run("validating and reading", [&] {
    RankFiles files(ckpt, m, rank);
    const std::string where = files.where();
    views = param_views(root, g, "load_sharded");
    auto model = param_infos(views);
    FSDP_CHECK(m.fingerprint == fingerprint(model), where,
               ": the checkpoint is of another model (fingerprint ", m.fingerprint,
               ", model's ", fingerprint(model), "):", describe_param_diff(m.params, model));
    for (const auto& v : views) {
      const std::string tn = "model/" + v.name;
      auto it = m.tensors.find(tn);
      FSDP_CHECK(it != m.tensors.end(), where, ": tensor '", tn, "' is missing from the manifest");
      const auto& e = it->second;
      const std::string dt = dtype_name(v.tensor.scalar_type());
      FSDP_CHECK(e.shape == v.shape && e.dtype == dt, where, ": tensor '", tn, "' is ",
                 shard::shape_to_string(e.shape), " ", e.dtype, " in the checkpoint, the model has ",
                 shard::shape_to_string(v.shape), " ", dt);
      staged_params.push_back(files.read_rows(tn, e, v.row_begin, v.rows));
    }
    if (do_opt) {
      kind = opt_kind(optimizer, rank, "load_sharded");
      FSDP_CHECK(m.optimizer == opt_name(kind), where, ": the checkpoint holds optimizer state of '",
                 m.optimizer.empty() ? "none" : m.optimizer, "', the optimizer given is '",
                 opt_name(kind), "' (pass nullptr or LoadOptions::load_optimizer = false to skip)");
      FSDP_CHECK(m.group_lrs.size() == optimizer->param_groups().size(), where, ": checkpoint has ",
                 m.group_lrs.size(), " optimizer param groups, the optimizer has ",
                 optimizer->param_groups().size());
      for (const auto& v : views) {
        staged_opt.emplace_back();
        auto st = m.optim_step.find(v.name);
        has_state.push_back(st != m.optim_step.end());
        if (st == m.optim_step.end()) continue;
        FSDP_CHECK(optimizer_holds(optimizer, v.tensor), where, ": the checkpoint has optimizer state for '",
                   v.name, "', which the optimizer does not hold (build it on fsdp::parameters(root))");
        auto want = expected_state_names(optimizer, kind, v.tensor);
        FSDP_CHECK(want == m.optim_state.at(v.name), where, ": optimizer state of '", v.name,
                   "' has ", m.optim_state.at(v.name).size(), " tensors in the checkpoint, the "
                   "optimizer's options expect ", want.size(), " (amsgrad differs?)");
        for (const auto& sn : want) {
          const std::string tn = "optim/" + v.name + "/" + sn;
          auto it = m.tensors.find(tn);
          FSDP_CHECK(it != m.tensors.end(), where, ": tensor '", tn, "' is missing from the manifest");
          FSDP_CHECK(it->second.shape == v.shape, where, ": tensor '", tn, "' is ",
                     shard::shape_to_string(it->second.shape), ", expected ",
                     shard::shape_to_string(v.shape));
          staged_opt.back().emplace_back(sn, files.read_rows(tn, it->second, v.row_begin, v.rows));
        }
      }
    }
    if (extra) {
      for (const auto& k : m.extra_tensors) {
        const std::string tn = "extra/" + k;
        auto it = m.tensors.find(tn);
        FSDP_CHECK(it != m.tensors.end(), where, ": tensor '", tn, "' is missing from the manifest");
        staged_extra[k] = files.read_rows(tn, it->second, 0, row_shape(it->second.shape)[0])
                              .reshape(it->second.shape);
      }
    }
    for (const auto& kv : root->named_buffers(true)) {
      if (!kv.value().defined()) continue;
      const std::string tn = "buffer/" + kv.key();
      auto it = m.tensors.find(tn);
      FSDP_CHECK(it != m.tensors.end(), where, ": buffer '", kv.key(), "' is not in the checkpoint");
      FSDP_CHECK(it->second.shape == kv.value().sizes().vec(), where, ": buffer '", kv.key(), "' is ",
                 shard::shape_to_string(it->second.shape), " in the checkpoint, the model has ",
                 kv.value().sizes());
      staged_buffers[kv.key()] = files.read_rows(tn, it->second, 0, row_shape(it->second.shape)[0]);
    }
  });

  // Phase 2: every rank has everything it needs; write.
  agree.run("applying", [&] {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < views.size(); ++i) {
      const auto& v = views[i];
      if (v.rows > 0) v.tensor.view(staged_params[i].sizes()).copy_(staged_params[i]);
    }
    if (do_opt) {
      for (size_t gi = 0; gi < m.group_lrs.size(); ++gi) {
        optimizer->param_groups()[gi].options().set_lr(m.group_lrs[gi]);
      }
      for (size_t i = 0; i < views.size(); ++i) {
        const auto& v = views[i];
        void* key = v.tensor.unsafeGetTensorImpl();
        if (!has_state[i]) {
          optimizer->state().erase(key);
          continue;
        }
        const int64_t step = m.optim_step.at(v.name);
        auto get = [&](const char* n) {
          for (auto& kv : staged_opt[i]) {
            if (kv.first == n) return kv.second.view(v.tensor.sizes()).to(v.tensor.device());
          }
          return at::Tensor();
        };
        if (kind == OptKind::kAdamW) {
          auto s = std::make_unique<torch::optim::AdamWParamState>();
          s->step(step);
          s->exp_avg(get("exp_avg"));
          s->exp_avg_sq(get("exp_avg_sq"));
          s->max_exp_avg_sq(get("max_exp_avg_sq"));
          optimizer->state()[key] = std::move(s);
        } else if (kind == OptKind::kAdam) {
          auto s = std::make_unique<torch::optim::AdamParamState>();
          s->step(step);
          s->exp_avg(get("exp_avg"));
          s->exp_avg_sq(get("exp_avg_sq"));
          s->max_exp_avg_sq(get("max_exp_avg_sq"));
          optimizer->state()[key] = std::move(s);
        } else if (kind == OptKind::kSGD) {
          auto s = std::make_unique<torch::optim::SGDParamState>();
          s->momentum_buffer(get("momentum_buffer"));
          optimizer->state()[key] = std::move(s);
        }
      }
    }
    if (extra) {
      extra->ints = m.ints;
      extra->doubles = m.doubles;
      extra->tensors = staged_extra;
    }
    for (const auto& kv : root->named_buffers(true)) {
      auto it = staged_buffers.find(kv.key());
      if (it != staged_buffers.end()) kv.value().copy_(it->second.view(kv.value().sizes()));
    }
  });
  return ckpt;
}

}  // namespace fsdp::checkpoint
