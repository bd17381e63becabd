#include "consistency.h"

#include <algorithm>

namespace fsdp::detail {
namespace {

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t e = s.find('\n', pos);
    out.push_back(s.substr(pos, e - pos));
    pos = e == std::string::npos ? s.size() : e + 1;
  }
  return out;
}

}  // namespace

void check_same_on_every_rank(comm::ProcessGroup& group, const ErrorContext& where,
                              const std::vector<std::string>& lines, const std::string& remedy) {
  std::string mine;
  for (const auto& l : lines) mine += l + "\n";
  const std::vector<std::string> all = comm::all_gather_strings(group, mine, comm::OpTag{where.unit, where.op});
  for (int r = 0; r < group.size(); ++r) {
    if (all[r] == mine) continue;
    const auto theirs = split_lines(all[r]);
    const size_t n = std::max(lines.size(), theirs.size());
    for (size_t i = 0; i < n; ++i) {
      const std::string a = i < lines.size() ? lines[i] : "(none)";
      const std::string b = i < theirs.size() ? theirs[i] : "(none)";
      FSDP_CHECK(a == b, ErrorKind::kMismatch, where, "ranks disagree: this rank has '", a,
                 "' but rank ", r, " has '", b, "' (entry ", i, "); ", remedy);
    }
  }
}

}  // namespace fsdp::detail
