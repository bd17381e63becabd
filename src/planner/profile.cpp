#include "fsdp/planner/profile.h"

#include <type_traits>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "fsdp/common/check.h"
#include "fsdp/planner/traffic.h"

namespace fsdp::planner {
namespace {

using json = nlohmann::json;
using K = fsdp::comm::CollectiveKind;
const ErrorContext kProfileWhere{-1, "", "planner profile"};

// [Note: built-in profiles] Figures from the vendors' datasheets, per GPU. NVLink's "900GB/s" and
// "600GB/s" are bidirectional totals: a ring sends and receives at once, so a rank's bandwidth is
// half. InfiniBand: one single-port adapter per GPU (DGX), its line rate in bytes. Matmul rates
// are the dense Tensor Core peaks (the datasheets print them "with sparsity", twice the dense
// figure), fp32 the non-tensor FP32 peak (PyTorch runs fp32 matmuls without TF32 by default).
// The per-step latencies alpha are not datasheet figures: they are assumed (typical of NCCL's
// small-message latency) and say so in `sources`.
DeviceProfile dgx(const std::string& name) {
  DeviceProfile p;
  p.name = name;
  p.ranks_per_node = 8;
  p.memory_bytes = 80'000'000'000;  // the datasheets' "80GB"
  LinkProfile nvlink, ib;
  double hbm_bytes_per_s = 0.0;
  nvlink.alpha_s = 2e-6;
  ib.alpha_s = 6e-6;
  if (name == "h100") {
    p.description = "DGX H100 node: 8 x H100 SXM5 80GB, NVLink 4 + NVSwitch, 8 x 400 Gb/s InfiniBand";
    p.sources = {
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: FP32 67 TFLOPS; BF16 and FP16 Tensor Core "
        "1,979 TFLOPS with sparsity (989.5 dense, used here); GPU memory 80GB; NVLink 900GB/s "
        "(bidirectional: 450 GB/s per direction used here)",
        "NVIDIA DGX H100 datasheet: 8 x H100, 4 x NVSwitch, 8 x single-port ConnectX-7 VPI up to "
        "400 Gb/s InfiniBand (one per GPU: 50 GB/s per direction used here)",
        "alpha (latency per ring step) 2 us within a node, 6 us between nodes: assumed, not from a "
        "datasheet"};
    p.sources.push_back("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: GPU memory bandwidth 3.35TB/s (the step "
                        "update's time: its bytes per element at this rate; the engine's copies at this rate)");
    hbm_bytes_per_s = 3.35e12;
    p.matmul_flops_per_s_fp32 = 67e12;
    p.matmul_flops_per_s_bf16 = 989.5e12;
    p.matmul_flops_per_s_fp16 = 989.5e12;
    nvlink.bandwidth_bytes_per_s = 450e9;
    ib.bandwidth_bytes_per_s = 50e9;
  } else {
    p.description = "DGX A100 node: 8 x A100 SXM4 80GB, NVLink 3 + NVSwitch, 8 x 200 Gb/s HDR InfiniBand";
    p.sources = {
        "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: FP32 19.5 TFLOPS; BF16 and FP16 Tensor "
        "Core 312 TFLOPS (624 with sparsity); GPU memory 80GB HBM2e; NVLink 600GB/s (bidirectional: "
        "300 GB/s per direction used here)",
        "NVIDIA DGX A100 datasheet: 8 x A100 80GB, 6 x NVSwitch, 8 x single-port ConnectX-6 VPI "
        "200 Gb/s HDR InfiniBand (one per GPU: 25 GB/s per direction used here)",
        "alpha (latency per ring step) 2 us within a node, 6 us between nodes: assumed, not from a "
        "datasheet"};
    p.sources.push_back("NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: GPU memory bandwidth 2,039GB/s (the "
                        "step update's time: its bytes per element at this rate; the engine's copies at this rate)");
    hbm_bytes_per_s = 2.039e12;
    p.matmul_flops_per_s_fp32 = 19.5e12;
    p.matmul_flops_per_s_bf16 = 312e12;
    p.matmul_flops_per_s_fp16 = 312e12;
    nvlink.bandwidth_bytes_per_s = 300e9;
    ib.bandwidth_bytes_per_s = 25e9;
  }
  const CollectiveLinks links{nvlink, ib};
  p.all_gather = p.reduce_scatter = p.all_reduce = links;
  using O = OptimizerKind;
  p.step_update_s_per_elem_adamw = static_cast<double>(step_update_bytes_per_elem(O::kAdamW)) / hbm_bytes_per_s;
  p.step_update_s_per_elem_sgd_momentum =
      static_cast<double>(step_update_bytes_per_elem(O::kSgdMomentum)) / hbm_bytes_per_s;
  p.step_update_s_per_elem_sgd = static_cast<double>(step_update_bytes_per_elem(O::kSgd)) / hbm_bytes_per_s;
  p.memory_copy_bytes_per_s = hbm_bytes_per_s;
  p.comm_overlaps_compute = true;
  return p;
}

const char* kKinds[] = {"all_gather", "reduce_scatter", "all_reduce"};

json link_json(const LinkProfile& l) {
  return {{"alpha_s", l.alpha_s}, {"bandwidth_bytes_per_s", l.bandwidth_bytes_per_s}};
}

// Upper bounds of a profile's figures: well past any machine, so that an edited file cannot make
// the time model overflow (one collective step or one tensor's update within an hour; a rate
// below 1e18 per second; memory below 1 EiB).
constexpr double kMaxSeconds = 3600.0;
constexpr double kMaxRate = 1e18;
constexpr int64_t kMaxBytes = int64_t{1} << 60;
constexpr int64_t kMaxNumel = int64_t{1} << 50;
constexpr double kMaxSharedCoreFactor = 1000.0;
constexpr int64_t kMaxRanks = int64_t{1} << 20;

// A field's path in the file: "collectives.all_gather.alpha_s"; a top-level field (where "") by its key.
std::string path_of(const std::string& where, const char* key) {
  return where.empty() ? std::string(key) : where + "." + key;
}

// A JSON value as an error shows it: its text, cut to 60 characters.
std::string shortened(const json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

// `where`: the path of the object holding `key` ("" for the file's top level).
template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  FSDP_CHECK(j.is_object(), ErrorKind::kCorruptData, kProfileWhere, "profile: ", where.empty() ? "the file" : where,
             " must be a JSON object, got ", j.type_name());
  FSDP_CHECK(j.contains(key), ErrorKind::kCorruptData, kProfileWhere, "profile: ",
             where.empty() ? "the file" : where, " has no field '", key, "'");
  // Whole numbers: whole_in_range (nlohmann's get<int64_t> would cut 2.5 to 2).
  static_assert(!std::is_integral_v<T> || std::is_same_v<T, bool>, "whole numbers: whole_in_range");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    const char* expected = std::is_same_v<T, bool>                        ? "true or false"
                           : std::is_arithmetic_v<T>                      ? "a number"
                           : std::is_same_v<T, std::string>               ? "a string"
                           : std::is_same_v<T, std::vector<std::string>>  ? "an array of strings"
                                                                          : "a JSON value of another type";
    throw Error(ErrorKind::kCorruptData, kProfileWhere,
                str_cat("profile: ", path_of(where, key), " must be ", expected, ", got ", shortened(j.at(key))));
  }
}

// The keys an object of the file may hold: any other is a typo or a field of another program, and
// is rejected by name (ignoring it would plan with the default it was meant to replace).
void only_known_keys(const json& j, const std::string& where, std::initializer_list<const char*> known) {
  if (!j.is_object()) return;  // the field's own check names the wrong type
  for (const auto& item : j.items()) {
    const bool ok = std::any_of(known.begin(), known.end(), [&](const char* k) { return item.key() == k; });
    if (ok) continue;
    std::string names;
    for (const char* k : known) names += (names.empty() ? "" : ", ") + std::string(k);
    throw Error(ErrorKind::kCorruptData, kProfileWhere,
                str_cat("profile: ", where.empty() ? "the file" : where, " has an unknown field ",
                        shortened(json(item.key())), " (known: ", names, ")"));
  }
}

// A whole number in [lo, hi] (`range` as the message writes it: "[0, 2^60]"); one message for every
// value outside it, a fraction, past int64, or a number written with an exponent included (8e10 is
// the whole number 80,000,000,000: accepted).
int64_t whole_in_range(const json& j, const char* key, const std::string& where, int64_t lo, int64_t hi,
                       const char* range) {
  const json& v = field<json>(j, key, where);
  bool ok = false;
  int64_t out = 0;
  if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    out = v.get<int64_t>();
    ok = true;
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    ok = std::isfinite(d) && std::floor(d) == d && std::fabs(d) <= static_cast<double>(int64_t{1} << 62);
    if (ok) out = static_cast<int64_t>(d);
  }
  FSDP_CHECK(ok && out >= lo && out <= hi, ErrorKind::kCorruptData, kProfileWhere, "profile: ", path_of(where, key),
             " must be a whole number in ", range, ", got ", shortened(v));
  return out;
}

// A number in [lo, hi]; one range per field, the same words for every value outside it.
double in_range(const json& j, const char* key, const std::string& where, double lo, double hi) {
  const double v = field<double>(j, key, where);
  FSDP_CHECK(v >= lo && v <= hi, ErrorKind::kCorruptData, kProfileWhere, "profile: ", path_of(where, key),
             " must be in [", lo, ", ", hi, "], got ", shortened(j.at(key)));
  return v;
}

// A number in [0, hi].
double non_negative(const json& j, const char* key, const std::string& where, double hi) {
  return in_range(j, key, where, 0.0, hi);
}

// A rate per second: 0 (not measured) or in [1, kMaxRate].
double rate(const json& j, const char* key, const std::string& where) {
  const double v = field<double>(j, key, where);
  FSDP_CHECK(v == 0.0 || (v >= 1.0 && v <= kMaxRate), ErrorKind::kCorruptData, kProfileWhere, "profile: ",
             path_of(where, key), " must be 0 (not measured) or in [1, ", kMaxRate, "], got ", shortened(j.at(key)));
  return v;
}

LinkProfile link_from(const json& j, const std::string& where) {
  only_known_keys(j, where, {"alpha_s", "bandwidth_bytes_per_s"});
  LinkProfile l;
  l.alpha_s = non_negative(j, "alpha_s", where, kMaxSeconds);
  l.bandwidth_bytes_per_s = in_range(j, "bandwidth_bytes_per_s", where, 1.0, kMaxRate);
  return l;
}

const char* const kOptimizerKeys[] = {"adamw", "sgd-momentum", "sgd"};

// step_update_points_numel_seconds.<key>: [[numel, seconds], ...], numel > 0 strictly ascending,
// seconds >= 0, at least one point; an optimizer without the key has no points.
std::vector<UpdatePoint> update_points_from(const json& c, const char* key) {
  const std::string where = std::string("step_update_points_numel_seconds.") + key;
  FSDP_CHECK(c.is_object(), ErrorKind::kCorruptData, kProfileWhere,
             "profile: step_update_points_numel_seconds must be a JSON object, got ", c.type_name());
  if (!c.contains(key)) return {};  // this optimizer: step_update_s_per_elem
  const json& a = c.at(key);
  FSDP_CHECK(a.is_array() && !a.empty(), ErrorKind::kCorruptData, kProfileWhere, "profile: ", where,
             " must be a non-empty array of [numel, seconds]");
  std::vector<UpdatePoint> out;
  for (const json& pt : a) {
    FSDP_CHECK(pt.is_array() && pt.size() == 2 && pt.at(0).is_number_integer() && pt.at(1).is_number(),
               ErrorKind::kCorruptData, kProfileWhere, "profile: ", where, ": every point is [numel, seconds], got ", shortened(pt));
    const UpdatePoint u{pt.at(0).get<int64_t>(), pt.at(1).get<double>()};
    FSDP_CHECK(u.numel > 0 && u.numel <= kMaxNumel && u.seconds >= 0 && u.seconds <= kMaxSeconds &&
                   (out.empty() || u.numel > out.back().numel),
               ErrorKind::kCorruptData, kProfileWhere, "profile: ", where,
               ": numel must be in [1, 2^50] and strictly ascending, seconds in [0, ", kMaxSeconds, "]; got ",
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
  FSDP_CHECK(a.is_array(), ErrorKind::kCorruptData, kProfileWhere, "profile: ", where,
             ".points_bytes_seconds must be an array of [bytes, seconds], got ", a.type_name());
  std::vector<CalibrationPoint> out;
  for (const json& pt : a) {
    FSDP_CHECK(pt.is_array() && pt.size() == 2 && pt.at(0).is_number_integer() && pt.at(1).is_number(),
               ErrorKind::kCorruptData, kProfileWhere, "profile: ", where,
               ".points_bytes_seconds: every point is [bytes, seconds], got ", shortened(pt));
    const CalibrationPoint c{pt.at(0).get<int64_t>(), pt.at(1).get<double>()};
    FSDP_CHECK(c.logical_bytes > 0 && c.logical_bytes <= kMaxBytes && c.seconds >= 0 && c.seconds <= kMaxSeconds &&
                   (out.empty() || c.logical_bytes > out.back().logical_bytes),
               ErrorKind::kCorruptData, kProfileWhere, "profile: ", where,
               ".points_bytes_seconds: bytes must be in [1, 2^60] and strictly ascending, seconds in [0, ", kMaxSeconds,
               "]; got ", shortened(pt));
    out.push_back(c);
  }
  FSDP_CHECK(out.size() != 1, ErrorKind::kCorruptData, kProfileWhere, "profile: ", where,
             ".points_bytes_seconds must hold no point or at least 2, got 1");
  return out;
}

}  // namespace

int64_t step_update_bytes_per_elem(OptimizerKind o) {
  // The norm reads the gradient, clipping reads and writes it; zero_grad sets it to none, and the
  // gradients' finite check runs only after a non-finite norm.
  const int64_t grad_passes = 4 + 8;
  if (o == OptimizerKind::kAdamW) return grad_passes + 28;
  if (o == OptimizerKind::kSgdMomentum) return grad_passes + 20;
  return grad_passes + 12;
}

double DeviceProfile::step_update_s_per_elem(OptimizerKind o) const {
  if (o == OptimizerKind::kAdamW) return step_update_s_per_elem_adamw;
  if (o == OptimizerKind::kSgdMomentum) return step_update_s_per_elem_sgd_momentum;
  return step_update_s_per_elem_sgd;
}

const std::vector<UpdatePoint>& DeviceProfile::step_update_points(OptimizerKind o) const {
  if (o == OptimizerKind::kAdamW) return step_update_points_adamw;
  if (o == OptimizerKind::kSgdMomentum) return step_update_points_sgd_momentum;
  return step_update_points_sgd;
}

double DeviceProfile::step_update_tensor_s(OptimizerKind o, int64_t numel) const {
  if (numel <= 0) return 0.0;
  const std::vector<UpdatePoint>& pts = step_update_points(o);
  if (pts.empty()) return static_cast<double>(numel) * step_update_s_per_elem(o);
  if (numel <= pts.front().numel) return pts.front().seconds;
  const UpdatePoint& last = pts.back();
  if (numel >= last.numel) return last.seconds * static_cast<double>(numel) / static_cast<double>(last.numel);
  size_t i = 1;
  while (pts[i].numel < numel) ++i;
  const UpdatePoint &a = pts[i - 1], &b = pts[i];
  const double w = static_cast<double>(numel - a.numel) / static_cast<double>(b.numel - a.numel);
  return a.seconds + w * (b.seconds - a.seconds);
}

double DeviceProfile::model_flops_per_s(Precision p) const {
  if (p == Precision::kBf16) return model_flops_per_s_bf16;
  if (p == Precision::kFp16) return model_flops_per_s_fp16;
  return model_flops_per_s_fp32;
}

double DeviceProfile::flops_per_s(Precision p) const {
  if (const double m = model_flops_per_s(p); m > 0) return m;
  double r = matmul_flops_per_s_fp32;
  if (p == Precision::kBf16) r = matmul_flops_per_s_bf16;
  if (p == Precision::kFp16) r = matmul_flops_per_s_fp16;
  return r * compute_efficiency;
}

bool DeviceProfile::has_measured_points() const {
  return has_collectives && calibration_world_size >= 2 && fits.size() == 3 &&
         std::all_of(fits.begin(), fits.end(), [](const CalibrationFit& f) { return f.points.size() >= 2; });
}

const CollectiveLinks& DeviceProfile::links(K kind) const {
  FSDP_CHECK(has_collectives, ErrorKind::kInvalidArgument, kProfileWhere, "profile '", name,
             "' was calibrated on one rank and has no collective figures: it plans N = 1 only (calibrate under "
             "mpirun -n N, N >= 2, to plan more ranks)");
  if (kind == K::kAllGather) return all_gather;
  if (kind == K::kReduceScatter) return reduce_scatter;
  return all_reduce;
}

std::vector<std::string> builtin_profile_names() { return {"a100", "h100"}; }

DeviceProfile builtin_profile(const std::string& name) {
  FSDP_CHECK(name == "a100" || name == "h100", ErrorKind::kInvalidArgument, kProfileWhere,
             expected_actual("built-in profile", "a100 or h100", "'" + name + "'"));
  return dgx(name);
}

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
      if (!pts.empty()) j["step_update_points_numel_seconds"][kOptimizerKeys[k]] = pts;
    }
  }
  j["memory_copy_bytes_per_s"] = p.memory_copy_bytes_per_s;
  j["comm_overlaps_compute"] = p.comm_overlaps_compute;
  j["compute_oversubscribed"] = p.compute_oversubscribed;
  const CollectiveLinks* links[] = {&p.all_gather, &p.reduce_scatter, &p.all_reduce};
  j["collectives"] = nullptr;  // a one-rank calibration: none measured
  for (int k = 0; k < 3 && p.has_collectives; ++k) {
    j["collectives"][kKinds[k]] = {{"intra_node", link_json(links[k]->intra_node)},
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
      j["calibration"]["fits"][kKinds[k]] = {{"alpha_s", p.fits[k].alpha_s},
                                             {"beta_s_per_byte", p.fits[k].beta_s_per_byte},
                                             {"points_bytes_seconds", pts}};
    }
  }
  return j.dump(2) + "\n";
}

DeviceProfile profile_from_json(const std::string& text) {
  json j;
  try {
    // A key twice in one object: the JSON library keeps the last, which would leave the first's
    // value out of the plan without a word.
    std::vector<std::vector<std::string>> keys;  // the keys seen, per open object
    j = json::parse(text, [&keys](int, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::object_start) keys.emplace_back();
      if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
      if (event == json::parse_event_t::key && !keys.empty()) {
        const std::string k = parsed.get<std::string>();
        FSDP_CHECK(std::find(keys.back().begin(), keys.back().end(), k) == keys.back().end(),
                   ErrorKind::kCorruptData, kProfileWhere, "profile: the key ", shortened(json(k)),
                   " appears twice in one object");
        keys.back().push_back(k);
      }
      return true;
    });
  } catch (const json::exception& e) {
    // nlohmann's text less its "[json.exception.parse_error.101] " tag.
    std::string what = e.what();
    if (!what.empty() && what[0] == '[' && what.find("] ") != std::string::npos) what = what.substr(what.find("] ") + 2);
    throw Error(ErrorKind::kCorruptData, kProfileWhere, str_cat("profile: not JSON: ", what));
  }
  DeviceProfile p;
  FSDP_CHECK(j.is_object(), ErrorKind::kCorruptData, kProfileWhere, "profile: the file must be a JSON object, got ",
             j.type_name());
  only_known_keys(j, "", {"name", "description", "sources", "memory_bytes", "ranks_per_node", "matmul_flops_per_s",
                          "compute_efficiency", "model_flops_per_s", "step_update_s_per_elem",
                          "step_update_points_numel_seconds", "memory_copy_bytes_per_s", "comm_overlaps_compute",
                          "compute_oversubscribed", "collectives", "calibration"});
  p.name = field<std::string>(j, "name", "");
  if (j.contains("description")) p.description = field<std::string>(j, "description", "");
  if (j.contains("sources")) p.sources = field<std::vector<std::string>>(j, "sources", "");
  // Whole bytes; 0: not known (a plan then needs a memory per rank of its own).
  p.memory_bytes = whole_in_range(j, "memory_bytes", "", 0, kMaxBytes, "[0, 2^60] (bytes; 0: not known)");
  p.ranks_per_node = whole_in_range(j, "ranks_per_node", "", 1, kMaxRanks, "[1, 2^20]");
  const json& f = field<json>(j, "matmul_flops_per_s", "");
  only_known_keys(f, "matmul_flops_per_s", {"fp32", "bf16", "fp16"});
  p.matmul_flops_per_s_fp32 = in_range(f, "fp32", "matmul_flops_per_s", 1.0, kMaxRate);
  p.matmul_flops_per_s_bf16 = in_range(f, "bf16", "matmul_flops_per_s", 1.0, kMaxRate);
  p.matmul_flops_per_s_fp16 = f.contains("fp16") ? rate(f, "fp16", "matmul_flops_per_s") : 0.0;
  // The same range as fsdp-plan's --compute-efficiency.
  p.compute_efficiency =
      j.contains("compute_efficiency") ? in_range(j, "compute_efficiency", "", kMinComputeEfficiency, 1.0) : 1.0;
  if (j.contains("model_flops_per_s")) {
    const json& mf = field<json>(j, "model_flops_per_s", "");
    only_known_keys(mf, "model_flops_per_s", {"fp32", "bf16", "fp16"});
    p.model_flops_per_s_fp32 = rate(mf, "fp32", "model_flops_per_s");
    p.model_flops_per_s_bf16 = rate(mf, "bf16", "model_flops_per_s");
    p.model_flops_per_s_fp16 = rate(mf, "fp16", "model_flops_per_s");
  }
  const json& u = field<json>(j, "step_update_s_per_elem", "");
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
  FSDP_CHECK(j.contains("memory_copy_bytes_per_s"), ErrorKind::kCorruptData, kProfileWhere,
             "profile: no field 'memory_copy_bytes_per_s' (a profile calibrated before the copy rate was "
             "measured: calibrate again)");
  p.memory_copy_bytes_per_s = in_range(j, "memory_copy_bytes_per_s", "", 1.0, kMaxRate);
  p.comm_overlaps_compute = field<bool>(j, "comm_overlaps_compute", "");
  // Absent in profiles written before it was recorded: false.
  if (j.contains("compute_oversubscribed")) p.compute_oversubscribed = field<bool>(j, "compute_oversubscribed", "");
  FSDP_CHECK(!(p.compute_oversubscribed && p.comm_overlaps_compute), ErrorKind::kCorruptData, kProfileWhere,
             "profile: compute_oversubscribed true needs comm_overlaps_compute false (compute that needs more "
             "cores than the node has leaves none to communication)");
  const json& c = field<json>(j, "collectives", "");  // null: a one-rank calibration
  p.has_collectives = !c.is_null();
  only_known_keys(c, "collectives", {"all_gather", "reduce_scatter", "all_reduce"});
  CollectiveLinks* links[] = {&p.all_gather, &p.reduce_scatter, &p.all_reduce};
  for (int k = 0; k < 3 && p.has_collectives; ++k) {
    const std::string where = std::string("collectives.") + kKinds[k];
    const json& e = field<json>(c, kKinds[k], "collectives");
    only_known_keys(e, where, {"intra_node", "inter_node", "shared_core_factor", "duration_factor"});
    links[k]->intra_node = link_from(field<json>(e, "intra_node", where), where + ".intra_node");
    links[k]->inter_node = link_from(field<json>(e, "inter_node", where), where + ".inter_node");
    // Absent in profiles written before it was measured: 1 (a collective costs its time alone).
    if (e.contains("shared_core_factor")) {
      // One range per regime, named whole in the message.
      const double f = field<double>(e, "shared_core_factor", where);
      const double lo = p.compute_oversubscribed ? kMinOversubscribedFactor : 1.0;
      FSDP_CHECK(f >= lo && f <= kMaxSharedCoreFactor, ErrorKind::kCorruptData, kProfileWhere, "profile: ", where,
                 ".shared_core_factor must be in [", lo, ", ", kMaxSharedCoreFactor, "] ",
                 p.compute_oversubscribed ? "where compute oversubscribes the cores"
                                          : "(a collective costs a step at least its time alone where it shares the "
                                            "cores and compute fits them; below 1 only with compute_oversubscribed true)",
                 ", got ", shortened(e.at("shared_core_factor")));
      links[k]->shared_core_factor = f;
    }
    if (e.contains("duration_factor")) {  // absent in profiles written before it was measured: 1
      const double d = field<double>(e, "duration_factor", where);
      FSDP_CHECK(d >= 1.0 && d <= kMaxSharedCoreFactor, ErrorKind::kCorruptData, kProfileWhere, "profile: ", where,
                 ".duration_factor must be in [1, ", kMaxSharedCoreFactor,
                 "] (beside compute a collective runs no faster than alone), got ", shortened(e.at("duration_factor")));
      links[k]->duration_factor = d;
    }
  }
  if (j.contains("calibration")) {
    const json& cal = field<json>(j, "calibration", "");
    only_known_keys(cal, "calibration", {"world_size", "model", "model_params", "micro_batch_size", "seq_len", "fits"});
    p.calibration_world_size = whole_in_range(cal, "world_size", "calibration", 1, kMaxRanks, "[1, 2^20]");
    // Absent in profiles written before the calibrated setup was recorded: all four or none.
    const int setup_keys = static_cast<int>(cal.contains("model")) + static_cast<int>(cal.contains("model_params")) +
                           static_cast<int>(cal.contains("micro_batch_size")) + static_cast<int>(cal.contains("seq_len"));
    FSDP_CHECK(setup_keys == 0 || setup_keys == 4, ErrorKind::kCorruptData, kProfileWhere,
               "profile: calibration.model, .model_params, .micro_batch_size and .seq_len are all four or none, got ",
               setup_keys);
    if (setup_keys == 4) {
      p.calibration_model = field<std::string>(cal, "model", "calibration");
      FSDP_CHECK(!p.calibration_model.empty(), ErrorKind::kCorruptData, kProfileWhere,
                 "profile: calibration.model must name the calibrated model, got \"\"");
      p.calibration_model_params = whole_in_range(cal, "model_params", "calibration", 1, kMaxNumel, "[1, 2^50]");
      p.calibration_micro_batch_size =
          whole_in_range(cal, "micro_batch_size", "calibration", 1, kMaxNumel, "[1, 2^50]");
      p.calibration_seq_len = whole_in_range(cal, "seq_len", "calibration", 1, kMaxNumel, "[1, 2^50]");
    }
    // A one-rank calibration measures no collective: it has no fits.
    FSDP_CHECK(p.has_collectives || !cal.contains("fits"), ErrorKind::kCorruptData, kProfileWhere,
               "profile: calibration.fits is for a calibration of 2 or more ranks (\"collectives\" is null here)");
    if (p.has_collectives) {
      const json& fits = field<json>(cal, "fits", "calibration");
      only_known_keys(fits, "calibration.fits", {"all_gather", "reduce_scatter", "all_reduce"});
      for (const char* kind : kKinds) {
        const std::string where = std::string("calibration.fits.") + kind;
        const json& e = field<json>(fits, kind, "calibration.fits");
        only_known_keys(e, where, {"alpha_s", "beta_s_per_byte", "points_bytes_seconds"});
        CalibrationFit fit;
        fit.alpha_s = non_negative(e, "alpha_s", where, kMaxSeconds);
        fit.beta_s_per_byte = non_negative(e, "beta_s_per_byte", where, kMaxSeconds);
        fit.points = calibration_points_from(e, where);
        p.fits.push_back(fit);
      }
    }
  }
  FSDP_CHECK(p.has_collectives || p.calibration_world_size == 1, ErrorKind::kCorruptData, kProfileWhere,
             "profile: \"collectives\": null is for a one-rank calibration (calibration.world_size 1)");
  return p;
}

DeviceProfile load_profile(const std::string& name_or_path) {
  const auto names = builtin_profile_names();
  if (std::find(names.begin(), names.end(), name_or_path) != names.end()) return builtin_profile(name_or_path);
  std::ifstream in(name_or_path);
  FSDP_CHECK(in.good(), ErrorKind::kIo, kProfileWhere, "cannot read profile '", name_or_path,
             "' (neither a file nor a built-in profile: a100, h100)");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return profile_from_json(ss.str());
  } catch (const Error& e) {
    throw Error(e.kind(), e.where(), name_or_path + ": " + e.message());
  }
}

CalibrationFit fit_alpha_beta(const std::vector<CalibrationPoint>& points) {
  FSDP_CHECK(points.size() >= 2, ErrorKind::kInvalidArgument, kProfileWhere,
             expected_actual("calibration points", ">= 2", points.size()));
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(points.size());
  for (const auto& p : points) {
    const double x = static_cast<double>(p.logical_bytes);
    sx += x;
    sy += p.seconds;
    sxx += x * x;
    sxy += x * p.seconds;
  }
  CalibrationFit f;
  f.points = points;
  const double den = n * sxx - sx * sx;
  f.beta_s_per_byte = den > 0 ? std::max(0.0, (n * sxy - sx * sy) / den) : 0.0;
  f.alpha_s = std::max(0.0, (sy - f.beta_s_per_byte * sx) / n);
  return f;
}

LinkProfile link_from_fit(K kind, const CalibrationFit& fit, int64_t n) {
  FSDP_CHECK(n >= 2, ErrorKind::kInvalidArgument, kProfileWhere, expected_actual("calibration world size", ">= 2", n));
  const double steps = ring_steps(kind, n);
  const double share = steps / static_cast<double>(n);  // wire bytes per logical byte
  LinkProfile l;
  l.alpha_s = fit.alpha_s / steps;
  l.bandwidth_bytes_per_s = fit.beta_s_per_byte > 0 ? share / fit.beta_s_per_byte : 1e18;
  return l;
}

}  // namespace fsdp::planner
