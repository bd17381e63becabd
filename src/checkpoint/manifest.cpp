// The manifest's seal, reading manifest.json, rank file names and the model's fingerprint
// (docs/checkpoints.md, "Manifest"; its JSON form: manifest_json.cpp).
#include "manifest.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "fsdp/common/check.h"
#include "fsdp/common/hash.h"
#include "io.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

}  // namespace

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

Manifest read_manifest(const std::string& checkpoint_dir) {
  const std::string path = (fs::path(checkpoint_dir) / kManifestFile).string();
  std::error_code ec;
  FSDP_CHECK(fs::exists(path, ec), ErrorKind::kCorruptData, kNoContext, "'", checkpoint_dir,
             "' is an incomplete checkpoint: it has no ", kManifestFile,
             " (the save that wrote it was interrupted before publishing)");
  return manifest_from_json(io::read_file(path), path);
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

}  // namespace fsdp::checkpoint
