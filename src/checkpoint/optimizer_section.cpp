#include "optimizer_section.h"

#include <algorithm>

#include "dtypes.h"
#include "fsdp/shard/layout.h"
#include "param_groups.h"

namespace fsdp::checkpoint {

namespace {

std::string state_tensor_key(const ParamView& v, const std::string& state_name) {
  return "optim/" + v.name + "/" + state_name;
}

std::string join(std::vector<std::string> names) {
  std::string s = "{";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "}";
}

}  // namespace

OptimizerStates local_optimizer_states(const torch::optim::Optimizer* optimizer,
                                       const std::vector<ParamView>& views,
                                       const ErrorContext& where) {
  OptimizerStates out;
  if (!optimizer) return out;
  for (const auto& v : views) out.push_back(optim::get_param_state(*optimizer, v.tensor, where));
  return out;
}

void write_optimizer_rows(RankFileWriter& w, const torch::optim::Optimizer& optimizer,
                          const std::vector<ParamView>& views, const OptimizerStates& states,
                          const std::vector<int64_t>& step_flags, const ErrorContext& where) {
  for (size_t i = 0; i < views.size(); ++i) {
    const auto& v = views[i];
    if (step_flags[i] == 0 || !v.writer || v.rows == 0) continue;
    FSDP_CHECK(states[i].has_value(), ErrorKind::kInvalidArgument, where, "parameter '", v.name,
               "' has optimizer state on another rank but not on this one, which holds ", v.rows,
               " of its rows");
    for (const auto& sn : optim::state_tensor_names(optimizer, v.tensor, where)) {
      const at::Tensor t = states[i]->find(sn);
      FSDP_CHECK(t.defined() && t.numel() == v.tensor.numel(), ErrorKind::kInvalidArgument, where,
                 "optimizer state '", sn, "' of parameter '", v.name, "' is ",
                 t.defined() ? "of the wrong size" : "missing", " (",
                 expected_actual("elements", v.tensor.numel(), t.defined() ? t.numel() : 0), ")");
      w.add(state_tensor_key(v, sn), t, v.row_begin, v.rows);
    }
  }
}

void describe_optimizer(Manifest& m, const torch::optim::Optimizer* optimizer,
                        const std::vector<ParamView>& views, const std::vector<int64_t>& step_flags,
                        const ErrorContext& where) {
  m.optimizer = "";
  if (!optimizer) return;
  m.optimizer = optim::to_string(optim::optimizer_kind(*optimizer, where));
  // Groups keyed by their members ([Note: param groups by members] in docs/checkpoints.md); an
  // optimizer holding a tensor outside the model keeps the positional form of older checkpoints.
  const auto members = group_members(*optimizer, views);
  for (size_t g = 0; g < optimizer->param_groups().size(); ++g) {
    optim::GroupOptions options = optim::group_options(*optimizer, g, where);
    m.group_lrs.push_back(options.at("lr"));
    if (members) m.groups.push_back(SavedGroup{(*members)[g], std::move(options)});
  }
  for (size_t i = 0; i < views.size(); ++i) {
    if (step_flags[i] == 0) continue;
    const auto& v = views[i];
    auto names = optim::state_tensor_names(*optimizer, v.tensor, where);
    m.optim_step[v.name] = step_flags[i] - 1;
    for (const auto& sn : names) {
      m.tensors[state_tensor_key(v, sn)] =
          TensorEntry{"optim", dtype_name(v.tensor.scalar_type(), where), v.shape,
                      row_shape(v.shape)[1], {}};
    }
    m.optim_state[v.name] = std::move(names);
  }
}

StagedOptimizer stage_optimizer_state(const Manifest& m, RankFileReader& files,
                                      const torch::optim::Optimizer& optimizer,
                                      const std::vector<ParamView>& views,
                                      const ErrorContext& where) {
  const optim::OptimizerKind kind = optim::optimizer_kind(optimizer, where);
  FSDP_CHECK(m.optimizer == optim::to_string(kind), ErrorKind::kInvalidArgument, where,
             "the checkpoint holds optimizer state of '", m.optimizer.empty() ? "none" : m.optimizer,
             "', the optimizer given is '", optim::to_string(kind),
             "' (pass nullptr or LoadOptions::load_optimizer = false to skip)");
  StagedOptimizer out;
  const size_t n_groups = optimizer.param_groups().size();
  if (!m.groups.empty()) {  // keyed by members
    std::string stray;
    const auto members = group_members(optimizer, views, &stray);
    FSDP_CHECK(members.has_value(), ErrorKind::kInvalidArgument, where,
               "the checkpoint keys its param groups by their members, but the optimizer's ", stray,
               " (build the optimizer on fsdp::parameters(root))");
    std::vector<GroupMembers> saved;
    for (const auto& g : m.groups) saved.push_back(g.members);
    const std::vector<size_t> match = match_groups(saved, *members, "the checkpoint", where);
    const auto valid = optim::group_option_names(kind);
    for (size_t g = 0; g < n_groups; ++g) {
      const SavedGroup& sg = m.groups[match[g]];
      for (const auto& kv : sg.options) {
        FSDP_CHECK(std::find(valid.begin(), valid.end(), kv.first) != valid.end(),
                   ErrorKind::kCorruptData, where, "the manifest's optimizer group ", match[g],
                   " has option '", kv.first, "', which ", optim::to_string(kind),
                   " param groups do not have (", join(valid), ")");
      }
      out.group_options.push_back(sg.options);
    }
  } else {  // written before groups were keyed by members: by position, the learning rate only
    FSDP_CHECK(m.group_lrs.size() == n_groups, ErrorKind::kInvalidArgument, where,
               "checkpoint has ", m.group_lrs.size(), " optimizer param groups, the optimizer has ",
               n_groups);
    for (double lr : m.group_lrs) out.group_options.push_back({{"lr", lr}});
  }
  for (const auto& v : views) {
    out.states.emplace_back();
    auto step = m.optim_step.find(v.name);
    if (step == m.optim_step.end()) continue;
    const auto& saved = m.optim_state.at(v.name);
    optim::ParamState st;
    st.step = step->second;
    for (const auto& sn : saved) {
      const std::string tn = state_tensor_key(v, sn);
      auto it = m.tensors.find(tn);
      FSDP_CHECK(it != m.tensors.end(), ErrorKind::kCorruptData, where, "tensor '", tn,
                 "' is missing from the manifest");
      FSDP_CHECK(it->second.shape == v.shape, ErrorKind::kCorruptData, where, "tensor '", tn, "' is ",
                 shard::shape_to_string(it->second.shape), ", expected ",
                 shard::shape_to_string(v.shape));
      st.tensors.push_back({sn, at::Tensor()});
    }
    out.states.back() = std::move(st);
  }
  check_staged_state_names(optimizer, views, out, "the checkpoint", where);
  for (size_t i = 0; i < views.size(); ++i) {  // read only once everything above is consistent
    if (!out.states[i]) continue;
    const auto& v = views[i];
    for (auto& t : out.states[i]->tensors) {
      const std::string tn = state_tensor_key(v, t.name);
      at::Tensor rows = files.read_rows(tn, m.tensors.at(tn), v.row_begin, v.rows);
      t.tensor = rows.view(v.tensor.sizes()).to(v.tensor.device());
    }
  }
  return out;
}

void check_staged_state_names(const torch::optim::Optimizer& optimizer,
                              const std::vector<ParamView>& views, const StagedOptimizer& staged,
                              const std::string& source, const ErrorContext& where) {
  const optim::OptimizerKind kind = optim::optimizer_kind(optimizer, where);
  for (size_t i = 0; i < views.size(); ++i) {
    if (!staged.states[i]) continue;
    const auto& v = views[i];
    const auto g = optim::param_group_index(optimizer, v.tensor);
    FSDP_CHECK(g.has_value(), ErrorKind::kInvalidArgument, where, source,
               " has optimizer state for '", v.name,
               "', which the optimizer does not hold (build it on fsdp::parameters(root))");
    optim::GroupOptions options = optim::group_options(optimizer, *g, where);
    for (const auto& kv : staged.group_options[*g]) options[kv.first] = kv.second;
    std::vector<std::string> want = optim::state_tensor_names(kind, options), got;
    for (const auto& t : staged.states[i]->tensors) got.push_back(t.name);
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    FSDP_CHECK(want == got, ErrorKind::kInvalidArgument, where, "optimizer state of '", v.name,
               "' has ", got.size(), " tensors in ", source, ", the optimizer's options expect ",
               want.size(), " (amsgrad differs?): ",
               expected_actual("state tensors", join(want), join(got)));
  }
}

void apply_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<ParamView>& views,
                           const StagedOptimizer& staged, const ErrorContext& where) {
  for (size_t g = 0; g < staged.group_options.size(); ++g) {
    optim::set_group_options(optimizer, g, staged.group_options[g], where);
  }
  for (size_t i = 0; i < views.size(); ++i) {
    if (staged.states[i]) {
      optim::set_param_state(optimizer, views[i].tensor, *staged.states[i], where);
    } else {
      optim::clear_param_state(optimizer, views[i].tensor, where);
    }
  }
}

}  // namespace fsdp::checkpoint
