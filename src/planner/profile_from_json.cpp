// Reading a profile file back (docs/planner.md, "Profile file"): every field checked for its type
// and range before the time model uses it; any error names the field, what it must be and what
// the file holds.
#include <algorithm>

#include "../common/json_fields.h"
#include "fsdp/common/check.h"
#include "fsdp/planner/profile.h"
#include "profile_file.h"

namespace fsdp::planner {
namespace {

using namespace profile_file;
using json_fields::FieldError;
using json_fields::number_in_range;
using json_fields::only_known_keys;
using json_fields::path_of;
using json_fields::shortened;
using json_fields::object_field;
using json_fields::typed;
using json_fields::whole_in_range;
using json = nlohmann::json;

// Throws FieldError(message) unless `ok` (the caller puts "profile: " in front).
template <typename... Args>
void require(bool ok, const Args&... message) {
  if (!ok) throw FieldError(str_cat(message...));
}

// A number in [0, hi].
double non_negative(const json& j, const char* key, const std::string& where, double hi) {
  return number_in_range(j, key, where, 0.0, hi);
}

// A rate per second: 0 (not measured) or in [1, kMaxRate].
double rate(const json& j, const char* key, const std::string& where) {
  const double v = typed<double>(j, key, where);
  require(v == 0.0 || (v >= 1.0 && v <= kMaxRate), path_of(where, key), " must be 0 (not measured) or in [1, ",
          kMaxRate, "], got ", shortened(j.at(key)));
  return v;
}

LinkProfile link_from(const json& j, const std::string& where) {
  only_known_keys(j, where, {"alpha_s", "bandwidth_bytes_per_s"});
  LinkProfile l;
  l.alpha_s = non_negative(j, "alpha_s", where, kMaxSeconds);
  l.bandwidth_bytes_per_s = number_in_range(j, "bandwidth_bytes_per_s", where, 1.0, kMaxRate);
  return l;
}

// step_update_points_numel_seconds.<key>: [[numel, seconds], ...], numel > 0 strictly ascending,
// seconds >= 0, at least one point; an optimizer without the key has no points.
std::vector<UpdatePoint> update_points_from(const json& c, const char* key) {
  const std::string where = std::string("step_update_points_numel_seconds.") + key;
  require(c.is_object(), "step_update_points_numel_seconds must be a JSON object, got ", c.type_name());
  if (!c.contains(key)) return {};  // this optimizer: step_update_s_per_elem
  const json& a = c.at(key);
  require(a.is_array() && !a.empty(), where, " must be a non-empty array of [numel, seconds]");
  std::vector<UpdatePoint> out;
  for (const json& pt : a) {
    require(pt.is_array() && pt.size() == 2 && pt.at(0).is_number_integer() && pt.at(1).is_number(), where,
            ": every point is [numel, seconds], got ", shortened(pt));
    const UpdatePoint u{pt.at(0).get<int64_t>(), pt.at(1).get<double>()};
    require(u.numel > 0 && u.numel <= kMaxNumel && u.seconds >= 0 && u.seconds <= kMaxSeconds &&
                (out.empty() || u.numel > out.back().numel),
            where, ": numel must be in [1, 2^50] and strictly ascending, seconds in [0, ", kMaxSeconds, "]; got ",
            shortened(pt));
    out.push_back(u);
  }
  return out;
}

// calibration.fits.<kind>.points_bytes_seconds: [[logical bytes, seconds], ...], bytes in
// [1, 2^60] strictly ascending, seconds in [0, kMaxSeconds]; absent or empty: no points (the
// time model then uses the links); else at least 2 (a line needs two).
std::vector<CalibrationPoint> calibration_points_from(const json& e, const std::string& where) {
  if (!e.contains("points_bytes_seconds")) return {};
  const json& a = e.at("points_bytes_seconds");
  require(a.is_array(), where, ".points_bytes_seconds must be an array of [bytes, seconds], got ", a.type_name());
  std::vector<CalibrationPoint> out;
  for (const json& pt : a) {
    require(pt.is_array() && pt.size() == 2 && pt.at(0).is_number_integer() && pt.at(1).is_number(), where,
            ".points_bytes_seconds: every point is [bytes, seconds], got ", shortened(pt));
    const CalibrationPoint c{pt.at(0).get<int64_t>(), pt.at(1).get<double>()};
    require(c.logical_bytes > 0 && c.logical_bytes <= kMaxBytes && c.seconds >= 0 && c.seconds <= kMaxSeconds &&
                (out.empty() || c.logical_bytes > out.back().logical_bytes),
            where, ".points_bytes_seconds: bytes must be in [1, 2^60] and strictly ascending, seconds in [0, ",
            kMaxSeconds, "]; got ", shortened(pt));
    out.push_back(c);
  }
  require(out.size() != 1, where, ".points_bytes_seconds must hold no point or at least 2, got 1");
  return out;
}

// The text as JSON; a key twice in one object is refused (the JSON library keeps the last, which
// would leave the first's value out of the plan without a word). Throws fsdp::Error (kCorruptData).
json parse_profile_text(const std::string& text) {
  try {
    std::vector<std::vector<std::string>> keys;  // the keys seen, per open object
    return json::parse(text, [&keys](int, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::object_start) keys.emplace_back();
      if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
      if (event == json::parse_event_t::key && !keys.empty()) {
        const std::string k = parsed.get<std::string>();
        FSDP_CHECK(std::find(keys.back().begin(), keys.back().end(), k) == keys.back().end(),
                   ErrorKind::kCorruptData, kWhere, "profile: the key ", shortened(json(k)),
                   " appears twice in one object");
        keys.back().push_back(k);
      }
      return true;
    });
  } catch (const json::exception& e) {
    // nlohmann's text less its "[json.exception.parse_error.101] " tag.
    std::string what = e.what();
    if (!what.empty() && what[0] == '[' && what.find("] ") != std::string::npos) what = what.substr(what.find("] ") + 2);
    throw Error(ErrorKind::kCorruptData, kWhere, str_cat("profile: not JSON: ", what));
  }
}

// One precision's achieved efficiency: a number (0: none; else one figure for every width) or an
// array of {"n_embd": C, "efficiency": E} objects, C ascending (profile.h EfficiencyCurve).
EfficiencyCurve efficiency_curve_from(const json& v, const std::string& where) {
  EfficiencyCurve c;
  if (v.is_number()) {
    const double e = v.get<double>();
    require(e == 0.0 || (e >= kMinComputeEfficiency && e <= 1.0), where, " must be 0 (none) or in [",
            kMinComputeEfficiency, ", 1], got ", shortened(v));
    if (e > 0) c.points.push_back({0, e});
    return c;
  }
  require(v.is_array() && !v.empty(), where,
          " must be a number or a non-empty array of {\"n_embd\": width, \"efficiency\": fraction}, got ",
          shortened(v));
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const json& q = v[i];
    require(q.is_object(), at, " must be {\"n_embd\": width, \"efficiency\": fraction}, got ", shortened(q));
    only_known_keys(q, at, {"n_embd", "efficiency"});
    c.points.push_back({whole_in_range(q, "n_embd", at, 1, int64_t{1} << 30, "[1, 2^30]"),
                        typed<double>(q, "efficiency", at)});
  }
  const std::string problem = c.problem();
  require(problem.empty(), where, problem);
  return c;
}

// name .. ranks_per_node, the matmul and model rates, compute_efficiency.
void read_machine(const json& j, DeviceProfile& p) {
  p.name = typed<std::string>(j, "name", "");
  if (j.contains("description")) p.description = typed<std::string>(j, "description", "");
  if (j.contains("sources")) p.sources = typed<std::vector<std::string>>(j, "sources", "");
  // Whole bytes; 0: not known (a plan then needs a memory per rank of its own).
  p.memory_bytes = whole_in_range(j, "memory_bytes", "", 0, kMaxBytes, "[0, 2^60] (bytes; 0: not known)");
  p.ranks_per_node = whole_in_range(j, "ranks_per_node", "", 1, kMaxRanks, "[1, 2^20]");
  const json& f = object_field(j, "matmul_flops_per_s", "");
  only_known_keys(f, "matmul_flops_per_s", {"fp32", "bf16", "fp16"});
  p.matmul_flops_per_s_fp32 = number_in_range(f, "fp32", "matmul_flops_per_s", 1.0, kMaxRate);
  p.matmul_flops_per_s_bf16 = number_in_range(f, "bf16", "matmul_flops_per_s", 1.0, kMaxRate);
  p.matmul_flops_per_s_fp16 = f.contains("fp16") ? rate(f, "fp16", "matmul_flops_per_s") : 0.0;
  // The same range as fsdp-plan's --compute-efficiency.
  p.compute_efficiency = j.contains("compute_efficiency")
                             ? number_in_range(j, "compute_efficiency", "", kMinComputeEfficiency, 1.0)
                             : 1.0;
  if (j.contains("achieved_efficiency")) {  // optional: none published
    const json& a = object_field(j, "achieved_efficiency", "");
    only_known_keys(a, "achieved_efficiency", {"fp32", "bf16", "fp16"});
    EfficiencyCurve* curves[] = {&p.achieved_efficiency_fp32, &p.achieved_efficiency_bf16, &p.achieved_efficiency_fp16};
    const char* keys[] = {"fp32", "bf16", "fp16"};
    for (int k = 0; k < 3; ++k) {
      if (a.contains(keys[k])) {
        *curves[k] = efficiency_curve_from(a.at(keys[k]), std::string("achieved_efficiency.") + keys[k]);
      }
    }
    require(!p.has_achieved_efficiency() || p.compute_efficiency == 1.0,
            "achieved_efficiency and a compute_efficiency below 1 are two figures for one rate: keep one (got "
            "compute_efficiency ",
            p.compute_efficiency, ")");
  }
  if (j.contains("model_flops_per_s")) {
    const json& mf = object_field(j, "model_flops_per_s", "");
    only_known_keys(mf, "model_flops_per_s", {"fp32", "bf16", "fp16"});
    p.model_flops_per_s_fp32 = rate(mf, "fp32", "model_flops_per_s");
    p.model_flops_per_s_bf16 = rate(mf, "bf16", "model_flops_per_s");
    p.model_flops_per_s_fp16 = rate(mf, "fp16", "model_flops_per_s");
  }
}

// step_update_s_per_elem, step_update_points_numel_seconds.
void read_step_update(const json& j, DeviceProfile& p) {
  const json& u = object_field(j, "step_update_s_per_elem", "");
  only_known_keys(u, "step_update_s_per_elem", {"adamw", "sgd-momentum", "sgd"});
  p.step_update_s_per_elem_adamw = non_negative(u, "adamw", "step_update_s_per_elem", kMaxSeconds);
  p.step_update_s_per_elem_sgd_momentum = non_negative(u, "sgd-momentum", "step_update_s_per_elem", kMaxSeconds);
  p.step_update_s_per_elem_sgd = non_negative(u, "sgd", "step_update_s_per_elem", kMaxSeconds);
  if (j.contains("step_update_points_numel_seconds")) {
    const json& c = j.at("step_update_points_numel_seconds");
    only_known_keys(c, "step_update_points_numel_seconds", {"adamw", "sgd-momentum", "sgd"});
    std::vector<UpdatePoint>* curves[] = {&p.step_update_points_adamw, &p.step_update_points_sgd_momentum,
                                          &p.step_update_points_sgd};
    for (int k = 0; k < 3; ++k) *curves[k] = update_points_from(c, kOptimizerKeys[k]);
  }
}

// memory_copy_bytes_per_s, comm_overlaps_compute, compute_oversubscribed.
void read_cores(const json& j, DeviceProfile& p) {
  require(j.contains("memory_copy_bytes_per_s"),
          "no field 'memory_copy_bytes_per_s' (a profile calibrated before the copy rate was measured: calibrate "
          "again)");
  p.memory_copy_bytes_per_s = number_in_range(j, "memory_copy_bytes_per_s", "", 1.0, kMaxRate);
  p.comm_overlaps_compute = typed<bool>(j, "comm_overlaps_compute", "");
  // Absent in profiles written before it was recorded: false.
  if (j.contains("compute_oversubscribed")) p.compute_oversubscribed = typed<bool>(j, "compute_oversubscribed", "");
  require(!(p.compute_oversubscribed && p.comm_overlaps_compute),
          "compute_oversubscribed true needs comm_overlaps_compute false (compute that needs more cores than the "
          "node has leaves none to communication)");
}

// network (optional; absent: one ring over the nodes, nics_per_node 0): the NCCL model's adapters
// per node and its fixed cost per collective.
void read_network(const json& j, DeviceProfile& p) {
  if (!j.contains("network")) return;
  const json& n = object_field(j, "network", "");
  only_known_keys(n, "network", {"nics_per_node", "base_latency_s"});
  p.nics_per_node = whole_in_range(n, "nics_per_node", "network", 1, kMaxRanks, "[1, 2^20]");
  p.collective_base_latency_s =
      n.contains("base_latency_s") ? non_negative(n, "base_latency_s", "network", kMaxSeconds) : 0.0;
}

// collectives: null (a one-rank calibration) or the links and factors of each kind.
void read_collectives(const json& j, DeviceProfile& p) {
  const json& c = json_fields::required(j, "collectives", "");
  require(c.is_null() || c.is_object(), "collectives must be null (a one-rank calibration) or a JSON object, got ",
          shortened(c));
  p.has_collectives = !c.is_null();
  only_known_keys(c, "collectives", {"all_gather", "reduce_scatter", "all_reduce"});
  CollectiveLinks* links[] = {&p.all_gather, &p.reduce_scatter, &p.all_reduce};
  for (int k = 0; k < 3 && p.has_collectives; ++k) {
    const std::string where = std::string("collectives.") + kKinds[k];
    const json& e = object_field(c, kKinds[k], "collectives");
    only_known_keys(e, where, {"intra_node", "inter_node", "shared_core_factor", "duration_factor"});
    links[k]->intra_node = link_from(object_field(e, "intra_node", where), where + ".intra_node");
    links[k]->inter_node = link_from(object_field(e, "inter_node", where), where + ".inter_node");
    // Absent in profiles written before it was measured: 1 (a collective costs its time alone).
    if (e.contains("shared_core_factor")) {
      // One range per regime, named whole in the message.
      const double f = typed<double>(e, "shared_core_factor", where);
      const double lo = p.compute_oversubscribed ? kMinOversubscribedFactor : 1.0;
      require(f >= lo && f <= kMaxSharedCoreFactor, where, ".shared_core_factor must be in [", lo, ", ",
              kMaxSharedCoreFactor, "] ",
              p.compute_oversubscribed ? "where compute oversubscribes the cores"
                                       : "(a collective costs a step at least its time alone where it shares the "
                                         "cores and compute fits them; below 1 only with compute_oversubscribed true)",
              ", got ", shortened(e.at("shared_core_factor")));
      links[k]->shared_core_factor = f;
    }
    if (e.contains("duration_factor")) {  // absent in profiles written before it was measured: 1
      const double d = typed<double>(e, "duration_factor", where);
      require(d >= 1.0 && d <= kMaxSharedCoreFactor, where, ".duration_factor must be in [1, ", kMaxSharedCoreFactor,
              "] (beside compute a collective runs no faster than alone), got ", shortened(e.at("duration_factor")));
      links[k]->duration_factor = d;
    }
  }
}

// calibration: the world size, the calibrated setup (all four or none) and the fits.
void read_calibration(const json& j, DeviceProfile& p) {
  if (!j.contains("calibration")) return;
  const json& cal = object_field(j, "calibration", "");
  only_known_keys(cal, "calibration", {"world_size", "model", "model_params", "micro_batch_size", "seq_len", "fits"});
  p.calibration_world_size = whole_in_range(cal, "world_size", "calibration", 1, kMaxRanks, "[1, 2^20]");
  // Absent in profiles written before the calibrated setup was recorded: all four or none.
  const int setup_keys = static_cast<int>(cal.contains("model")) + static_cast<int>(cal.contains("model_params")) +
                         static_cast<int>(cal.contains("micro_batch_size")) + static_cast<int>(cal.contains("seq_len"));
  require(setup_keys == 0 || setup_keys == 4,
          "calibration.model, .model_params, .micro_batch_size and .seq_len are all four or none, got ", setup_keys);
  if (setup_keys == 4) {
    p.calibration_model = typed<std::string>(cal, "model", "calibration");
    require(!p.calibration_model.empty(), "calibration.model must name the calibrated model, got \"\"");
    p.calibration_model_params = whole_in_range(cal, "model_params", "calibration", 1, kMaxNumel, "[1, 2^50]");
    p.calibration_micro_batch_size = whole_in_range(cal, "micro_batch_size", "calibration", 1, kMaxNumel, "[1, 2^50]");
    p.calibration_seq_len = whole_in_range(cal, "seq_len", "calibration", 1, kMaxNumel, "[1, 2^50]");
  }
  // A one-rank calibration measures no collective: it has no fits.
  require(p.has_collectives || !cal.contains("fits"),
          "calibration.fits is for a calibration of 2 or more ranks (\"collectives\" is null here)");
  if (!p.has_collectives) return;
  const json& fits = object_field(cal, "fits", "calibration");
  only_known_keys(fits, "calibration.fits", {"all_gather", "reduce_scatter", "all_reduce"});
  for (const char* kind : kKinds) {
    const std::string where = std::string("calibration.fits.") + kind;
    const json& e = object_field(fits, kind, "calibration.fits");
    only_known_keys(e, where, {"alpha_s", "beta_s_per_byte", "points_bytes_seconds"});
    CalibrationFit fit;
    fit.alpha_s = non_negative(e, "alpha_s", where, kMaxSeconds);
    fit.beta_s_per_byte = non_negative(e, "beta_s_per_byte", where, kMaxSeconds);
    fit.points = calibration_points_from(e, where);
    p.fits.push_back(fit);
  }
}

}  // namespace

DeviceProfile profile_from_json(const std::string& text) {
  const json j = parse_profile_text(text);
  DeviceProfile p;
  try {
    require(j.is_object(), "the file must be a JSON object, got ", j.type_name());
    only_known_keys(j, "", {"name", "description", "sources", "memory_bytes", "ranks_per_node", "matmul_flops_per_s",
                            "compute_efficiency", "achieved_efficiency", "network", "model_flops_per_s", "step_update_s_per_elem",
                            "step_update_points_numel_seconds", "memory_copy_bytes_per_s", "comm_overlaps_compute",
                            "compute_oversubscribed", "collectives", "calibration"});
    read_machine(j, p);
    read_step_update(j, p);
    read_cores(j, p);
    read_collectives(j, p);
    read_network(j, p);
    read_calibration(j, p);
    require(p.has_collectives || p.calibration_world_size == 1,
            "\"collectives\": null is for a one-rank calibration (calibration.world_size 1)");
  } catch (const FieldError& e) {
    throw Error(ErrorKind::kCorruptData, kWhere, str_cat("profile: ", e.what()));
  }
  return p;
}

}  // namespace fsdp::planner
