#include "fsdp/runtime/fully_shard.h"

#include <unordered_map>
#include <unordered_set>

#include "fsdp/common/check.h"
#include "buffers.h"
#include "scheduler.h"
#include "strategy.h"
#include "unit_registry.h"

namespace fsdp {
namespace {

// The unit is owned by a child module of the wrapped module ([Note: unit ownership] in
// unit_registry.cpp); the registry maps modules and params to their units.
struct UnitHolderImpl : torch::nn::Module {
  explicit UnitHolderImpl(std::shared_ptr<FSDPUnit> u) : torch::nn::Module("FSDPState"), unit(std::move(u)) {}
  std::shared_ptr<FSDPUnit> unit;
};
using detail::kStateChildName;

// shard / replicate sub-groups of every (group, shard size) in use
detail::SubGroupCache& sub_groups() {
  static detail::SubGroupCache cache;
  return cache;
}

// Params of module's subtree that no unit below (or at) module owns yet, with qualified names
// relative to module, first name wins for shared params.
void collect_params(torch::nn::Module& module, const ErrorContext& where, std::vector<FSDPParam>& out) {
  std::unordered_set<const c10::TensorImpl*> seen;
  detail::visit_unit_modules(module, [&](torch::nn::Module& m, const std::string& path) {
    const std::string prefix = path.empty() ? "" : path + ".";
    for (const auto& item : m.named_parameters(/*recurse=*/false)) {
      const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
      if (!seen.insert(impl).second) continue;
      std::shared_ptr<FSDPUnit> owner = detail::param_owner(impl);
      FSDP_CHECK(owner == nullptr, ErrorKind::kInvalidArgument, where, "parameter '", prefix, item.key(),
                 "' is already managed by unit '", owner ? owner->name() : "",
                 "'; a parameter shared by two modules must live in one unit (wrap their common "
                 "parent)");
      FSDPParam p;
      p.fqn = prefix + item.key();
      p.shape = item.value().sizes().vec();
      p.requires_grad = item.value().requires_grad();
      p.module_param = item.value();
      out.push_back(std::move(p));
    }
  });
}

// A module keeping running statistics (BatchNorm) inside a unit that computes in a low-precision
// param_dtype would mix bf16 weights with fp32 statistics, which ATen rejects: refused here with
// the remedy, unless buffer_dtype puts the statistics in param_dtype too.
void reject_low_precision_running_stats(torch::nn::Module& module, const std::vector<FSDPParam>& params,
                                        const FullyShardOptions& options, const ErrorContext& where) {
  const auto& mp = options.mixed_precision;
  if (!mp.param_dtype || params.empty()) return;
  const auto orig = params.front().module_param.scalar_type();
  if (*mp.param_dtype == orig || mp.buffer_dtype == mp.param_dtype) return;
  if (auto bn = detail::find_running_stats_module(module)) {
    throw Error(ErrorKind::kUnsupported, where,
                str_cat("module ", *bn, " keeps running statistics in ", orig, " but the unit computes in ",
                        *mp.param_dtype, " (mixed_precision.param_dtype): make it a unit of its own without "
                        "param_dtype (fully_shard_tree does so for such modules), as PyTorch AMP keeps "
                        "batch norm in fp32, or set buffer_dtype to ", *mp.param_dtype));
  }
}

int64_t unowned_numel(torch::nn::Module& module) {
  int64_t n = 0;
  detail::visit_unit_modules(module, [&](torch::nn::Module& m, const std::string&) {
    for (const auto& p : m.parameters(/*recurse=*/false)) n += p.numel();
  });
  return n;
}

std::shared_ptr<FSDPUnit> fully_shard_named(std::shared_ptr<torch::nn::Module> module,
                                            const std::string& name, comm::ProcessGroupPtr group,
                                            const FullyShardOptions& options) {
  const ErrorContext where{group ? group->rank() : -1, name, "fully_shard"};
  FSDP_CHECK(module != nullptr, ErrorKind::kInvalidArgument, where, "module is null");
  FSDP_CHECK(!find_unit(module.get()), ErrorKind::kInvalidArgument, where,
             "the module is already an FSDP unit (fully_shard runs once per module; "
             "fully_shard_tree wraps each selected module once)");
  detail::prune_registry();  // entries of units that died with their modules
  std::vector<FSDPParam> params;
  collect_params(*module, where, params);
  reject_low_precision_running_stats(*module, params, options, where);
  auto unit = std::make_shared<FSDPUnit>(module, name, std::move(group), options, std::move(params),
                                         sub_groups());
  module->register_module(kStateChildName, std::make_shared<UnitHolderImpl>(unit));
  detail::register_unit(module.get(), unit);
  return unit;
}

}  // namespace

std::shared_ptr<FSDPUnit> fully_shard(std::shared_ptr<torch::nn::Module> module,
                                      comm::ProcessGroupPtr group,
                                      const FullyShardOptions& options) {
  std::string name = module ? module->name() : "";
  return fully_shard_named(std::move(module), name, std::move(group), options);
}

WrapPolicy wrap_by_min_numel(int64_t min_numel) {
  return [min_numel](const std::string&, torch::nn::Module& m) {
    return unowned_numel(m) >= min_numel;
  };
}

std::shared_ptr<FSDPUnit> fully_shard_tree(std::shared_ptr<torch::nn::Module> root,
                                           comm::ProcessGroupPtr group, const WrapPolicy& policy,
                                           const FullyShardOptions& options,
                                           const std::optional<FullyShardOptions>& root_options) {
  FSDP_CHECK(root != nullptr, ErrorKind::kInvalidArgument,
             (ErrorContext{group ? group->rank() : -1, "root", "fully_shard_tree"}), "root module is null");
  // Children first (post-order) so that each unit owns only what no nested unit owns.
  std::function<void(const std::shared_ptr<torch::nn::Module>&, const std::string&)> visit =
      [&](const std::shared_ptr<torch::nn::Module>& m, const std::string& qn) {
        for (const auto& child : m->named_children()) {
          if (dynamic_cast<UnitHolderImpl*>(child.value().get())) continue;
          std::string cq = qn.empty() ? child.key() : qn + "." + child.key();
          visit(child.value(), cq);
          if (find_unit(child.value().get())) continue;
          const auto& mp = options.mixed_precision;
          if (mp.param_dtype && mp.buffer_dtype != mp.param_dtype && detail::keeps_running_stats(*child.value())) {
            FullyShardOptions fp32 = options;
            fp32.mixed_precision.param_dtype.reset();
            fp32.mixed_precision.reduce_dtype.reset();
            fp32.mixed_precision.buffer_dtype.reset();
            fully_shard_named(child.value(), cq, group, fp32);
          } else if (policy(cq, *child.value())) {
            fully_shard_named(child.value(), cq, group, options);
          }
        }
      };
  visit(root, "");
  return fully_shard_named(root, "root", group, root_options.value_or(options));
}

std::shared_ptr<FSDPUnit> find_unit(const torch::nn::Module* module) { return detail::registered_unit(module); }

std::vector<std::shared_ptr<FSDPUnit>> units_of(const std::shared_ptr<torch::nn::Module>& root) {
  return detail::registered_units_under(*root);
}

std::vector<ShardedParameter> sharded_parameters(const std::shared_ptr<torch::nn::Module>& root) {
  // A unit's root names the tree's units by their paths (plain fully_shard named them by type).
  if (root && find_unit(root.get())) detail::name_units_by_path(*root);
  // Names from root: the unit's module qualified name + the param's name inside it.
  std::unordered_map<const torch::nn::Module*, std::string> prefix;
  std::function<void(const torch::nn::Module&, const std::string&)> visit =
      [&](const torch::nn::Module& m, const std::string& p) {
        prefix[&m] = p;
        for (const auto& c : m.named_children()) visit(*c.value(), p + c.key() + ".");
      };
  visit(*root, "");
  std::vector<ShardedParameter> out;
  for (const auto& u : units_of(root)) {
    const std::string& pre = prefix[&u->module()];
    for (const auto& p : u->params()) out.push_back({pre + p.fqn, p.sharded_param, u.get(), &p});
  }
  return out;
}

std::vector<at::Tensor> parameters(const std::shared_ptr<torch::nn::Module>& root) {
  std::vector<at::Tensor> out;
  for (const auto& sp : sharded_parameters(root)) out.push_back(sp.tensor);
  return out;
}

void set_requires_gradient_sync(const std::shared_ptr<torch::nn::Module>& root, bool sync) {
  for (const auto& u : units_of(root)) u->set_requires_gradient_sync(sync);
}

void abandon_step(const std::shared_ptr<torch::nn::Module>& root) {
  const auto unit = root ? find_unit(root.get()) : nullptr;
  if (unit && unit->scheduler()) unit->scheduler()->abandon_pending_pass(/*failed_here=*/true);
}

void wait_for_pending(const std::shared_ptr<torch::nn::Module>& root) {
  for (const auto& u : units_of(root)) u->finish_reduce_scatter();
}

namespace detail {

namespace {

// True when an ATen error message speaks of a tensor with no elements the way ATen's kernels word
// it when handed another unit's resharded parameter (shape [0]): "vec (0)", "tensor b (0)",
// "existing size (0)", "weight of shape [0]", "for input of size 0", "'weight' must be 2-D".
// Words a user's own check may well use ("out of range", "at least") are not enough.
bool mentions_empty_tensor(const std::string& what) {
  for (const char* s : {"vec (0)", "tensor a (0)", "tensor b (0)", "existing size (0)", "of shape [0]",
                        "for input of size 0", "'weight' must be 2-D"}) {
    if (what.find(s) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

void rethrow_forward_error(FSDPUnit& unit) {
  const std::exception_ptr error = std::current_exception();
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (...) {
  }
  // Only a libtorch error that speaks of an empty tensor may come from reading another unit's
  // parameter outside its forward (resharded, it holds an empty tensor); any other error, the
  // user's own checks included, reaches the caller as it was thrown.
  // Two causes: a unit module called directly (module(x), module->forward(x): its own forward never
  // ran, so its parameters were never gathered), or a parameter of a unit that did run read after it
  // resharded (a tied head). Units that ran no forward in this pass point to the first; units later
  // in the pass look the same until they run, so both remedies are given.
  std::vector<std::string> held, not_called;
  const bool noted = what.find("parameters of other units held no data") != std::string::npos;  // by a nested unit
  if (!what.empty() && !noted && mentions_empty_tensor(what) && unit.scheduler()) {
    for (const auto& u : unit.scheduler()->units()) {
      if (u.get() == &unit) continue;
      const bool ran = unit.scheduler()->used_in_this_forward(u.get());
      for (const auto& p : u->params()) {
        if (!p.resharded()) continue;
        held.push_back("'" + p.fqn + "' of unit '" + u->name() + "'");
        if (!ran && (not_called.empty() || not_called.back() != "'" + u->name() + "'")) {
          not_called.push_back("'" + u->name() + "'");
        }
      }
    }
  }
  unit.abort_forward();
  if (held.empty()) std::rethrow_exception(error);
  // Still a c10::Error (a loop's catch of libtorch errors holds), its message first.
  const std::string first_line = what.substr(0, what.find('\n'));
  const std::string called_directly =
      not_called.empty() ? ""
                         : " Unit(s) " + join_first(not_called) + " ran no FSDP forward in this pass: a module that is "
                           "an FSDP unit called directly (module(x) or module->forward(x)) is never gathered; call it "
                           "through fsdp::call(module, args...) (or fsdp::call_checkpointed).";
  throw c10::Error(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                   first_line + " [fsdp rank " + std::to_string(unit.where("forward").rank) + ", unit '" +
                   unit.name() + "' forward: an empty tensor while parameters of other units held no data "
                   "(outside its own forward a unit's parameters are resharded, shape [0]): " + join_first(held) +
                   "." + called_directly + " If the forward reads another unit's parameter directly (e.g. an output "
                   "head tied to an embedding that is a unit of its own), let one unit own both modules (do not wrap "
                   "the inner one), or shard the inner unit with reshard_after_forward=false, which keeps its "
                   "parameters gathered from its forward to the end of its backward (its unsharded bytes for that "
                   "span)]");
}

}  // namespace detail

void invalidate_unsharded(const std::shared_ptr<torch::nn::Module>& root) {
  for (const auto& u : units_of(root)) u->invalidate_unsharded();
}

}  // namespace fsdp
