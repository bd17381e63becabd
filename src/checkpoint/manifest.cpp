#include "manifest.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "fsdp/common/hash.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/check.h"
#include "io.h"
#include "manifest_check.h"

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
// A field of the wrong type or out of its integer range: the manifest is malformed.
struct FieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// j[key] as an integer in [lo, hi]: JSON floats, strings or out-of-range values are refused
// (nlohmann's get<> would convert 1.5 to 1 and -1 to 4294967295).
template <typename Key>
int64_t int_at(const json& j, const Key& key, int64_t lo = std::numeric_limits<int64_t>::min(),
               int64_t hi = std::numeric_limits<int64_t>::max()) {
  const json& v = j.at(key);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    throw FieldError(str_cat("field '", key, "' is ", v.dump(), ", above ", hi));
  }
  if (!v.is_number_integer()) throw FieldError(str_cat("field '", key, "' is not an integer: ", v.dump()));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) {
    throw FieldError(str_cat("field '", key, "' is ", x, ", outside [", lo, ", ", hi, "]"));
  }
  return x;
}
std::vector<int64_t> shape_at(const json& j) {
  const json& v = j.at("shape");
  if (!v.is_array()) throw FieldError("field 'shape' is not an array: " + v.dump());
  std::vector<int64_t> shape;
  for (size_t i = 0; i < v.size(); ++i) shape.push_back(int_at(v, i));
  return shape;
}
int int32_at(const json& j, const char* key) {
  return static_cast<int>(int_at(j, key, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}
uint32_t crc_of(const json& v, const char* what) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 0xffffffffLL) {
    throw FieldError(str_cat(what, " is not a CRC-32 (an integer in [0, 2^32)): ", v.dump()));
  }
  return static_cast<uint32_t>(v.get<int64_t>());
}

double double_from(const json& j) {
  const std::string hex = j.at("bits").get<std::string>();
  const bool ok = hex.size() == 18 && hex.compare(0, 2, "0x") == 0 &&
                  hex.find_first_not_of("0123456789abcdefABCDEF", 2) == std::string::npos;
  if (!ok) throw FieldError("a double's 'bits' is not \"0x\" and 16 hex digits: '" + hex + "'");
  uint64_t bits = std::stoull(hex.substr(2), nullptr, 16);
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
  s.rank = int32_at(j, "rank");
  s.offset = int_at(j, "offset");
  s.row_begin = int_at(j, "row_begin");
  s.rows = int_at(j, "rows");
  s.chunk_rows = int_at(j, "chunk_rows");
  if (!j.at("chunk_crc32").is_array()) throw FieldError("field 'chunk_crc32' is not an array");
  for (const auto& c : j.at("chunk_crc32")) s.chunk_crc32.push_back(crc_of(c, "a chunk_crc32 entry"));
  return s;
}
json file_json(const FileEntry& f) {
  return json{{"rank", f.rank}, {"path", f.path}, {"bytes", f.bytes}, {"crc32", f.crc32}};
}
FileEntry file_from(const json& j) {
  FileEntry f;
  f.rank = int32_at(j, "rank");
  f.path = j.at("path").get<std::string>();
  f.bytes = int_at(j, "bytes");
  f.crc32 = crc_of(j.at("crc32"), "a file's crc32");
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
  return seal_manifest(j.dump(1));
}

std::string seal_manifest(const std::string& body) {
  FSDP_CHECK(!body.empty() && body[0] == '{', ErrorKind::kInvalidArgument, kNoContext,
             "a manifest body is a JSON object");
  char seal[kSealBytes + 1];
  std::snprintf(seal, sizeof(seal), "{\"manifest_crc32\": \"0x%08x\",", io::crc32_update(0, body.data(), body.size()));
  return seal + body.substr(1);
}

std::string unseal_manifest(const std::string& text, const std::string& path) {
  static const std::string head = "{\"manifest_crc32\": \"0x";
  bool sealed = text.size() > kSealBytes && text.compare(0, head.size(), head) == 0 &&
                text.compare(kSealBytes - 2, 2, "\",") == 0;
  uint32_t want = 0;
  for (size_t i = head.size(); sealed && i < kSealBytes - 2; ++i) {
    const char c = text[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : (c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1);
    sealed = digit >= 0;
    want = want * 16 + static_cast<uint32_t>(std::max(digit, 0));
  }
  FSDP_CHECK(sealed, ErrorKind::kCorruptData, kNoContext, "manifest '", path,
             "' has no seal: its first bytes are not {\"manifest_crc32\": \"0x<8 hex digits>\", (written by "
             "another version, or edited)");
  const std::string body = "{" + text.substr(kSealBytes);
  const uint32_t got = io::crc32_update(0, body.data(), body.size());
  char w[16], g[16];
  std::snprintf(w, sizeof(w), "0x%08x", want);
  std::snprintf(g, sizeof(g), "0x%08x", got);
  FSDP_CHECK(got == want, ErrorKind::kCorruptData, kNoContext, "manifest '", path,
             "' does not match its seal: manifest_crc32 ", w, ", the content's CRC-32 ", g,
             " (edited or damaged after the save; its fields, optimizer options and counters "
             "included, cannot be trusted)");
  return body;
}

Manifest manifest_from_json(const std::string& text, const std::string& path) {
  Manifest m;
  const std::string body = unseal_manifest(text, path);
  try {
    json j = json::parse(body);
    FSDP_CHECK(j.value("format", std::string()) == kFormat, ErrorKind::kCorruptData, kNoContext, "'", path,
               "' is not an fsdp-cpp sharded checkpoint manifest (format '",
               j.value("format", std::string()), "', expected '", kFormat, "')");
    FSDP_CHECK(int_at(j, "version") == kFormatVersion, ErrorKind::kUnsupported, kNoContext,
               "manifest '", path, "' has version ", int_at(j, "version"),
               ", this build reads version ", kFormatVersion);
    m.name = j.at("name").get<std::string>();
    m.seq = int_at(j, "seq");
    m.world_size = int32_at(j, "world_size");
    m.fingerprint = j.at("fingerprint").get<std::string>();
    for (const auto& p : j.at("params")) {
      m.params.push_back({p.at("name").get<std::string>(), shape_at(p),
                          p.at("dtype").get<std::string>()});
    }
    for (const auto& f : j.at("files")) m.files.push_back(file_from(f));
    for (const auto& [name, e] : j.at("tensors").items()) {
      TensorEntry t;
      t.kind = e.at("kind").get<std::string>();
      t.dtype = e.at("dtype").get<std::string>();
      t.shape = shape_at(e);
      t.row_numel = int_at(e, "row_numel");
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
      m.optim_step[fqn] = int_at(s, "step");
      m.optim_state[fqn] = s.at("tensors").get<std::vector<std::string>>();
    }
    const json& ts = j.at("train_state");
    for (const auto& [k, v] : ts.at("ints").items()) m.ints[k] = int_at(ts.at("ints"), k.c_str());
    for (const auto& [k, v] : ts.at("doubles").items()) m.doubles[k] = double_from(v);
    m.extra_tensors = ts.at("tensors").get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kCorruptData, kNoContext,
                str_cat("manifest '", path, "' is malformed: ", e.what()));
  } catch (const FieldError& e) {
    throw Error(ErrorKind::kCorruptData, kNoContext,
                str_cat("manifest '", path, "' is malformed: ", e.what()));
  } catch (const std::logic_error& e) {  // std::stoull of a double's "bits" (fuzz_manifest)
    throw Error(ErrorKind::kCorruptData, kNoContext,
                str_cat("manifest '", path, "' is malformed: a double's bits are not hex (", e.what(), ")"));
  }
  validate_manifest(m, path);
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
  } catch (const FieldError& e) {
    throw Error(ErrorKind::kMismatch, kNoContext,
                str_cat("a rank's report of its shard file is malformed: ", e.what()));
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
  return io::hex64(fnv1a64(all));
}

std::string describe_param_diff(const std::vector<ParamInfo>& saved,
                                const std::vector<ParamInfo>& model, size_t max_names) {
  std::map<std::string, const ParamInfo*> s, m;
  for (const auto& p : saved) s[p.name] = &p;
  for (const auto& p : model) m[p.name] = &p;
  std::vector<std::string> missing, differ, extra;
  for (const auto& [name, p] : m) {
    auto it = s.find(name);
    if (it == s.end()) {
      missing.push_back("'" + name + "'");
    } else if (it->second->shape != p->shape || it->second->dtype != p->dtype) {
      differ.push_back("'" + name + "' (checkpoint " + shape_str(it->second->shape) + " " + it->second->dtype +
                       ", model " + shape_str(p->shape) + " " + p->dtype + ")");
    }
  }
  for (const auto& [name, p] : s) {
    if (!m.count(name)) extra.push_back("'" + name + "'");
  }
  auto group = [&](const std::vector<std::string>& items, const char* what) -> std::string {
    if (items.empty()) return "";
    std::string g = str_cat(items.size(), " ", what, " ");
    for (size_t i = 0; i < items.size() && i < max_names; ++i) g += (i ? ", " : "") + items[i];
    if (items.size() > max_names) g += str_cat(", ... (", items.size() - max_names, " more)");
    return g;
  };
  std::string out;
  for (const std::string& g : {group(differ, "parameter(s) with another shape or dtype:"),
                               group(missing, "model parameter(s) not in the checkpoint:"),
                               group(extra, "checkpoint tensor(s) not in the model:")}) {
    if (!g.empty()) out += (out.empty() ? " " : "; ") + g;
  }
  return out;
}

namespace {

// The complete checkpoints of `dir`, oldest first (by seq); subdirectories that hold a
// manifest.json that does not validate go to *bad with the reason, when bad is given.
std::vector<std::string> scan_checkpoints(const std::string& dir,
                                          std::vector<std::pair<std::string, std::string>>* bad) {
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
    } catch (const Error& err) {
      if (bad) bad->emplace_back(e.path().string(), err.message());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  if (bad) std::sort(bad->begin(), bad->end());
  return out;
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& dir) {
  return scan_checkpoints(dir, nullptr);
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
    // [Note: no silent fallback] A published checkpoint always has a valid manifest (it is
    // written and fsynced before the rename), so a bad one is damage, not an interrupted save:
    // resolving refuses instead of quietly loading an older checkpoint, and names both.
    std::vector<std::pair<std::string, std::string>> bad;  // (directory, why)
    const std::vector<std::string> good = scan_checkpoints(path, &bad);
    const std::string older =
        good.empty() ? std::string(" (no other complete checkpoint in '" + path + "')")
                     : str_cat("; to resume from an older checkpoint, name it explicitly, e.g. '",
                               good.back(), "'");
    if (path_exists(p / kLatestFile)) {
      std::string name = io::read_file((p / kLatestFile).string());
      while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
      const fs::path cand = p / name;
      FSDP_CHECK(!name.empty() && name.find('/') == std::string::npos && name[0] != '.',
                 ErrorKind::kCorruptData, kNoContext, "'", (p / kLatestFile).string(),
                 "' holds '", name, "', not the name of a checkpoint in '", path, "'", older);
      FSDP_CHECK(is_dir(cand), ErrorKind::kCorruptData, kNoContext, "'", (p / kLatestFile).string(),
                 "' names '", name, "', which does not exist", older);
      try {
        read_manifest(cand.string());
      } catch (const Error& e) {
        throw Error(ErrorKind::kCorruptData, kNoContext,
                    str_cat("the latest checkpoint '", cand.string(), "' cannot be loaded: ",
                            e.message(), older));
      }
      return cand.string();
    }
    // No `latest` (a crash after the first publication, before `latest` was written): the
    // highest seq, provided that no checkpoint of the directory is damaged.
    FSDP_CHECK(bad.empty(), ErrorKind::kCorruptData, kNoContext, "checkpoint '",
               bad.empty() ? "" : bad.front().first, "' in '", path,
               "' (which has no 'latest') cannot be loaded: ", bad.empty() ? "" : bad.front().second,
               older);
    FSDP_CHECK(!good.empty(), ErrorKind::kInvalidArgument, kNoContext,
               "no complete checkpoint in '", path, "' (no 'latest' file)");
    return good.back();
  });
}

void verify_checkpoint(const std::string& checkpoint_dir) {
  in_op("verify_checkpoint", [&] {
    Manifest m = read_manifest(checkpoint_dir);
    // One read buffer for every file, no larger than the largest (most files are small), not zeroed.
    int64_t largest = 0;
    for (const auto& f : m.files) largest = std::max(largest, f.bytes);
    const size_t buf_bytes = static_cast<size_t>(std::clamp<int64_t>(largest, 1, int64_t(1) << 22));
    std::unique_ptr<char[]> buf(new char[buf_bytes]);
    for (const auto& f : m.files) {
      const std::string path = (fs::path(checkpoint_dir) / f.path).string();
      io::FileReader r(path);
      FSDP_CHECK(r.size() == f.bytes, ErrorKind::kCorruptData, kNoContext, "checkpoint file '",
                 path, "' (rank ", f.rank, ") has ", r.size(), " bytes, the manifest says ", f.bytes,
                 r.size() < f.bytes ? " (truncated)" : "");
      uint32_t crc = 0;
      for (int64_t off = 0; off < f.bytes;) {
        size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(buf_bytes), f.bytes - off));
        r.read_at(off, buf.get(), n);
        crc = io::crc32_update(crc, buf.get(), n);
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
