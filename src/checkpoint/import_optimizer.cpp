// import_optimizer: the optimizer state of a plain libtorch run (torch::save(optimizer, path)) into
// an optimizer over sharded parameters. See docs/checkpoints.md, "Importing the optimizer of a
// plain run". Validation before any write follows [Note: error agreement] (agreement.h).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "agreement.h"
#include "dtypes.h"
#include "fsdp/checkpoint/import_optimizer.h"
#include "fsdp/common/check.h"
#include "fsdp/optim/optimizer_state.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/shard/layout.h"
#include "io.h"
#include "optimizer_section.h"
#include "param_groups.h"
#include "param_views.h"

namespace fsdp::checkpoint {

namespace {

// The archive's parameters in the optimizer's order (groups in order, first occurrence of a key).
std::vector<std::string> ordered_keys(const optim::ArchivedOptimizer& a) {
  std::vector<std::string> keys;
  std::unordered_set<std::string> seen;
  for (const auto& g : a.groups) {
    for (const auto& k : g.param_keys) {
      if (seen.insert(k).second) keys.push_back(k);
    }
  }
  return keys;
}

std::string group_sizes(const optim::ArchivedOptimizer& a) {
  std::string s;
  for (size_t g = 0; g < a.groups.size(); ++g) {
    s += str_cat(g ? ", " : "", "group ", g, ": ", a.groups[g].param_keys.size());
  }
  return a.groups.empty() ? "no param groups" : s;
}

// The sharded parameters' names in root->named_parameters() order, the order of the plain
// model's named_parameters() (a tied parameter once, under the name sharded_parameters gives it).
// Not sharded_parameters order, which goes unit by unit.
std::vector<std::string> module_order_names(const std::shared_ptr<torch::nn::Module>& root) {
  std::unordered_map<const void*, std::string> name_of;
  for (const auto& sp : sharded_parameters(root)) {
    name_of.emplace(sp.param->module_param.unsafeGetTensorImpl(), sp.name);
  }
  std::vector<std::string> out;
  std::unordered_set<const void*> seen;
  for (const auto& kv : root->named_parameters(/*recurse=*/true)) {
    const void* impl = kv.value().unsafeGetTensorImpl();
    auto it = name_of.find(impl);
    if (it != name_of.end() && seen.insert(impl).second) out.push_back(it->second);
  }
  return out;
}

// Reads and validates everything import_optimizer sets, on this rank, before any write.
StagedOptimizer stage_import(const optim::ArchivedOptimizer& saved,
                             const torch::optim::Optimizer& optimizer,
                             const std::shared_ptr<torch::nn::Module>& root,
                             const std::vector<ParamView>& views,
                             const ImportOptimizerOptions& options, const ErrorContext& where) {
  // Names of the archive's parameters, by position.
  const bool by_model_order = options.param_names.empty();
  std::map<std::string, size_t> view_of;
  for (size_t i = 0; i < views.size(); ++i) view_of.emplace(views[i].name, i);
  const std::vector<std::string> names =
      by_model_order ? module_order_names(root) : options.param_names;
  std::set<std::string> distinct;
  for (const auto& n : names) {
    FSDP_CHECK(view_of.count(n), ErrorKind::kInvalidArgument, where,
               "ImportOptimizerOptions::param_names names '", n,
               "', which is not a sharded parameter of the model");
    FSDP_CHECK(distinct.insert(n).second, ErrorKind::kInvalidArgument, where,
               "ImportOptimizerOptions::param_names names '", n, "' twice");
  }
  const std::vector<std::string> keys = ordered_keys(saved);
  FSDP_CHECK(keys.size() == names.size(), ErrorKind::kInvalidArgument, where,
             expected_actual(str_cat("parameters held by the optimizer in the file (", group_sizes(saved), ")"),
                             str_cat(names.size(), by_model_order
                                                       ? " as the model has"
                                                       : " as ImportOptimizerOptions::param_names lists"),
                             keys.size()));
  std::unordered_map<std::string, size_t> position;
  for (size_t i = 0; i < keys.size(); ++i) position.emplace(keys[i], i);
  for (const auto& kv : saved.state) {
    FSDP_CHECK(position.count(kv.first), ErrorKind::kCorruptData, where, "the file has state for "
               "parameter key ", kv.first, ", which none of its param groups holds");
  }

  // Groups: matched by their members, every option restored.
  std::vector<GroupMembers> saved_members;
  for (const auto& g : saved.groups) {
    GroupMembers m;
    for (const auto& k : g.param_keys) m.push_back(names[position.at(k)]);
    saved_members.push_back(std::move(m));
  }
  std::string stray;
  const auto current = group_members(optimizer, views, &stray);
  FSDP_CHECK(current.has_value(), ErrorKind::kInvalidArgument, where, "the optimizer's ", stray,
             " (build the optimizer on fsdp::parameters(root))");
  const std::vector<size_t> match = match_groups(saved_members, *current, "the file", where);
  StagedOptimizer out;
  for (size_t g : match) out.group_options.push_back(saved.groups[g].options);

  // Per parameter: the full state, checked against the model, narrowed to this rank's rows.
  out.states.resize(views.size());
  const std::string order_hint =
      by_model_order ? " (the file's parameters are named in the model's named_parameters() order; "
                       "if the plain optimizer held them in another order, give "
                       "ImportOptimizerOptions::param_names)"
                     : "";
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = saved.state.find(keys[i]);
    if (it == saved.state.end()) continue;
    const ParamView& v = views[view_of.at(names[i])];
    optim::ParamState st;
    st.step = it->second.step;
    const std::vector<int64_t> rows = row_shape(v.shape);
    for (const auto& t : it->second.tensors) {
      FSDP_CHECK(t.tensor.sizes().vec() == v.shape && t.tensor.scalar_type() == v.tensor.scalar_type(),
                 ErrorKind::kInvalidArgument, where, "parameter '", v.name, "' (parameter ", i,
                 " of the optimizer in the file): state '", t.name, "' is ", t.tensor.sizes(), " ",
                 t.tensor.scalar_type(), " in the file, the model's parameter is ",
                 shard::shape_to_string(v.shape), " ", v.tensor.scalar_type(), order_hint);
      at::Tensor mine = t.tensor.reshape(rows).narrow(0, v.row_begin, v.rows);
      st.tensors.push_back({t.name, mine.reshape(v.tensor.sizes()).to(v.tensor.device()).clone()});
    }
    out.states[view_of.at(names[i])] = std::move(st);
  }
  check_staged_state_names(optimizer, views, out, "the file", where);
  return out;
}

}  // namespace

std::vector<std::string> optimizer_param_names(const std::shared_ptr<torch::nn::Module>& root,
                                               const torch::optim::Optimizer& optimizer) {
  const ErrorContext where{-1, "", "optimizer_param_names"};
  std::unordered_map<const void*, std::string> name_of;
  for (const auto& sp : sharded_parameters(root)) name_of.emplace(sp.tensor.unsafeGetTensorImpl(), sp.name);
  std::unordered_map<std::string, size_t> module_position;
  for (const auto& n : module_order_names(root)) module_position.emplace(n, module_position.size());
  std::vector<std::string> out;
  std::unordered_set<const void*> seen;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<std::string> members;
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const void* impl = params[i].unsafeGetTensorImpl();
      auto it = name_of.find(impl);
      FSDP_CHECK(it != name_of.end(), ErrorKind::kInvalidArgument, where, "param group ", g,
                 " holds a tensor of shape ", params[i].sizes(), " (its parameter ", i,
                 ") that is not a sharded parameter of the model");
      if (seen.insert(impl).second) members.push_back(it->second);
    }
    std::sort(members.begin(), members.end(), [&](const std::string& a, const std::string& b) {
      return module_position.at(a) < module_position.at(b);
    });
    out.insert(out.end(), members.begin(), members.end());
  }
  return out;
}

void import_optimizer(const std::string& path, const std::shared_ptr<torch::nn::Module>& root,
                      torch::optim::Optimizer& optimizer, const comm::ProcessGroupPtr& group,
                      const ImportOptimizerOptions& options) {
  FSDP_CHECK(group, ErrorKind::kInvalidArgument, ErrorContext{-1, "", "import_optimizer"},
             "null process group");
  auto& g = *group;
  const std::string op = "import_optimizer '" + path + "'";
  const ErrorContext who{g.rank(), "", op};
  Agreement agree(g, op);
  std::vector<ParamView> views;
  StagedOptimizer staged;
  agree.run("reading and validating", [&] {
    const optim::OptimizerKind kind = optim::optimizer_kind(optimizer, who);
    views = param_views(root, g, who);
    const std::string bytes = io::read_file(path);
    torch::serialize::InputArchive archive;
    try {
      archive.load_from(bytes.data(), bytes.size());
    } catch (const c10::Error& e) {
      throw Error(ErrorKind::kCorruptData, who,
                  str_cat("not a libtorch archive as torch::save(optimizer, path) writes: ",
                          e.what_without_backtrace()));
    }
    staged = stage_import(optim::read_optimizer_archive(archive, kind, who), optimizer, root,
                          views, options, who);
  });
  agree.run("applying", [&] { apply_optimizer_state(optimizer, views, staged, who); });
}

}  // namespace fsdp::checkpoint
