#include "manifest.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/check.h"
#include "io.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// Doubles are stored as their IEEE-754 bits (exact, and inf/nan survive JSON) next to the value.
json double_json(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  return json{{"value", std::isfinite(v) ? json(v) : json(nullptr)}, {"bits", io::hex64(bits)}};
}
double double_from(const json& j) {
  uint64_t bits = std::stoull(j.at("bits").get<std::string>(), nullptr, 16);
  double v;
  std::memcpy(&v, &bits, 8);
  return v;
}

json shard_json(const ShardEntry& s) {
  return json{{"rank", s.rank},           {"offset", s.offset},         {"row_begin", s.row_begin},
              {"rows", s.rows},           {"chunk_rows", s.chunk_rows}, {"chunk_crc32", s.chunk_crc32}};
}
ShardEntry shard_from(const json& j) {
  ShardEntry s;
  s.rank = j.at("rank").get<int>();
  s.offset = j.at("offset").get<int64_t>();
  s.row_begin = j.at("row_begin").get<int64_t>();
  s.rows = j.at("rows").get<int64_t>();
  s.chunk_rows = j.at("chunk_rows").get<int64_t>();
  s.chunk_crc32 = j.at("chunk_crc32").get<std::vector<uint32_t>>();
  return s;
}
json file_json(const FileEntry& f) {
  return json{{"rank", f.rank}, {"path", f.path}, {"bytes", f.bytes}, {"crc32", f.crc32}};
}
FileEntry file_from(const json& j) {
  FileEntry f;
  f.rank = j.at("rank").get<int>();
  f.path = j.at("path").get<std::string>();
  f.bytes = j.at("bytes").get<int64_t>();
  f.crc32 = j.at("crc32").get<uint32_t>();
  return f;
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}
bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// Functions that know no rank or operation throw with this context: the public entry points
// below name themselves (in_op), save_sharded and load_sharded add theirs (agreement.h).
const ErrorContext kNoContext{};

// Runs fn; an fsdp::Error thrown without an operation gets `op` (kind and message kept).
template <typename Fn>
auto in_op(const char* op, Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    if (!e.where().op.empty() || e.where().rank >= 0) throw;
    throw Error(e.kind(), ErrorContext{-1, e.where().unit, op}, e.message());
  }
}

}  // namespace

std::string manifest_to_json(const Manifest& m) {
  json j;
  j["format"] = kFormat;
  j["version"] = kFormatVersion;
  j["name"] = m.name;
  j["seq"] = m.seq;
  j["world_size"] = m.world_size;
  j["fingerprint"] = m.fingerprint;
  j["params"] = json::array();
  for (const auto& p : m.params) {
    j["params"].push_back(json{{"name", p.name}, {"shape", p.shape}, {"dtype", p.dtype}});
  }
  j["files"] = json::array();
  for (const auto& f : m.files) j["files"].push_back(file_json(f));
  j["tensors"] = json::object();
  for (const auto& [name, t] : m.tensors) {
    json e{{"kind", t.kind}, {"dtype", t.dtype}, {"shape", t.shape}, {"row_numel", t.row_numel}};
    e["shards"] = json::array();
    for (const auto& s : t.shards) e["shards"].push_back(shard_json(s));
    j["tensors"][name] = e;
  }
  json opt;
  opt["type"] = m.optimizer;
  opt["group_lrs"] = json::array();
  for (double lr : m.group_lrs) opt["group_lrs"].push_back(double_json(lr));
  if (!m.groups.empty()) {  // optional: absent in older manifests
    opt["groups"] = json::array();
    for (const auto& g : m.groups) {
      json options = json::object();
      for (const auto& [k, v] : g.options) options[k] = double_json(v);
      opt["groups"].push_back(json{{"members", g.members}, {"options", options}});
    }
  }
  opt["state"] = json::object();
  for (const auto& [fqn, step] : m.optim_step) {
    opt["state"][fqn] = json{{"step", step}, {"tensors", m.optim_state.at(fqn)}};
  }
  j["optimizer"] = opt;
  json ts;
  ts["ints"] = m.ints;
  ts["doubles"] = json::object();
  for (const auto& [k, v] : m.doubles) ts["doubles"][k] = double_json(v);
  ts["tensors"] = m.extra_tensors;
  j["train_state"] = ts;
  return j.dump(1);
}

Manifest manifest_from_json(const std::string& text, const std::string& path) {
  Manifest m;
  try {
    json j = json::parse(text);
    FSDP_CHECK(j.value("format", std::string()) == kFormat, ErrorKind::kCorruptData, kNoContext, "'", path,
               "' is not an fsdp-cpp sharded checkpoint manifest (format '",
               j.value("format", std::string()), "', expected '", kFormat, "')");
    FSDP_CHECK(j.at("version").get<int>() == kFormatVersion, ErrorKind::kUnsupported, kNoContext,
               "manifest '", path, "' has version ", j.at("version").get<int>(),
               ", this build reads version ", kFormatVersion);
    m.name = j.at("name").get<std::string>();
    m.seq = j.at("seq").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.fingerprint = j.at("fingerprint").get<std::string>();
    for (const auto& p : j.at("params")) {
      m.params.push_back({p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>(),
                          p.at("dtype").get<std::string>()});
    }
    for (const auto& f : j.at("files")) m.files.push_back(file_from(f));
    for (const auto& [name, e] : j.at("tensors").items()) {
      TensorEntry t;
      t.kind = e.at("kind").get<std::string>();
      t.dtype = e.at("dtype").get<std::string>();
      t.shape = e.at("shape").get<std::vector<int64_t>>();
      t.row_numel = e.at("row_numel").get<int64_t>();
      for (const auto& s : e.at("shards")) t.shards.push_back(shard_from(s));
      m.tensors.emplace(name, std::move(t));
    }
    const json& opt = j.at("optimizer");
    m.optimizer = opt.at("type").get<std::string>();
    for (const auto& lr : opt.at("group_lrs")) m.group_lrs.push_back(double_from(lr));
    if (opt.contains("groups")) {
      for (const auto& g : opt.at("groups")) {
        SavedGroup sg;
        sg.members = g.at("members").get<std::vector<std::string>>();
        for (const auto& [k, v] : g.at("options").items()) sg.options[k] = double_from(v);
        m.groups.push_back(std::move(sg));
      }
      FSDP_CHECK(m.groups.size() == m.group_lrs.size(), ErrorKind::kCorruptData, kNoContext,
                 "manifest '", path, "' is malformed: ",
                 expected_actual("optimizer.groups entries (one per group_lrs entry)",
                                 m.group_lrs.size(), m.groups.size()));
    }
    for (const auto& [fqn, s] : opt.at("state").items()) {
      m.optim_step[fqn] = s.at("step").get<int64_t>();
      m.optim_state[fqn] = s.at("tensors").get<std::vector<std::string>>();
    }
    const json& ts = j.at("train_state");
    m.ints = ts.at("ints").get<std::map<std::string, int64_t>>();
    for (const auto& [k, v] : ts.at("doubles").items()) m.doubles[k] = double_from(v);
    m.extra_tensors = ts.at("tensors").get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kCorruptData, kNoContext,
                str_cat("manifest '", path, "' is malformed: ", e.what()));
  }
  return m;
}

Manifest read_manifest(const std::string& checkpoint_dir) {
  const std::string path = (fs::path(checkpoint_dir) / kManifestFile).string();
  FSDP_CHECK(path_exists(path), ErrorKind::kCorruptData, kNoContext, "'", checkpoint_dir,
             "' is an incomplete checkpoint: it has no ", kManifestFile,
             " (the save that wrote it was interrupted before publishing)");
  return manifest_from_json(io::read_file(path), path);
}

std::string report_to_json(const RankReport& r) {
  json j;
  j["file"] = file_json(r.file);
  j["shards"] = json::array();
  for (const auto& [name, s] : r.shards) {
    json e = shard_json(s);
    e["name"] = name;
    e["dtype"] = r.dtypes.at(name);
    j["shards"].push_back(e);
  }
  return j.dump();
}

RankReport report_from_json(const std::string& text) {
  RankReport r;
  try {
    json j = json::parse(text);
    r.file = file_from(j.at("file"));
    for (const auto& e : j.at("shards")) {
      std::string name = e.at("name").get<std::string>();
      r.shards.emplace_back(name, shard_from(e));
      r.dtypes[name] = e.at("dtype").get<std::string>();
    }
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kMismatch, kNoContext,
                str_cat("a rank's report of its shard file is malformed (ranks running different "
                        "builds?): ", e.what()));
  }
  return r;
}

std::string rank_file_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rank-%05d-of-%05d.bin", rank, world_size);
  return buf;
}

std::string fingerprint(const std::vector<ParamInfo>& params) {
  std::vector<std::string> lines;
  for (const auto& p : params) lines.push_back(p.name + " " + shape_str(p.shape) + " " + p.dtype);
  std::sort(lines.begin(), lines.end());
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  return io::hex64(io::fnv1a64(all));
}

std::string describe_param_diff(const std::vector<ParamInfo>& saved,
                                const std::vector<ParamInfo>& model, size_t max_lines) {
  std::map<std::string, const ParamInfo*> s, m;
  for (const auto& p : saved) s[p.name] = &p;
  for (const auto& p : model) m[p.name] = &p;
  std::vector<std::string> lines;
  for (const auto& [name, p] : m) {
    auto it = s.find(name);
    if (it == s.end()) {
      lines.push_back("parameter '" + name + "' of the model is not in the checkpoint");
    } else if (it->second->shape != p->shape || it->second->dtype != p->dtype) {
      lines.push_back("parameter '" + name + "': checkpoint has " + shape_str(it->second->shape) +
                      " " + it->second->dtype + ", model expects " + shape_str(p->shape) + " " +
                      p->dtype);
    }
  }
  for (const auto& [name, p] : s) {
    if (!m.count(name)) lines.push_back("checkpoint tensor '" + name + "' is not in the model");
  }
  std::string out;
  for (size_t i = 0; i < lines.size() && i < max_lines; ++i) out += "\n  " + lines[i];
  if (lines.size() > max_lines) out += str_cat("\n  ... and ", lines.size() - max_lines, " more");
  return out;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || !is_dir(e.path())) continue;
    const fs::path mpath = e.path() / kManifestFile;
    if (!path_exists(mpath)) continue;
    try {
      Manifest m = manifest_from_json(io::read_file(mpath.string()), mpath.string());
      found.emplace_back(m.seq, e.path().string());
    } catch (const Error&) {
      // not a complete checkpoint: never listed
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::string resolve_checkpoint(const std::string& path) {
  return in_op("resolve_checkpoint", [&] {
    FSDP_CHECK(is_dir(path), ErrorKind::kInvalidArgument, kNoContext, "checkpoint path '", path,
               "' does not exist or is not a directory");
    const fs::path p(path);
    if (path_exists(p / kManifestFile)) {
      read_manifest(path);  // throws if malformed
      return path;
    }
    const std::string base = p.filename().string();
    bool has_rank_files = false;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(p, ec)) {
      has_rank_files = has_rank_files || e.path().filename().string().rfind("rank-", 0) == 0;
    }
    FSDP_CHECK(!has_rank_files && base.rfind(kTmpPrefix, 0) != 0, ErrorKind::kCorruptData,
               kNoContext, "'", path, "' is an incomplete checkpoint: it has no ", kManifestFile,
               " (the save that wrote it was interrupted before publishing)");
    std::string latest_note = "no 'latest' file";
    if (path_exists(p / kLatestFile)) {
      std::string name = io::read_file((p / kLatestFile).string());
      while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
      const fs::path cand = p / name;
      if (!name.empty() && name.find('/') == std::string::npos && path_exists(cand / kManifestFile)) {
        try {
          read_manifest(cand.string());
          return cand.string();
        } catch (const Error&) {
        }
      }
      latest_note = "'latest' names '" + name + "', which is not a complete checkpoint";
    }
    auto all = list_checkpoints(path);
    FSDP_CHECK(!all.empty(), ErrorKind::kInvalidArgument, kNoContext,
               "no complete checkpoint in '", path, "' (", latest_note, ")");
    return all.back();
  });
}

void verify_checkpoint(const std::string& checkpoint_dir) {
  in_op("verify_checkpoint", [&] {
    Manifest m = read_manifest(checkpoint_dir);
    for (const auto& f : m.files) {
      const std::string path = (fs::path(checkpoint_dir) / f.path).string();
      io::FileReader r(path);
      FSDP_CHECK(r.size() == f.bytes, ErrorKind::kCorruptData, kNoContext, "checkpoint file '",
                 path, "' (rank ", f.rank, ") has ", r.size(), " bytes, the manifest says ", f.bytes,
                 r.size() < f.bytes ? " (truncated)" : "");
      std::vector<char> buf(size_t(1) << 22);
      uint32_t crc = 0;
      for (int64_t off = 0; off < f.bytes;) {
        size_t n = static_cast<size_t>(std::min<int64_t>(buf.size(), f.bytes - off));
        r.read_at(off, buf.data(), n);
        crc = io::crc32_update(crc, buf.data(), n);
        off += static_cast<int64_t>(n);
      }
      char want[11], got[11];
      std::snprintf(want, sizeof(want), "0x%08x", f.crc32);
      std::snprintf(got, sizeof(got), "0x%08x", crc);
      FSDP_CHECK(crc == f.crc32, ErrorKind::kCorruptData, kNoContext, "checkpoint file '", path,
                 "' (rank ", f.rank, "): CRC-32 mismatch, manifest ", want, ", file ", got,
                 " (corrupted)");
    }
  });
}

}  // namespace fsdp::checkpoint
