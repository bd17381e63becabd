// A manifest and a rank's report as JSON: writing them, and reading every field back with its type
// and range checked (docs/checkpoints.md, "Manifest").
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "../common/json_fields.h"
#include "fsdp/common/check.h"
#include "io.h"
#include "manifest.h"
#include "manifest_check.h"

namespace fsdp::checkpoint {

using nlohmann::json;

namespace {

using json_fields::FieldError;
using json_fields::integer_at;
using json_fields::integer_in_range;

// Doubles are stored as their IEEE-754 bits (exact, and inf/nan survive JSON) next to the value.
json double_json(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  return json{{"value", std::isfinite(v) ? json(v) : json(nullptr)}, {"bits", io::hex64(bits)}};
}

// Integers: JSON floats, strings or out-of-range values are refused (nlohmann's get<> would
// convert 1.5 to 1 and -1 to 4294967295); a field of the wrong type or out of its range throws
// FieldError (the manifest is malformed).
std::vector<int64_t> shape_at(const json& j) {
  const json& v = j.at("shape");
  if (!v.is_array()) throw FieldError("field 'shape' is not an array: " + v.dump());
  std::vector<int64_t> shape;
  for (size_t i = 0; i < v.size(); ++i) shape.push_back(integer_in_range(v.at(i), std::to_string(i)));
  return shape;
}
int int32_at(const json& j, const char* key) {
  return static_cast<int>(integer_at(j, key, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
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
  s.offset = integer_at(j, "offset");
  s.row_begin = integer_at(j, "row_begin");
  s.rows = integer_at(j, "rows");
  s.chunk_rows = integer_at(j, "chunk_rows");
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
  f.bytes = integer_at(j, "bytes");
  f.crc32 = crc_of(j.at("crc32"), "a file's crc32");
  return f;
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

Manifest manifest_from_json(const std::string& text, const std::string& path) {
  Manifest m;
  const std::string body = unseal_manifest(text, path);
  try {
    json j = json::parse(body);
    FSDP_CHECK(j.value("format", std::string()) == kFormat, ErrorKind::kCorruptData, kNoContext, "'", path,
               "' is not an fsdp-cpp sharded checkpoint manifest (format '",
               j.value("format", std::string()), "', expected '", kFormat, "')");
    FSDP_CHECK(integer_at(j, "version") == kFormatVersion, ErrorKind::kUnsupported, kNoContext,
               "manifest '", path, "' has version ", integer_at(j, "version"),
               ", this build reads version ", kFormatVersion);
    m.name = j.at("name").get<std::string>();
    m.seq = integer_at(j, "seq");
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
      t.row_numel = integer_at(e, "row_numel");
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
      m.optim_step[fqn] = integer_at(s, "step");
      m.optim_state[fqn] = s.at("tensors").get<std::vector<std::string>>();
    }
    const json& ts = j.at("train_state");
    for (const auto& [k, v] : ts.at("ints").items()) m.ints[k] = integer_at(ts.at("ints"), k.c_str());
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

}  // namespace fsdp::checkpoint
