// SafetensorsWriter (safetensors.h): a safetensors file written tensor by tensor.
#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/common/check.h"
#include "io.h"

namespace fsdp::checkpoint {

using json = nlohmann::json;

struct SafetensorsWriter::Impl {
  std::string path;
  std::string tmp;
  std::vector<Spec> specs;
  size_t next = 0;
  std::unique_ptr<io::FileWriter> out;
  bool finished = false;
};

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<Spec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : impl_(std::make_unique<Impl>()) {
  const ErrorContext where{-1, "", "safetensors writer '" + path + "'"};
  impl_->path = path;
  impl_->tmp = path + ".tmp";
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  std::set<std::string> names;
  for (const auto& s : specs) {
    FSDP_CHECK(s.name != "__metadata__" && names.insert(s.name).second, ErrorKind::kInvalidArgument, where,
               "tensor name '", s.name, "' is repeated or reserved");
    const std::string dtype = safetensors_dtype_name(s.dtype);
    int64_t numel = 1;
    for (int64_t d : s.shape) {
      FSDP_CHECK(d >= 0, ErrorKind::kInvalidArgument, where, "tensor '", s.name, "' has a negative dim");
      numel *= d;
    }
    const int64_t bytes = numel * safetensors_element_size(dtype);
    header[s.name] = {{"dtype", dtype}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as writers do
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  impl_->specs = std::move(specs);
  try {
    impl_->out = std::make_unique<io::FileWriter>(impl_->tmp);
    impl_->out->write(len, 8);
    impl_->out->write(text.data(), text.size());
  } catch (const Error& e) {
    std::remove(impl_->tmp.c_str());
    throw Error(e.kind(), where, e.message());
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (impl_ && !impl_->finished) {
    impl_->out.reset();
    std::remove(impl_->tmp.c_str());
  }
}

void SafetensorsWriter::append(const std::string& name, const at::Tensor& tensor) {
  const ErrorContext where{-1, "", "safetensors writer '" + impl_->path + "'"};
  FSDP_CHECK(impl_->next < impl_->specs.size() && impl_->specs[impl_->next].name == name, ErrorKind::kInvalidArgument,
             where, "appended '", name, "', expected ",
             impl_->next < impl_->specs.size() ? "'" + impl_->specs[impl_->next].name + "'" : std::string("no more tensors"));
  const Spec& s = impl_->specs[impl_->next];
  FSDP_CHECK(tensor.scalar_type() == s.dtype && tensor.sizes().vec() == s.shape, ErrorKind::kInvalidArgument, where,
             "tensor '", name, "' is ", tensor.sizes(), " ", tensor.scalar_type(), ", declared ", at::IntArrayRef(s.shape),
             " ", s.dtype);
  const at::Tensor c = tensor.detach().to(at::kCPU).contiguous();
  try {
    if (c.nbytes()) impl_->out->write(c.data_ptr(), c.nbytes());
  } catch (const Error& e) {
    throw Error(e.kind(), where, e.message());
  }
  ++impl_->next;
}

void SafetensorsWriter::finish() {
  const ErrorContext where{-1, "", "safetensors writer '" + impl_->path + "'"};
  FSDP_CHECK(impl_->next == impl_->specs.size(), ErrorKind::kInvalidArgument, where, "finished after ", impl_->next,
             " of ", impl_->specs.size(), " tensors");
  try {
    impl_->out->close(/*durable=*/true);
    FSDP_CHECK(std::rename(impl_->tmp.c_str(), impl_->path.c_str()) == 0, ErrorKind::kIo, where, "rename of '",
               impl_->tmp, "' failed: ", std::strerror(errno));
    const auto parent = std::filesystem::path(impl_->path).parent_path().string();
    io::fsync_dir(parent.empty() ? "." : parent);
  } catch (const Error& e) {
    std::remove(impl_->tmp.c_str());
    throw Error(e.kind(), where, e.message());
  }
  impl_->finished = true;
}

}  // namespace fsdp::checkpoint
