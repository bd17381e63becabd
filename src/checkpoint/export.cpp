// export_full / import_full: a torch.load-able Dict[str, Tensor].
#include "fsdp/checkpoint/export.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <map>
#include <set>

#include "agreement.h"
#include "fsdp/common/hash.h"
#include "param_views.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/state_dict.h"
#include "io.h"
#include "torch_file.h"

namespace fsdp::checkpoint {

namespace {

// torch::pickle_save, without the type tags of typed containers (tag_aggregates = false): Python's
// torch.load(weights_only=True) refuses the torch.jit._pickle.restore_type_tag global that
// pickle_save emits for a c10::Dict<std::string, at::Tensor>.
std::string pickle_untagged(const c10::Dict<std::string, at::Tensor>& dict) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* p, size_t n) { pickle.insert(pickle.end(), p, p + n); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) -> size_t {
    out.append(static_cast<const char*>(p), n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return out;
}

// [Note: wrapper prefixes] A state dict saved from a wrapped module has every key prefixed:
// "module." (torch.nn.DataParallel / DistributedDataParallel) or "_orig_mod." (torch.compile).
// When no key names a parameter of the model as it is and every key carries the same such
// prefix, the prefix is removed (repeatedly: "_orig_mod.module.x" -> "x"). Otherwise the keys
// are kept as they are and the name checks below report what is missing.
std::map<std::string, at::Tensor> without_wrapper_prefix(std::map<std::string, at::Tensor> all,
                                                         const std::shared_ptr<torch::nn::Module>& root) {
  std::set<std::string> model;
  for (const auto& sp : sharded_parameters(root)) model.insert(sp.name);
  for (const std::string prefix : {"module.", "_orig_mod."}) {
    bool none_match = true, all_prefixed = !all.empty();
    for (const auto& [k, t] : all) {
      none_match = none_match && model.count(k) == 0;
      all_prefixed = all_prefixed && k.rfind(prefix, 0) == 0;
    }
    if (!none_match || !all_prefixed) continue;
    std::map<std::string, at::Tensor> stripped;
    for (auto& [k, t] : all) stripped.emplace(k.substr(prefix.size()), t);
    return without_wrapper_prefix(std::move(stripped), root);
  }
  return all;
}

}  // namespace

void export_full(const std::string& path, const std::shared_ptr<torch::nn::Module>& root,
                 const comm::ProcessGroupPtr& group) {
  FSDP_CHECK(group, ErrorKind::kInvalidArgument, ErrorContext{-1, "", "export_full"},
             "null process group");
  const int rank = group->rank();
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& sp : sharded_parameters(root)) {
    at::Tensor full = gather_full_tensor(*sp.unit, *sp.param, /*grad=*/false);  // collective
    if (rank == 0) dict.insert(sp.name, full.to(at::kCPU));
  }
  Agreement agree(*group, "export_full '" + path + "'");
  agree.run("writing", [&] {
    if (rank != 0) return;
    for (const auto& kv : root->named_buffers(/*recurse=*/true)) {
      if (kv.value().defined()) dict.insert(kv.key(), kv.value().detach().to(at::kCPU).clone());
    }
    io::atomic_write_file(path, pickle_untagged(dict), /*durable=*/true);
  });
}

void import_full(const std::string& path, const std::shared_ptr<torch::nn::Module>& root,
                 const comm::ProcessGroupPtr& group) {
  FSDP_CHECK(group, ErrorKind::kInvalidArgument, ErrorContext{-1, "", "import_full"},
             "null process group");
  const int rank = group->rank();
  const ErrorContext who{rank, "", "import_full '" + path + "'"};
  Agreement agree(*group, "import_full '" + path + "'");
  std::map<std::string, at::Tensor> params, buffers;
  uint64_t fingerprint = fnv1a64("", 0);  // of every name, dtype, shape and byte read
  agree.run("reading and validating", [&] {
    check_no_pending_gradients(root, who);
    std::map<std::string, at::Tensor> all;
    for (auto& [name, t] : read_torch_tensor_dict(path, who)) {
      FSDP_CHECK(all.emplace(name, t).second, ErrorKind::kCorruptData, who, "key '", name,
                 "' appears twice in the file");
    }
    for (const auto& [name, t] : all) {
      const at::Tensor c = t.contiguous();
      const std::string head = name + "#" + std::string(c10::toString(c.scalar_type())) + "#" + shard::shape_to_string(c.sizes().vec());
      fingerprint = fnv1a64(head.data(), head.size(), fingerprint);
      fingerprint = fnv1a64(c.data_ptr(), c.nbytes(), fingerprint);
    }
    all = without_wrapper_prefix(std::move(all), root);
    for (const auto& sp : sharded_parameters(root)) {
      auto it = all.find(sp.name);
      FSDP_CHECK(it != all.end(), ErrorKind::kInvalidArgument, who, "parameter '", sp.name,
                 "' is missing from the file");
      FSDP_CHECK(it->second.sizes().vec() == sp.param->shape &&
                     it->second.scalar_type() == sp.tensor.scalar_type(),
                 ErrorKind::kInvalidArgument, who, "tensor '", sp.name, "' is ", it->second.sizes(), " ",
                 it->second.scalar_type(), " in the file, the model has ",
                 shard::shape_to_string(sp.param->shape), " ", sp.tensor.scalar_type());
      params[sp.name] = it->second;
      all.erase(it);
    }
    for (const auto& kv : root->named_buffers(/*recurse=*/true)) {
      if (!kv.value().defined()) continue;
      auto it = all.find(kv.key());
      FSDP_CHECK(it != all.end(), ErrorKind::kInvalidArgument, who, "buffer '", kv.key(),
                 "' is missing from the file");
      FSDP_CHECK(it->second.sizes() == kv.value().sizes(), ErrorKind::kInvalidArgument, who,
                 "buffer '", kv.key(), "' is ", it->second.sizes(), " in the file, the model has ",
                 kv.value().sizes());
      buffers[kv.key()] = it->second;
      all.erase(it);
    }
    FSDP_CHECK(all.empty(), ErrorKind::kInvalidArgument, who, "the file has ", all.size(),
               " tensors the model does not, e.g. '", all.empty() ? "" : all.begin()->first, "'");
  });
  // Every rank must have read the same file: the same path may hold another file on another host.
  agree.check_same_contents(fingerprint);
  agree.run("applying", [&] {
    load_full_state_dict(root, params);
    at::NoGradGuard no_grad;
    for (const auto& kv : root->named_buffers(true)) {
      auto it = buffers.find(kv.key());
      if (it != buffers.end()) kv.value().copy_(it->second);
    }
  });
}

}  // namespace fsdp::checkpoint
