#include "fsdp/runtime/materialize.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp {
namespace {

using detail::kStateChildName;  // the unit holder (fully_shard.cpp)

// Pre-order over the tree (Module::named_modules' order) without the FSDP state holders.
void visit_preorder(torch::nn::Module& m, const std::string& name,
                    const std::function<void(const std::string&, torch::nn::Module&)>& fn) {
  fn(name, m);
  for (const auto& child : m.named_children()) {
    if (child.key() == kStateChildName) continue;
    visit_preorder(*child.value(), name.empty() ? child.key() : name + "." + child.key(), fn);
  }
}

struct Owner {
  FSDPUnit* unit;
  FSDPParam* param;
};

}  // namespace

void init_parameters(torch::nn::Module& root, const ModuleInit& init) {
  at::NoGradGuard no_grad;
  visit_preorder(root, "", [&](const std::string& name, torch::nn::Module& m) {
    if (m.named_parameters(false).is_empty() && m.named_buffers(false).is_empty()) return;
    init(name, m);
  });
}

// [Note: deferred initialisation] See materialize.h and docs/architecture.md.
MaterializeResult materialize(const std::shared_ptr<torch::nn::Module>& root, const ModuleInit& init) {
  const ErrorContext top{-1, "", "materialize"};
  FSDP_CHECK(root != nullptr, ErrorKind::kInvalidArgument, top, "root module is null");
  std::unordered_map<const c10::TensorImpl*, Owner> owner;
  const auto units = units_of(root);
  for (const auto& u : units) {
    FSDP_CHECK(!u->group()->simulated(), ErrorKind::kUnsupported, u->where("materialize"),
               "the unit's group is simulated (a dry run): its shards are meta tensors with no values to write");
    FSDP_CHECK(u->values_pending() || u->params().empty(), ErrorKind::kInvalidArgument, u->where("materialize"),
               "the unit's parameters already hold values (built off the meta device, or materialised "
               "before); materialize initialises a model built on the meta device once");
    for (auto& p : u->params()) owner[p.module_param.unsafeGetTensorImpl()] = Owner{u.get(), &p};
  }
  MaterializeResult result;
  std::unordered_set<const FSDPParam*> written;
  at::NoGradGuard no_grad;
  visit_preorder(*root, "", [&](const std::string& name, torch::nn::Module& m) {
    const auto params = m.named_parameters(false);
    const auto buffers = m.named_buffers(false);
    if (params.is_empty() && buffers.is_empty()) return;
    int64_t full_bytes = 0;
    std::vector<Owner> mine;
    for (const auto& item : params) {
      auto it = owner.find(item.value().unsafeGetTensorImpl());
      FSDP_CHECK(it != owner.end(), ErrorKind::kInvalidArgument, top, "parameter '",
                 name.empty() ? item.key() : name + "." + item.key(),
                 "' is owned by no FSDP unit: shard the whole tree (fully_shard_tree) before materialize");
      FSDPParam& p = *it->second.param;
      at::Tensor full = at::empty(p.shape, p.sharded_storage.options());
      p.module_param.set_data(full);
      full_bytes += static_cast<int64_t>(full.nbytes());
      mine.push_back(it->second);
    }
    for (const auto& item : buffers) {
      at::Tensor b = item.value();
      if (!b.is_meta()) continue;
      at::Tensor cpu = at::empty(b.sizes(), b.options().device(at::kCPU));
      b.unsafeGetTensorImpl()->shallow_copy_from(cpu.getIntrusivePtr());
      full_bytes += static_cast<int64_t>(cpu.nbytes());
    }
    init(name, m);
    for (const Owner& o : mine) {
      o.param->copy_rows_from(o.param->module_param, o.unit->shard_rank());
      o.param->restore_module_param();  // frees the full tensor
      result.param_bytes += o.param->spec.numel() * static_cast<int64_t>(o.param->sharded_storage.element_size());
      written.insert(o.param);
    }
    ++result.modules;
    result.peak_full_bytes = std::max(result.peak_full_bytes, full_bytes);
  });
  for (const auto& u : units) {
    for (const auto& p : u->params()) {
      FSDP_CHECK(written.count(&p) == 1, ErrorKind::kInvalidArgument, u->where("materialize"), "parameter '",
                 p.fqn, "' is registered on no module of the tree under the root");
    }
    u->set_values_materialized();
  }
  return result;
}

}  // namespace fsdp
