// The safetensors format (include/fsdp/checkpoint/safetensors.h).
#include "fsdp/checkpoint/safetensors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/common/check.h"
#include "fsdp/common/hash.h"
#include "io.h"

namespace fsdp::checkpoint {

namespace {

using nlohmann::json;

constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;  // the format's own limit
constexpr int kMaxDims = 16;

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  int64_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};

const DtypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

bool little_endian_host() {
  const uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// A JSON integer that fits int64 and is >= 0 (nlohmann's get<> would turn 1.5 into 1).
bool as_count(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    if (i < 0) return false;
    *out = i;
    return true;
  }
  return false;
}

}  // namespace

int64_t safetensors_element_size(const std::string& dtype) {
  const DtypeInfo* d = find_dtype(dtype);
  return d ? d->bytes : 0;
}

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.type == dtype) return d.name;
  }
  FSDP_CHECK(false, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "safetensors"}), "dtype ", dtype,
             " has no safetensors name here (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
  return "";
}

struct SafetensorsFile::Impl {
  explicit Impl(const std::string& path) : file(path) {}
  io::FileReader file;
};

SafetensorsFile::SafetensorsFile(const std::string& path) {
  const ErrorContext where{-1, "", "safetensors '" + path + "'"};
  FSDP_CHECK(little_endian_host(), ErrorKind::kUnsupported, where,
             "safetensors data is little-endian; this host is not");
  try {
    impl_ = std::make_unique<Impl>(path);
  } catch (const Error& e) {
    throw Error(e.kind(), where, e.message());
  }
  const int64_t size = impl_->file.size();
  FSDP_CHECK(size >= 8, ErrorKind::kCorruptData, where, "the file has ", size,
             " bytes, fewer than the 8 of the header length (truncated or not a safetensors file)");
  unsigned char len_bytes[8];
  impl_->file.read_at(0, len_bytes, 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  FSDP_CHECK(header_len <= static_cast<uint64_t>(size - 8), ErrorKind::kCorruptData, where,
             expected_actual("header length", str_cat("at most the ", size - 8, " bytes after it"), header_len),
             " (truncated, or not a safetensors file)");
  FSDP_CHECK(header_len <= static_cast<uint64_t>(kMaxHeaderBytes), ErrorKind::kCorruptData, where,
             "header length ", header_len, " is past the format's limit of ", kMaxHeaderBytes, " bytes");
  std::string text(header_len, '\0');
  if (header_len) impl_->file.read_at(8, text.data(), header_len);
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  const int64_t data_len = size - data_start;

  // Parse, refusing a name given twice at the top level (nlohmann keeps the last one silently).
  std::string repeated;
  json header;
  try {
    std::set<std::string> seen;
    header = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second &&
          repeated.empty()) {
        repeated = parsed.get<std::string>();
      }
      return true;
    });
  } catch (const json::exception& e) {
    FSDP_CHECK(false, ErrorKind::kCorruptData, where, "the header is not valid JSON: ", e.what());
  }
  FSDP_CHECK(repeated.empty(), ErrorKind::kCorruptData, where, "the header names '", repeated, "' twice");
  FSDP_CHECK(header.is_object(), ErrorKind::kCorruptData, where, "the header is JSON but not an object");

  std::vector<std::pair<int64_t, std::string>> by_offset;  // (begin, name)
  std::map<std::string, int64_t> ends;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      FSDP_CHECK(v.is_object(), ErrorKind::kCorruptData, where, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        FSDP_CHECK(m.value().is_string(), ErrorKind::kCorruptData, where, "__metadata__ value of '", m.key(),
                   "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const ErrorContext at{-1, "", where.op + ", tensor '" + name + "'"};
    FSDP_CHECK(v.is_object() && v.size() == 3 && v.contains("dtype") && v.contains("shape") &&
                   v.contains("data_offsets"),
               ErrorKind::kCorruptData, at, "expected exactly dtype, shape and data_offsets, got ", v.dump().substr(0, 200));
    FSDP_CHECK(v["dtype"].is_string(), ErrorKind::kCorruptData, at, "dtype is not a string");
    SafetensorsEntry e;
    e.dtype = v["dtype"].get<std::string>();
    const DtypeInfo* d = find_dtype(e.dtype);
    FSDP_CHECK(d != nullptr, ErrorKind::kUnsupported, at, "dtype '", e.dtype,
               "' is not read here (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
    e.scalar_type = d->type;
    const json& shape = v["shape"];
    FSDP_CHECK(shape.is_array() && shape.size() <= kMaxDims, ErrorKind::kCorruptData, at,
               "shape is not an array of at most ", kMaxDims, " dims");
    int64_t numel = 1;
    for (const auto& dim : shape) {
      int64_t n = 0;
      FSDP_CHECK(as_count(dim, &n), ErrorKind::kCorruptData, at, "shape ", shape.dump(),
                 " holds a value that is not an integer >= 0");
      FSDP_CHECK(n == 0 || numel <= (int64_t{1} << 62) / n, ErrorKind::kCorruptData, at, "shape ", shape.dump(),
                 " has more elements than any file holds");
      numel *= n;
      e.shape.push_back(n);
    }
    const json& off = v["data_offsets"];
    int64_t begin = 0, end = 0;
    FSDP_CHECK(off.is_array() && off.size() == 2 && as_count(off[0], &begin) && as_count(off[1], &end),
               ErrorKind::kCorruptData, at, "data_offsets is not [begin, end] of integers >= 0");
    FSDP_CHECK(begin <= end && end <= data_len, ErrorKind::kCorruptData, at, "data_offsets [", begin, ", ", end,
               "] are not inside the file's ", data_len, " data bytes");
    FSDP_CHECK(end - begin == numel * d->bytes, ErrorKind::kCorruptData, at, "data_offsets [", begin, ", ", end,
               "] hold ", end - begin, " bytes; shape ", shape.dump(), " of ", e.dtype, " needs ", numel * d->bytes);
    e.data_begin = data_start + begin;
    e.nbytes = end - begin;
    by_offset.push_back({begin, name});
    ends[name] = end;
    tensors_.emplace(name, std::move(e));
  }
  // The tensors tile the data: sorted by offset, each starts where the previous one ended.
  std::sort(by_offset.begin(), by_offset.end());
  int64_t covered = 0;
  std::string previous = "the start of the data";
  for (const auto& [begin, name] : by_offset) {
    FSDP_CHECK(begin == covered, ErrorKind::kCorruptData, (ErrorContext{-1, "", where.op + ", tensor '" + name + "'"}),
               begin < covered ? "its bytes overlap those of " : "a hole of unindexed bytes lies between it and ",
               previous, " (offset ", begin, ", expected ", covered, ")");
    covered = ends[name];
    previous = "'" + name + "'";
  }
  FSDP_CHECK(covered == data_len, ErrorKind::kCorruptData, where, "the tensors end at data byte ", covered,
             " but the file holds ", data_len, " (bytes past the last tensor: extended or not one file)");
}

SafetensorsFile::~SafetensorsFile() = default;

const std::string& SafetensorsFile::path() const { return impl_->file.path(); }

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  FSDP_CHECK(it != tensors_.end(), ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "safetensors '" + path() + "'"}),
             "no tensor '", name, "' in the file");
  return it->second;
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.scalar_type));
  if (e.nbytes) impl_->file.read_at(e.data_begin, t.data_ptr(), static_cast<size_t>(e.nbytes));
  return t;
}

at::Tensor SafetensorsFile::read_rows(const std::string& name, int64_t row_begin, int64_t rows) const {
  const SafetensorsEntry& e = entry(name);
  const ErrorContext at{-1, "", "safetensors '" + path() + "', tensor '" + name + "'"};
  FSDP_CHECK(!e.shape.empty(), ErrorKind::kInvalidArgument, at, "a scalar has no rows");
  FSDP_CHECK(row_begin >= 0 && rows >= 0 && row_begin + rows <= e.shape[0], ErrorKind::kInvalidArgument, at,
             "rows [", row_begin, ", ", row_begin + rows, ") are outside dim 0 of size ", e.shape[0]);
  std::vector<int64_t> shape = e.shape;
  shape[0] = rows;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(e.scalar_type));
  const int64_t row_bytes = e.shape[0] ? e.nbytes / e.shape[0] : 0;
  if (rows && row_bytes) {
    impl_->file.read_at(e.data_begin + row_begin * row_bytes, t.data_ptr(), static_cast<size_t>(rows * row_bytes));
  }
  return t;
}

uint64_t SafetensorsFile::fingerprint() const {
  const int64_t size = impl_->file.size();
  uint64_t h = fnv1a64(&size, sizeof(size));
  uint8_t len_bytes[8];
  impl_->file.read_at(0, len_bytes, 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];  // validated on open
  std::string header(header_len, '\0');
  if (header_len) impl_->file.read_at(8, header.data(), header_len);
  h = fnv1a64(header.data(), header.size(), h);
  const int64_t data_begin = 8 + static_cast<int64_t>(header_len), data_bytes = size - data_begin;
  constexpr int64_t kSamples = 64, kSampleBytes = 64;
  char sample[kSampleBytes];
  for (int64_t k = 0; k < kSamples && data_bytes > 0; ++k) {
    const int64_t n = std::min(kSampleBytes, data_bytes);
    const int64_t at = data_begin + (data_bytes - n) * k / (kSamples - 1);
    impl_->file.read_at(at, sample, static_cast<size_t>(n));
    h = fnv1a64(sample, static_cast<size_t>(n), h);
  }
  return h;
}

uint64_t SafetensorsCheckpoint::fingerprint() const {
  uint64_t h = fnv1a64(std::string("safetensors"));
  for (const auto& f : files_) {
    const std::string name = std::filesystem::path(f->path()).filename().string();
    h = fnv1a64(name.data(), name.size(), h);
    const uint64_t fp = f->fingerprint();
    h = fnv1a64(&fp, sizeof(fp), h);
  }
  return h;
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const ErrorContext where{-1, "", "safetensors checkpoint '" + dir + "'"};
  std::error_code ec;
  FSDP_CHECK(!(fs::exists(index_path, ec) && fs::exists(single, ec)), ErrorKind::kInvalidArgument, where,
             "holds both model.safetensors and model.safetensors.index.json: two checkpoints in one directory "
             "(loaders disagree on which is meant); keep one");
  if (!fs::exists(index_path, ec)) {
    FSDP_CHECK(fs::exists(single, ec), ErrorKind::kIo, where,
               "neither model.safetensors nor model.safetensors.index.json is there");
    files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (const auto& [name, e] : files_.back()->tensors()) where_[name] = files_.back().get();
    return;
  }
  const ErrorContext at{-1, "", "safetensors index '" + index_path + "'"};
  json index;
  try {
    index = json::parse(io::read_file(index_path));
  } catch (const json::exception& e) {
    FSDP_CHECK(false, ErrorKind::kCorruptData, at, "not valid JSON: ", e.what());
  }
  FSDP_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
             ErrorKind::kCorruptData, at, "no weight_map object");
  std::map<std::string, std::string> weight_map;  // tensor -> file name
  std::map<std::string, const SafetensorsFile*> by_file;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    FSDP_CHECK(it.value().is_string(), ErrorKind::kCorruptData, at, "weight_map['", it.key(), "'] is not a file name");
    const std::string file = it.value().get<std::string>();
    FSDP_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
               ErrorKind::kCorruptData, at, "weight_map['", it.key(), "'] = '", file,
               "' is not a file name in the checkpoint's directory");
    weight_map[it.key()] = file;
    if (!by_file.count(file)) {
      const std::string p = (fs::path(dir) / file).string();
      FSDP_CHECK(fs::exists(p, ec), ErrorKind::kIo, at, "file '", file, "' (of tensor '", it.key(), "') is missing");
      files_.push_back(std::make_unique<SafetensorsFile>(p));
      by_file[file] = files_.back().get();
    }
  }
  for (const auto& [name, file] : weight_map) {
    const SafetensorsFile* f = by_file[file];
    FSDP_CHECK(f->tensors().count(name), ErrorKind::kCorruptData, at, "tensor '", name, "' is not in '", file,
               "', where the index puts it");
    where_[name] = f;
  }
  for (const auto& [file, f] : by_file) {
    for (const auto& [name, e] : f->tensors()) {
      FSDP_CHECK(weight_map.count(name) && weight_map[name] == file, ErrorKind::kCorruptData, at, "'", file,
                 "' holds tensor '", name, "', which the index ",
                 weight_map.count(name) ? "puts in '" + weight_map[name] + "'" : std::string("does not name"));
    }
  }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  FSDP_CHECK(it != where_.end(), ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "safetensors checkpoint '" + dir_ + "'"}),
             "no tensor '", name, "'");
  return *it->second;
}

}  // namespace fsdp::checkpoint
