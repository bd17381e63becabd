// A profile written out as its JSON file, and a profile loaded by name or from a file
// (docs/planner.md, "Profile file"; reading a file's fields: profile_from_json.cpp).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fsdp/common/check.h"
#include "fsdp/planner/profile.h"
#include "profile_file.h"

namespace fsdp::planner {
namespace {

using json = nlohmann::json;

json link_json(const LinkProfile& l) {
  return {{"alpha_s", l.alpha_s}, {"bandwidth_bytes_per_s", l.bandwidth_bytes_per_s}};
}

}  // namespace

std::string profile_to_json(const DeviceProfile& p) {
  json j;
  j["name"] = p.name;
  j["description"] = p.description;
  j["sources"] = p.sources;
  j["memory_bytes"] = p.memory_bytes;
  j["ranks_per_node"] = p.ranks_per_node;
  j["matmul_flops_per_s"] = {{"fp32", p.matmul_flops_per_s_fp32},
                             {"bf16", p.matmul_flops_per_s_bf16},
                             {"fp16", p.matmul_flops_per_s_fp16}};
  j["compute_efficiency"] = p.compute_efficiency;
  // Optional keys, written only where they hold something: a profile without them stays readable by
  // readers that predate them.
  if (p.has_achieved_efficiency()) {
    // A figure for every width as a number (what readers before the curves read), else the points.
    auto curve = [](const EfficiencyCurve& c) -> json {
      if (c.empty()) return 0.0;
      if (c.points.size() == 1 && c.points.front().n_embd == 0) return c.points.front().efficiency;
      json a = json::array();
      for (const EfficiencyPoint& q : c.points) a.push_back({{"n_embd", q.n_embd}, {"efficiency", q.efficiency}});
      return a;
    };
    j["achieved_efficiency"] = {{"fp32", curve(p.achieved_efficiency_fp32)},
                                {"bf16", curve(p.achieved_efficiency_bf16)},
                                {"fp16", curve(p.achieved_efficiency_fp16)}};
  }
  if (p.nics_per_node > 0) {
    j["network"] = {{"nics_per_node", p.nics_per_node}, {"base_latency_s", p.collective_base_latency_s}};
  }
  j["model_flops_per_s"] = {{"fp32", p.model_flops_per_s_fp32},
                            {"bf16", p.model_flops_per_s_bf16},
                            {"fp16", p.model_flops_per_s_fp16}};
  j["step_update_s_per_elem"] = {{"adamw", p.step_update_s_per_elem_adamw},
                                 {"sgd-momentum", p.step_update_s_per_elem_sgd_momentum},
                                 {"sgd", p.step_update_s_per_elem_sgd}};
  const std::vector<UpdatePoint>* curves[] = {&p.step_update_points_adamw, &p.step_update_points_sgd_momentum,
                                              &p.step_update_points_sgd};
  if (!curves[0]->empty() || !curves[1]->empty() || !curves[2]->empty()) {
    for (int k = 0; k < 3; ++k) {
      json pts = json::array();
      for (const auto& pt : *curves[k]) pts.push_back({pt.numel, pt.seconds});
      if (!pts.empty()) j["step_update_points_numel_seconds"][profile_file::kOptimizerKeys[k]] = pts;
    }
  }
  j["memory_copy_bytes_per_s"] = p.memory_copy_bytes_per_s;
  j["comm_overlaps_compute"] = p.comm_overlaps_compute;
  j["compute_oversubscribed"] = p.compute_oversubscribed;
  const CollectiveLinks* links[] = {&p.all_gather, &p.reduce_scatter, &p.all_reduce};
  j["collectives"] = nullptr;  // a one-rank calibration: none measured
  for (int k = 0; k < 3 && p.has_collectives; ++k) {
    j["collectives"][profile_file::kKinds[k]] = {{"intra_node", link_json(links[k]->intra_node)},
                                   {"inter_node", link_json(links[k]->inter_node)},
                                   {"shared_core_factor", links[k]->shared_core_factor},
                                   {"duration_factor", links[k]->duration_factor}};
  }
  if (p.calibration_world_size > 0) {
    j["calibration"]["world_size"] = p.calibration_world_size;
    if (!p.calibration_model.empty()) {
      j["calibration"]["model"] = p.calibration_model;
      j["calibration"]["model_params"] = p.calibration_model_params;
      j["calibration"]["micro_batch_size"] = p.calibration_micro_batch_size;
      j["calibration"]["seq_len"] = p.calibration_seq_len;
    }
    for (size_t k = 0; k < p.fits.size() && k < 3; ++k) {
      json pts = json::array();
      for (const auto& pt : p.fits[k].points) pts.push_back({pt.logical_bytes, pt.seconds});
      j["calibration"]["fits"][profile_file::kKinds[k]] = {{"alpha_s", p.fits[k].alpha_s},
                                             {"beta_s_per_byte", p.fits[k].beta_s_per_byte},
                                             {"points_bytes_seconds", pts}};
    }
  }
  return j.dump(2) + "\n";
}

DeviceProfile load_profile(const std::string& name_or_path) {
  const auto names = builtin_profile_names();
  if (std::find(names.begin(), names.end(), name_or_path) != names.end()) return builtin_profile(name_or_path);
  std::error_code ec;
  FSDP_CHECK(!std::filesystem::is_directory(name_or_path, ec), ErrorKind::kInvalidArgument, profile_file::kWhere,
             "profile '", name_or_path, "' is a directory: give the JSON file that fsdp-plan --calibrate --out "
             "wrote, or a built-in profile (a100, h100)");
  std::ifstream in(name_or_path);
  FSDP_CHECK(in.good(), ErrorKind::kIo, profile_file::kWhere, "cannot read profile '", name_or_path,
             "' (neither a file nor a built-in profile: a100, h100)");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return profile_from_json(ss.str());
  } catch (const Error& e) {
    throw Error(e.kind(), e.where(), name_or_path + ": " + e.message());
  }
}

}  // namespace fsdp::planner
