#include "unit_registry.h"

#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "fsdp/runtime/fsdp_unit.h"

namespace fsdp::detail {
namespace {

// [Note: unit ownership] libtorch modules have no slot for user state. The unit is owned by a
// parameterless child module "_fsdp_state" registered on the wrapped module (fully_shard.cpp), so
// it is freed with the module; this registry maps module address -> unit weakly for fsdp::call's
// lookup, and an expired entry is never confused with a new module at a reused address.
struct Registry {
  std::mutex mu;
  std::unordered_map<const torch::nn::Module*, std::weak_ptr<FSDPUnit>> units;
  // parameter TensorImpl -> owning unit (to reject params shared across units)
  std::unordered_map<const c10::TensorImpl*, std::weak_ptr<FSDPUnit>> param_owner;
};

Registry& registry() {
  static Registry r;
  return r;
}

void visit_from(torch::nn::Module& m, const std::string& path, bool top,
                const std::function<void(torch::nn::Module&, const std::string&)>& fn) {
  if (!top && registered_unit(&m)) return;  // a nested unit computes with its own
  fn(m, path);
  for (const auto& c : m.named_children()) {
    if (c.key() == kStateChildName) continue;
    visit_from(*c.value(), path.empty() ? c.key() : path + "." + c.key(), false, fn);
  }
}

}  // namespace

std::shared_ptr<FSDPUnit> registered_unit(const torch::nn::Module* module) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.units.find(module);
  if (it == reg.units.end()) return nullptr;
  auto unit = it->second.lock();
  if (!unit || !unit->module_alive()) {
    reg.units.erase(it);
    return nullptr;
  }
  return unit;
}

std::vector<std::shared_ptr<FSDPUnit>> registered_units_under(const torch::nn::Module& root) {
  std::vector<std::shared_ptr<FSDPUnit>> out;
  std::function<void(const torch::nn::Module&)> visit = [&](const torch::nn::Module& m) {
    if (auto u = registered_unit(&m)) out.push_back(u);
    for (const auto& c : m.children()) visit(*c);
  };
  visit(root);
  return out;
}

std::shared_ptr<FSDPUnit> param_owner(const c10::TensorImpl* param) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.param_owner.find(param);
  return it == reg.param_owner.end() ? nullptr : it->second.lock();
}

void register_unit(const torch::nn::Module* module, const std::shared_ptr<FSDPUnit>& unit) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.units[module] = unit;
  for (const auto& p : unit->params()) reg.param_owner[p.module_param.unsafeGetTensorImpl()] = unit;
}

void prune_registry() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (auto it = reg.units.begin(); it != reg.units.end();) {
    it = it->second.expired() ? reg.units.erase(it) : std::next(it);
  }
  for (auto it = reg.param_owner.begin(); it != reg.param_owner.end();) {
    it = it->second.expired() ? reg.param_owner.erase(it) : std::next(it);
  }
}

void visit_unit_modules(torch::nn::Module& top,
                        const std::function<void(torch::nn::Module&, const std::string& path)>& fn) {
  visit_from(top, "", true, fn);
}

void name_units_by_path(torch::nn::Module& root) {
  std::unordered_set<const torch::nn::Module*> seen;
  std::function<void(torch::nn::Module&, const std::string&)> visit = [&](torch::nn::Module& m,
                                                                        const std::string& path) {
    if (!seen.insert(&m).second) return;  // a module registered twice keeps its first path
    if (auto u = registered_unit(&m)) {
      const std::string name = path.empty() ? "root" : path;
      if (u->name_ != name) u->name_ = name;
    }
    for (const auto& c : m.named_children()) {
      if (c.key() != kStateChildName) visit(*c.value(), path.empty() ? c.key() : path + "." + c.key());
    }
  };
  visit(root, "");
}

}  // namespace fsdp::detail
