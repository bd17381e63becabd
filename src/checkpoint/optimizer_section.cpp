#include "optimizer_section.h"

#include "dtypes.h"
#include "fsdp/shard/layout.h"

namespace fsdp::checkpoint {

namespace {

std::string state_tensor_key(const ParamView& v, const std::string& state_name) {
  return "optim/" + v.name + "/" + state_name;
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
  for (size_t g = 0; g < optimizer->param_groups().size(); ++g) {
    m.group_lrs.push_back(optim::group_options(*optimizer, g, where).at("lr"));
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

OptimizerStates stage_optimizer_state(const Manifest& m, RankFileReader& files,
                                      const torch::optim::Optimizer& optimizer,
                                      const std::vector<ParamView>& views,
                                      const ErrorContext& where) {
  const char* kind = optim::to_string(optim::optimizer_kind(optimizer, where));
  FSDP_CHECK(m.optimizer == kind, ErrorKind::kInvalidArgument, where,
             "the checkpoint holds optimizer state of '", m.optimizer.empty() ? "none" : m.optimizer,
             "', the optimizer given is '", kind,
             "' (pass nullptr or LoadOptions::load_optimizer = false to skip)");
  FSDP_CHECK(m.group_lrs.size() == optimizer.param_groups().size(), ErrorKind::kInvalidArgument,
             where, "checkpoint has ", m.group_lrs.size(), " optimizer param groups, the optimizer has ",
             optimizer.param_groups().size());
  OptimizerStates out;
  for (const auto& v : views) {
    out.emplace_back();
    auto step = m.optim_step.find(v.name);
    if (step == m.optim_step.end()) continue;
    FSDP_CHECK(optim::param_group_index(optimizer, v.tensor).has_value(),
               ErrorKind::kInvalidArgument, where, "the checkpoint has optimizer state for '", v.name,
               "', which the optimizer does not hold (build it on fsdp::parameters(root))");
    const auto want = optim::state_tensor_names(optimizer, v.tensor, where);
    const auto& saved = m.optim_state.at(v.name);
    FSDP_CHECK(want == saved, ErrorKind::kInvalidArgument, where, "optimizer state of '", v.name,
               "' has ", saved.size(), " tensors in the checkpoint, the optimizer's options expect ",
               want.size(), " (amsgrad differs?)");
    optim::ParamState st;
    st.step = step->second;
    for (const auto& sn : want) {
      const std::string tn = state_tensor_key(v, sn);
      auto it = m.tensors.find(tn);
      FSDP_CHECK(it != m.tensors.end(), ErrorKind::kCorruptData, where, "tensor '", tn,
                 "' is missing from the manifest");
      FSDP_CHECK(it->second.shape == v.shape, ErrorKind::kCorruptData, where, "tensor '", tn, "' is ",
                 shard::shape_to_string(it->second.shape), ", expected ",
                 shard::shape_to_string(v.shape));
      at::Tensor rows = files.read_rows(tn, it->second, v.row_begin, v.rows);
      st.tensors.push_back({sn, rows.view(v.tensor.sizes()).to(v.tensor.device())});
    }
    out.back() = std::move(st);
  }
  return out;
}

void apply_optimizer_state(torch::optim::Optimizer& optimizer, const Manifest& m,
                           const std::vector<ParamView>& views, const OptimizerStates& staged,
                           const ErrorContext& where) {
  for (size_t g = 0; g < m.group_lrs.size(); ++g) {
    optim::set_group_options(optimizer, g, {{"lr", m.group_lrs[g]}}, where);
  }
  for (size_t i = 0; i < views.size(); ++i) {
    if (staged[i]) {
      optim::set_param_state(optimizer, views[i].tensor, *staged[i], where);
    } else {
      optim::clear_param_state(optimizer, views[i].tensor, where);
    }
  }
}

}  // namespace fsdp::checkpoint
