// plan_to_json (plan.h): the machine-readable form of a Plan, for scripts.
#include <nlohmann/json.hpp>

#include "fsdp/planner/activations.h"
#include "fsdp/planner/plan.h"
#include "fsdp/runtime/strategy_traits.h"

namespace fsdp::planner {
namespace {

using json = nlohmann::json;

json split_json(const BytesPerParam& b) {
  return {{"params", b.params}, {"grads", b.grads}, {"optimizer", b.optimizer}, {"total", b.total()}};
}

json totals_json(const KindTotals& k) {
  return {{"calls", k.calls}, {"logical_bytes", k.logical_bytes}, {"wire_bytes", k.wire_bytes}};
}

json strategy_json(const StrategyPlan& s) {
  const Parallelism& p = s.parallelism;
  json j;
  j["strategy"] = fsdp::to_string(p.strategy);
  j["label"] = p.label();
  j["hybrid_shard_group_size"] = fsdp::traits_of(p.strategy).uses_hybrid_shard_group_size ? p.shard_group_size() : 0;
  j["shard_group_size"] = p.shard_group_size();
  j["num_replicas"] = p.num_replicas();
  j["reshard_after_forward_group_size"] = p.node_group_size();
  j["collective_host_size"] = p.host_stage_size();
  j["model_state"] = {{"sharded_param_bytes", s.state.sharded_param_bytes},
                      {"sharded_grad_bytes", s.state.sharded_grad_bytes},
                      {"optim_state_bytes", s.state.optim_state_bytes},
                      {"resident_unsharded_param_bytes", s.state.resident_unsharded_param_bytes},
                      {"total_bytes", s.state.total_bytes()},
                      {"closed_form_bytes", s.closed_form_bytes},
                      {"zero_paper_bytes", s.zero_paper_bytes}};
  const PeakBytes& k = s.peak;
  j["peak"] = {{"peak_bytes", k.peak_bytes},
               {"moment", k.moment},
               {"persistent_bytes", k.persistent_bytes},
               {"sharded_grad_bytes", k.sharded_grad_bytes},
               {"unsharded_param_bytes", k.unsharded_param_bytes},
               {"node_shard_bytes", k.node_shard_bytes},
               {"unsharded_grad_bytes", k.unsharded_grad_bytes},
               {"reduce_in_flight_bytes", k.reduce_in_flight_bytes},
               {"activation_bytes", k.activation_bytes},
               {"loss_transient_bytes", k.loss_transient_bytes},
               {"optimizer_temp_bytes", k.optimizer_temp_bytes},
               {"activations_known", k.activations_known}};
  j["fits"] = s.fits;
  j["traffic"] = {{"all_gather", totals_json(s.traffic.all_gather)},
                  {"reduce_scatter", totals_json(s.traffic.reduce_scatter)},
                  {"all_reduce", totals_json(s.traffic.all_reduce)},
                  {"all_to_all", totals_json(s.traffic.all_to_all)},
                  {"logical_bytes", s.traffic.logical_bytes()},
                  {"inter_node_bytes", s.traffic.inter_node_bytes()},
                  {"wire_bytes", s.traffic.wire_bytes()}};
  j["time"] = {{"flops", s.time.flops},
               {"compute_s", s.time.compute_s},
               {"matmul_efficiency", s.time.matmul_efficiency},
               {"update_s", s.time.update_s},
               {"comm_s", s.time.comm_s},
               {"copy_s", s.time.copy_s},
               {"exposed_comm_s", s.time.exposed_comm_s},
               {"step_s", s.time.step_s},
               {"tokens_per_s", s.time.tokens_per_s},
               {"model_flops", s.time.model_flops},
               {"mfu", s.time.mfu},
               {"hfu", s.time.hfu}};
  return j;
}

}  // namespace

std::string plan_to_json(const Plan& plan) {
  const PlanInputs& in = plan.inputs;
  const ModelSpec& m = in.model;
  const Architecture& a = m.arch;
  json j;
  int64_t largest = 0;
  for (size_t u = 1; u < m.units.size(); ++u) largest = std::max(largest, m.units[u].numel());
  j["model"] = {{"name", m.name},
                {"num_params", m.num_params()},
                {"matmul_params", m.matmul_params()},
                {"num_units", static_cast<int64_t>(m.units.size())},
                {"root_params", m.units.empty() ? 0 : m.units[0].numel()},
                {"largest_block_params", largest},
                {"n_layer", a.n_layer},
                {"n_embd", a.n_embd},
                {"n_head", a.n_head},
                {"n_kv_head", a.n_kv_head},
                {"ffn_hidden", a.ffn_hidden},
                {"vocab_size", a.vocab_size},
                {"context", a.context},
                {"tied_head", a.tied_head},
                {"attention", a.attention}};
  const StepSetup& st = in.step;
  j["inputs"] = {{"world_size", in.world_size},
                 {"ranks_per_node", plan.ranks_per_node},
                 {"mixed_precision", to_string(st.precision)},
                 {"optimizer", to_string(st.optimizer)},
                 {"micro_batch_size", st.micro_batch_size},
                 {"seq_len", st.seq_len},
                 {"accumulation_steps", st.accumulation_steps},
                 {"global_batch_size", in.world_size * st.accumulation_steps * st.micro_batch_size},
                 {"tokens_per_step", in.world_size * st.accumulation_steps * st.micro_batch_size * st.seq_len},
                 {"activation_checkpointing", st.activation_checkpointing},
                 {"all_gather_codec", fsdp::to_string(st.all_gather_codec)},
                 {"reshard_after_forward_group_size", in.reshard_after_forward_group_size},
                 {"reduce_scatter_codec", fsdp::to_string(st.reduce_scatter_codec)},
                 {"collective_host_size", in.collective_host_size},
                 {"checkpoint_every", st.checkpoint_every},
                 {"forward_prefetch", st.forward_prefetch},
                 {"backward_prefetch", st.backward_prefetch},
                 {"max_unsharded_units", st.max_unsharded_units},
                 {"bucket_cap_bytes", st.bucket_cap_bytes},
                 {"clip_grad_norm", st.clip_grad_norm},
                 {"loss_scaling", st.loss_scaling},
                 {"nonfinite_check", st.nonfinite_check},
                 {"reduce_scatter_route", to_string(st.reduce_scatter_route)},
                 {"rank", in.rank},
                 {"memory_per_rank_bytes", plan.memory_per_rank_bytes},
                 {"headroom", in.headroom},
                 {"usable_bytes", plan.usable_bytes}};
  const ActivationModel act = activation_model(m, st);
  j["activations"] = {{"known", act.known},
                      {"attention_kernel", act.attention_kernel},
                      {"block_bytes", act.block_bytes},
                      {"block_input_bytes", act.block_input_bytes},
                      {"checkpointed_block_bytes", act.checkpointed_block_bytes},
                      {"first_block_frozen_input_bytes", act.first_block_frozen_input_bytes},
                      {"root_bytes", act.root_bytes},
                      {"root_lookup_bytes", act.root_lookup_bytes},
                      {"loss_transient_bytes", act.loss_transient_bytes},
                      {"total_saved_bytes", act.total_saved_bytes}};
  j["profile"] = json::parse(profile_to_json(in.profile));
  j["bytes_per_param"] = {{"engine", split_json(plan.engine_split)}, {"zero_paper", split_json(plan.zero_paper_split)}};
  j["strategies"] = json::array();
  for (const auto& s : plan.strategies) j["strategies"].push_back(strategy_json(s));
  const Recommendation& r = plan.recommendation;
  j["recommendation"] = {{"kind", to_string(r.kind)},
                         {"strategy", fsdp::to_string(r.choice.strategy)},
                         {"label", r.choice.label()},
                         {"hybrid_shard_group_size",
                          fsdp::traits_of(r.choice.strategy).uses_hybrid_shard_group_size ? r.choice.shard_group_size() : 0},
                         {"world_size", r.choice.world_size},
                         {"activation_checkpointing", r.activation_checkpointing || in.step.activation_checkpointing},
                         {"reason", r.reason}};
  j["notes"] = plan.notes;
  return j.dump(2) + "\n";
}

}  // namespace fsdp::planner
