#include "fsdp/runtime/materialize.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fsdp/comm/comm_context.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"
#include "unit_registry.h"

namespace fsdp {
namespace {

using detail::kStateChildName;  // the unit holder (unit_registry.h)

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

namespace {

// What init did to one tensor: it wrote it when its version moved (an in-place op: normal_, copy_,
// fill_, ...) or its data moved (set_data).
struct WriteProbe {
  int64_t version;
  const void* data;
  explicit WriteProbe(const at::Tensor& t) : version(t._version()), data(t.data_ptr()) {}
  bool written(const at::Tensor& t) const { return t._version() != version || t.data_ptr() != data; }
};

std::string qualified(const std::string& module, const std::string& key) {
  return module.empty() ? key : module + "." + key;
}

}  // namespace

// [Note: deferred initialisation] See materialize.h and docs/architecture.md. A parameter that
// several modules register (a tie: an output head sharing the embedding's weight) keeps one full
// tensor from the first of those modules to the last, so that each module's init sees the values
// the earlier ones wrote, as init_parameters on a built model does; its rows go to the shards
// after the last. A tensor the init never writes has no values (the meta device computed none in
// the constructor): an error names it, instead of training from uninitialised memory.
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
  // How many modules register each parameter: a tied one stays full until its last module.
  // Where the tree's buffers go: the device of its group (every unit of a tree shares it);
  // libtorch's default device for a tree without units.
  const c10::Device tree_device = units.empty() ? at::TensorOptions().device()
                                                : comm::CommContext::for_group(*units.front()->group()).buffer_device;
  std::unordered_map<const c10::TensorImpl*, int> visits_left;
  visit_preorder(*root, "", [&](const std::string&, torch::nn::Module& m) {
    for (const auto& item : m.named_parameters(false)) ++visits_left[item.value().unsafeGetTensorImpl()];
  });
  MaterializeResult result;
  std::unordered_set<const FSDPParam*> written, done, kept;
  std::unordered_map<const FSDPParam*, std::string> first_name;
  int64_t kept_bytes = 0;  // full tensors of tied params waiting for their last module
  at::NoGradGuard no_grad;
  visit_preorder(*root, "", [&](const std::string& name, torch::nn::Module& m) {
    const auto params = m.named_parameters(false);
    const auto buffers = m.named_buffers(false);
    if (params.is_empty() && buffers.is_empty()) return;
    int64_t full_bytes = 0;
    std::vector<std::pair<Owner, WriteProbe>> mine;
    for (const auto& item : params) {
      auto it = owner.find(item.value().unsafeGetTensorImpl());
      FSDP_CHECK(it != owner.end(), ErrorKind::kInvalidArgument, top, "parameter '", qualified(name, item.key()),
                 "' is owned by no FSDP unit: shard the whole tree (fully_shard_tree) before materialize");
      FSDPParam& p = *it->second.param;
      first_name.emplace(&p, qualified(name, item.key()));
      if (kept.erase(&p) == 0) {
        at::Tensor full = at::empty(p.shape, p.sharded_storage.options());
        p.module_param.set_data(full);
        full_bytes += static_cast<int64_t>(full.nbytes());
        if (p.spec.numel() == 0) written.insert(&p);  // nothing to write
      } else {  // a tie kept full since an earlier module
        kept_bytes -= static_cast<int64_t>(p.module_param.nbytes());
        full_bytes += static_cast<int64_t>(p.module_param.nbytes());
      }
      mine.emplace_back(it->second, WriteProbe(p.module_param));
    }
    std::vector<std::pair<std::string, WriteProbe>> fresh_buffers;
    for (const auto& item : buffers) {
      at::Tensor b = item.value();
      if (!b.is_meta()) continue;
      at::Tensor fresh = at::empty(b.sizes(), b.options().device(tree_device));
      b.unsafeGetTensorImpl()->shallow_copy_from(fresh.getIntrusivePtr());
      full_bytes += static_cast<int64_t>(fresh.nbytes());
      fresh_buffers.emplace_back(item.key(), WriteProbe(b));
    }
    // The parameters of the modules below m: init(m) must leave them to their own modules' calls
    // (a recursive parameters() would draw the generator out of module order).
    std::unordered_set<const c10::TensorImpl*> own;
    for (const auto& item : params) own.insert(item.value().unsafeGetTensorImpl());
    std::vector<std::pair<std::string, WriteProbe>> below;
    for (const auto& item : m.named_parameters(/*recurse=*/true)) {
      if (!own.count(item.value().unsafeGetTensorImpl())) below.emplace_back(item.key(), WriteProbe(item.value()));
    }
    init(name, m);
    const auto after = m.named_parameters(/*recurse=*/true);
    for (const auto& [key, probe] : below) {
      FSDP_CHECK(!probe.written(after[key]), ErrorKind::kInvalidArgument, top, "init for module '", name,
                 "' wrote parameter '", qualified(name, key), "', which a module below it registers: write only "
                 "the module's own tensors (named_parameters(/*recurse=*/false)); the module below gets its own "
                 "call, in the order a built model's init_parameters makes them");
    }
    for (const auto& [key, probe] : fresh_buffers) {
      FSDP_CHECK(probe.written(buffers[key]), ErrorKind::kInvalidArgument, top, "buffer '", qualified(name, key),
                 "' was built on the meta device, which computes no values, and init did not write it: compute "
                 "it in init for module '", name, "' (e.g. a rotary table the constructor computes), or build "
                 "it on the CPU in the constructor");
    }
    for (auto& [o, probe] : mine) {
      FSDPParam& p = *o.param;
      if (probe.written(p.module_param)) written.insert(&p);
      if (--visits_left[p.module_param.unsafeGetTensorImpl()] > 0) {
        kept.insert(&p);  // a tie: its next module sees these values
        kept_bytes += static_cast<int64_t>(p.module_param.nbytes());
        continue;
      }
      FSDP_CHECK(written.count(&p) == 1, ErrorKind::kInvalidArgument, o.unit->where("materialize"), "parameter '",
                 first_name[&p], "' was built on the meta device, which computes no values, and init wrote it "
                 "in none of the modules that register it: write it in init (with tensor operations: normal_, "
                 "copy_, fill_, ...)");
      p.copy_rows_from(p.module_param, o.unit->shard_rank());
      p.restore_module_param();  // frees the full tensor
      result.param_bytes += p.spec.numel() * static_cast<int64_t>(p.sharded_storage.element_size());
      done.insert(&p);
    }
    ++result.modules;
    result.peak_full_bytes = std::max(result.peak_full_bytes, full_bytes + kept_bytes);
  });
  for (const auto& u : units) {
    for (const auto& p : u->params()) {
      FSDP_CHECK(done.count(&p) == 1, ErrorKind::kInvalidArgument, u->where("materialize"), "parameter '",
                 p.fqn, "' is registered on no module of the tree under the root");
    }
    u->set_values_materialized();
  }
  return result;
}

}  // namespace fsdp
