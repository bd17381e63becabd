// fsdp-plan's terminal output: the inputs, the bytes-per-parameter split, a memory table and a
// traffic/time table per strategy, and the recommendation with its reason.
#pragma once

#include <cstddef>
#include <string>

#include "fsdp/planner/plan.h"

namespace apps::plan {

/// Which of the inputs the user gave: where a default decided, the report says so.
struct GivenInputs {
  bool compute_efficiency = false;  ///< --compute-efficiency set the profile's efficiency
  bool profile = true;              ///< --profile (false: the built-in default)
  bool ranks_per_node = true;       ///< --ranks-per-node (false: the profile's node size)
};

/// The tables of `plan`, ready to print (ends with a newline), no line wider than 100 columns
/// (prose wrapped with a hanging indent; each table at most 100 columns on the presets).
std::string format_plan(const fsdp::planner::Plan& plan, const GivenInputs& given = {});

/// `text` with every line longer than `width` broken at spaces, continuation lines indented two
/// more than the line's own indent. A word longer than the width stays whole, and so does a table
/// row (a line with two blanks in a row after its indent).
std::string wrap_lines(const std::string& text, size_t width = 100);

}  // namespace apps::plan
