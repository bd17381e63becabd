// fsdp-plan's terminal output: the inputs, the bytes-per-parameter split, a memory table and a
// traffic/time table per strategy, and the recommendation with its reason.
#pragma once

#include <string>

#include "fsdp/planner/plan.h"

namespace apps::plan {

/// The tables of `plan`, ready to print (ends with a newline). `compute_efficiency_given`: the
/// user's --compute-efficiency set the profile's efficiency (the header's compute line says so).
std::string format_plan(const fsdp::planner::Plan& plan, bool compute_efficiency_given = false);

}  // namespace apps::plan
