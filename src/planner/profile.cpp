// A device profile's queries: the rate, step-update time and links the time model asks for.
#include "fsdp/planner/profile.h"

#include <algorithm>

#include "fsdp/common/check.h"
#include "profile_file.h"

namespace fsdp::planner {

using K = fsdp::comm::CollectiveKind;

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

double DeviceProfile::peak_flops_per_s(Precision p) const {
  if (p == Precision::kBf16) return matmul_flops_per_s_bf16;
  if (p == Precision::kFp16) return matmul_flops_per_s_fp16;
  return matmul_flops_per_s_fp32;
}

double EfficiencyCurve::at(int64_t n_embd) const {
  if (points.empty()) return 0.0;
  if (points.size() == 1 || n_embd <= points.front().n_embd) return points.front().efficiency;
  if (n_embd >= points.back().n_embd) return points.back().efficiency;
  size_t i = 1;
  while (points[i].n_embd < n_embd) ++i;
  const EfficiencyPoint &a = points[i - 1], &b = points[i];
  // 1/E = alpha + beta / C through both points (the form in the struct's comment).
  const double xa = 1.0 / static_cast<double>(a.n_embd), xb = 1.0 / static_cast<double>(b.n_embd);
  const double x = 1.0 / static_cast<double>(n_embd);
  const double w = (x - xa) / (xb - xa);
  return 1.0 / ((1.0 - w) / a.efficiency + w / b.efficiency);
}

std::string EfficiencyCurve::problem() const {
  for (size_t i = 0; i < points.size(); ++i) {
    const EfficiencyPoint& q = points[i];
    const std::string at = "[" + std::to_string(i) + "]: ";
    if (!(q.efficiency >= kMinComputeEfficiency && q.efficiency <= 1.0)) {
      return str_cat(at, "an efficiency must be in [", kMinComputeEfficiency, ", 1], got ", q.efficiency);
    }
    if (q.n_embd == 0 && points.size() > 1) {
      return str_cat(at, "a figure for every width (n_embd 0) must be the only one; got ", points.size(), " points");
    }
    if (q.n_embd < 0 || (i > 0 && q.n_embd <= points[i - 1].n_embd)) {
      return str_cat(at, "widths (n_embd) must be positive and strictly ascending; got ", q.n_embd,
                     i > 0 ? " after " + std::to_string(points[i - 1].n_embd) : std::string());
    }
  }
  return {};
}

void EfficiencyCurve::validate(const std::string& what) const {
  const std::string p = problem();
  FSDP_CHECK(p.empty(), ErrorKind::kInvalidArgument, profile_file::kWhere, what, p);
}

const EfficiencyCurve& DeviceProfile::achieved_efficiency(Precision p) const {
  if (p == Precision::kBf16) return achieved_efficiency_bf16;
  if (p == Precision::kFp16) return achieved_efficiency_fp16;
  return achieved_efficiency_fp32;
}

bool DeviceProfile::has_achieved_efficiency() const {
  return !achieved_efficiency_fp32.empty() || !achieved_efficiency_bf16.empty() || !achieved_efficiency_fp16.empty();
}

void DeviceProfile::clear_achieved_efficiency() {
  achieved_efficiency_fp32 = achieved_efficiency_bf16 = achieved_efficiency_fp16 = EfficiencyCurve{};
}

double DeviceProfile::efficiency(Precision p, int64_t n_embd) const {
  const EfficiencyCurve& c = achieved_efficiency(p);
  if (c.empty()) return compute_efficiency;
  c.validate("achieved_efficiency." + to_string(p));  // a profile built in code is not read through a file's checks
  return c.at(n_embd);
}

double DeviceProfile::flops_per_s(Precision p, int64_t n_embd) const {
  if (const double m = model_flops_per_s(p); m > 0) return m;
  return peak_flops_per_s(p) * efficiency(p, n_embd);
}

bool DeviceProfile::has_measured_points() const {
  return has_collectives && calibration_world_size >= 2 && fits.size() == 3 &&
         std::all_of(fits.begin(), fits.end(), [](const CalibrationFit& f) { return f.points.size() >= 2; });
}

const CollectiveLinks& DeviceProfile::links(K kind) const {
  FSDP_CHECK(has_collectives, ErrorKind::kInvalidArgument, profile_file::kWhere, "profile '", name,
             "' was calibrated on one rank and has no collective figures: it plans N = 1 only (calibrate under "
             "mpirun -n N, N >= 2, to plan more ranks)");
  if (kind == K::kAllGather) return all_gather;
  if (kind == K::kReduceScatter) return reduce_scatter;
  return all_reduce;
}

}  // namespace fsdp::planner
