// A calibration's measured points turned into a line (alpha + beta x bytes) and a ring link.
#include <algorithm>

#include "fsdp/common/check.h"
#include "fsdp/planner/profile.h"
#include "fsdp/planner/traffic.h"
#include "profile_file.h"

namespace fsdp::planner {

CalibrationFit fit_alpha_beta(const std::vector<CalibrationPoint>& points) {
  FSDP_CHECK(points.size() >= 2, ErrorKind::kInvalidArgument, profile_file::kWhere,
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

LinkProfile link_from_fit(fsdp::comm::CollectiveKind kind, const CalibrationFit& fit, int64_t n) {
  FSDP_CHECK(n >= 2, ErrorKind::kInvalidArgument, profile_file::kWhere, expected_actual("calibration world size", ">= 2", n));
  const double steps = ring_steps(kind, n);
  const double share = steps / static_cast<double>(n);  // wire bytes per logical byte
  LinkProfile l;
  l.alpha_s = fit.alpha_s / steps;
  l.bandwidth_bytes_per_s = fit.beta_s_per_byte > 0 ? share / fit.beta_s_per_byte : 1e18;
  return l;
}

}  // namespace fsdp::planner
