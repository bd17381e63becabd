#include "fsdp/runtime/state_dict.h"

#include <ATen/ATen.h>

#include <set>

#include "fsdp/comm/comm_context.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp {

at::Tensor gather_full_tensor(FSDPUnit& unit, const FSDPParam& p, bool grad) {
  at::NoGradGuard no_grad;
  auto& g = *unit.shard_group();
  const auto& s = p.spec;
  const int64_t rows = s.real_rows(unit.shard_rank());
  at::Tensor src = grad ? p.sharded_param.grad() : p.sharded_param;
  at::Tensor has = at::tensor({static_cast<int64_t>(src.defined())}, at::kLong)
                       .to(comm::CommContext::for_group(g).flag_device);
  if (grad) {
    g.all_reduce(has, comm::ReduceOp::kMax, comm::OpTag{unit.name(), "state_dict"})->wait();
    if (has.item<int64_t>() == 0) return at::Tensor();
  }
  at::Tensor shard = at::zeros({s.rows_per_rank, s.row_numel}, p.sharded_param.options());
  if (src.defined() && rows > 0) shard.narrow(0, 0, rows).copy_(src.reshape({rows, s.row_numel}));
  at::Tensor full = at::empty({s.world_size * s.rows_per_rank, s.row_numel}, shard.options());
  g.all_gather_into_tensor(full, shard, comm::OpTag{unit.name(), "state_dict"})->wait();
  return full.narrow(0, 0, s.dim0).reshape(p.shape).clone();
}

std::vector<std::pair<std::string, at::Tensor>> full_state_dict(
    const std::shared_ptr<torch::nn::Module>& root) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& sp : sharded_parameters(root)) {
    out.emplace_back(sp.name, gather_full_tensor(*sp.unit, *sp.param, false));
  }
  return out;
}

void load_full_state_dict(const std::shared_ptr<torch::nn::Module>& root,
                          const std::map<std::string, at::Tensor>& state) {
  auto params = sharded_parameters(root);
  std::set<std::string> expected;
  for (const auto& sp : params) {
    const ErrorContext where = sp.unit->where("load_full_state_dict");
    auto it = state.find(sp.name);
    FSDP_CHECK(it != state.end(), ErrorKind::kInvalidArgument, where, "missing parameter '", sp.name,
               "' in the state dict (", state.size(), " entries)");
    FSDP_CHECK(it->second.sizes().vec() == sp.param->shape, ErrorKind::kInvalidArgument, where,
               expected_actual("shape of parameter '" + sp.name + "' in the state dict",
                               shard::shape_to_string(sp.param->shape), it->second.sizes()));
    expected.insert(sp.name);
  }
  const int rank = params.empty() ? -1 : params.front().unit->group()->rank();
  for (const auto& kv : state) {
    FSDP_CHECK(expected.count(kv.first), ErrorKind::kInvalidArgument,
               (ErrorContext{rank, "", "load_full_state_dict"}), "unexpected parameter '", kv.first,
               "' in the state dict: the model has ", expected.size(), " parameters, e.g. '",
               expected.empty() ? std::string() : *expected.begin(), "'");
  }
  at::NoGradGuard no_grad;
  for (const auto& sp : params) {
    const auto& s = sp.param->spec;
    const int64_t rank = sp.unit->shard_rank();
    const int64_t rows = s.real_rows(rank);
    if (rows == 0) continue;
    at::Tensor full = state.at(sp.name).reshape({s.dim0, s.row_numel});
    sp.tensor.view({rows, s.row_numel}).copy_(full.narrow(0, s.row_offset(rank), rows));
  }
  invalidate_unsharded(root);  // no unit may keep computing with the old values
}

}  // namespace fsdp
