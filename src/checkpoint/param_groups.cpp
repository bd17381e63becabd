#include "param_groups.h"

#include <algorithm>
#include <iterator>
#include <unordered_map>

namespace fsdp::checkpoint {

namespace {

GroupMembers sorted_set(GroupMembers m) {
  std::sort(m.begin(), m.end());
  m.erase(std::unique(m.begin(), m.end()), m.end());
  return m;
}

// "0 {a, b, ... (9 parameters)}, 1 {...}"
std::string describe_groups(const std::vector<GroupMembers>& groups) {
  std::string s;
  for (size_t g = 0; g < groups.size(); ++g) {
    s += str_cat(g ? ", " : "", g, " ", describe_members(groups[g]));
  }
  return groups.empty() ? "none" : s;
}

// The names of `a` missing from `b` (both sorted sets), at most `shown` of them, "a, b, ...".
std::string some_missing(const GroupMembers& a, const GroupMembers& b, size_t shown = 3) {
  GroupMembers d;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(d));
  std::string s;
  for (size_t i = 0; i < d.size() && i < shown; ++i) s += (i ? ", " : "") + d[i];
  if (d.size() > shown) s += str_cat(", ... (", d.size(), ")");
  return s;
}

}  // namespace

std::string describe_members(const GroupMembers& members, size_t shown) {
  std::string s = "{";
  for (size_t i = 0; i < members.size() && i < shown; ++i) s += (i ? ", " : "") + members[i];
  if (members.size() > shown) s += ", ...";
  return s + str_cat("} (", members.size(), members.size() == 1 ? " parameter)" : " parameters)");
}

std::optional<std::vector<GroupMembers>> group_members(const torch::optim::Optimizer& optimizer,
                                                       const std::vector<ParamView>& views,
                                                       std::string* stray) {
  std::unordered_map<const void*, const std::string*> name_of;
  for (const auto& v : views) name_of.emplace(v.tensor.unsafeGetTensorImpl(), &v.name);
  std::vector<GroupMembers> out;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    GroupMembers members;
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = name_of.find(params[i].unsafeGetTensorImpl());
      if (it == name_of.end()) {
        if (stray) {
          *stray = str_cat("param group ", g, " holds a tensor of shape ", params[i].sizes(),
                           " (its parameter ", i, ") that is not a sharded parameter of the model");
        }
        return std::nullopt;
      }
      members.push_back(*it->second);
    }
    out.push_back(std::move(members));
  }
  return out;
}

std::vector<size_t> match_groups(const std::vector<GroupMembers>& saved,
                                 const std::vector<GroupMembers>& current, const std::string& source,
                                 const ErrorContext& where) {
  FSDP_CHECK(saved.size() == current.size(), ErrorKind::kInvalidArgument, where,
             "the optimizer's param groups do not match those of ", source,
             " (groups are matched by their members): ",
             expected_actual("param groups", str_cat(saved.size(), " as in ", source, ": ",
                                                     describe_groups(saved)),
                             str_cat(current.size(), ": ", describe_groups(current))));
  std::vector<GroupMembers> saved_sets, current_sets;
  for (const auto& g : saved) saved_sets.push_back(sorted_set(g));
  for (const auto& g : current) current_sets.push_back(sorted_set(g));
  std::vector<size_t> match(current.size());
  std::vector<bool> used(saved.size(), false);
  for (size_t c = 0; c < current.size(); ++c) {
    size_t found = saved.size(), closest = 0, best_overlap = 0;
    for (size_t s = 0; s < saved.size(); ++s) {
      if (!used[s] && saved_sets[s] == current_sets[c]) {
        found = s;
        break;
      }
      GroupMembers common;
      std::set_intersection(saved_sets[s].begin(), saved_sets[s].end(), current_sets[c].begin(),
                            current_sets[c].end(), std::back_inserter(common));
      if (common.size() > best_overlap) best_overlap = common.size(), closest = s;
    }
    if (found == saved.size()) {
      std::string hint;
      if (best_overlap > 0) {
        const std::string lacks = some_missing(current_sets[c], saved_sets[closest]);
        const std::string extra = some_missing(saved_sets[closest], current_sets[c]);
        hint = str_cat("; closest: group ", closest, " of ", source, " (", best_overlap,
                       " members in common)", lacks.empty() ? "" : ", which lacks " + lacks,
                       extra.empty() ? "" : (lacks.empty() ? ", which" : " and") + (" also holds " + extra));
      }
      throw Error(ErrorKind::kInvalidArgument, where,
                  str_cat("the optimizer's param groups do not match those of ", source,
                          " (groups are matched by their members): ",
                          expected_actual(str_cat("members of the optimizer's param group ", c),
                                          str_cat("those of a group of ", source, ": ",
                                                  describe_groups(saved)),
                                          describe_members(current[c])),
                          hint));
    }
    used[found] = true;
    match[c] = found;
  }
  return match;
}

}  // namespace fsdp::checkpoint
