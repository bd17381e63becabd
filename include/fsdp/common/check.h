// Error checks for fsdp-cpp: every failure names the rank, the FSDP unit (when there is one), the
// operation, and expected vs actual. Library code throws; only the apps exit.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace fsdp {

/// Thrown for every fsdp-cpp error (bad input, inconsistent setup across ranks, failed collective).
/// what() starts with "[fsdp rank R]" when the rank is known.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

/// Joins all arguments with operator<< into one string.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

}  // namespace fsdp

/// Throws fsdp::Error with the joined message when cond is false. Callers put the rank, unit, op and
/// expected-vs-actual in the message: FSDP_CHECK(a == b, "[fsdp rank ", r, "] unit ", u, ": ...").
#define FSDP_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      throw ::fsdp::Error(::fsdp::str_cat(__VA_ARGS__));                               \
    }                                                                                  \
  } while (0)
