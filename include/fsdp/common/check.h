// Errors of fsdp-cpp: one exception type, fsdp::Error, that says what kind of failure it is and
// where it happened (rank, FSDP unit, operation), with expected vs actual in its message. Library
// code throws; only the apps exit.
#pragma once

#include <sstream>
#include <stdexcept>
#include <exception>
#include <string>
#include <vector>

namespace fsdp {

/// What went wrong, for callers that react differently to, say, a timeout and a bad argument.
enum class ErrorKind {
  kInvalidArgument,  ///< bad input to a call: shapes, dtypes, options, values out of range
  kMismatch,         ///< ranks disagree: different parameters, options or collectives
  kState,            ///< a call out of order (an illegal state-machine transition)
  kCollective,       ///< a collective failed in its backend (an MPI error code)
  kTimeout,          ///< a collective did not complete within the group's timeout
  kOutOfMemory,      ///< a memory budget refused an allocation
  kCorruptData,      ///< input read from disk is not what it claims (checkpoint, import file)
  kIo,               ///< the file system refused an operation (open, write, rename, fsync)
  kUnsupported,      ///< a valid request this build does not implement (rejected, never downgraded)
  kStepAbandoned,    ///< another rank's step failed: this rank's collectives of that step are not run
};
/// "invalid argument", "mismatch across ranks", "illegal call order", "collective failed",
/// "timeout", "out of memory", "corrupt data", "I/O error", "unsupported", "step abandoned".
const char* to_string(ErrorKind kind);

/// Where an error happened. rank: this process's rank in the group of the failing operation (-1
/// when there is none); unit: the FSDP unit's name ("" when none); op: the operation, e.g.
/// "all_gather_into_tensor", "fully_shard", "load_sharded" ("" when none).
struct ErrorContext {
  int rank = -1;
  std::string unit;
  std::string op;
};

/// Thrown for every fsdp-cpp failure. what() is
///   "[fsdp rank R] unit 'U' OP: MESSAGE"
/// with the parts that are unknown left out ("[fsdp] OP: MESSAGE" without a rank). The message gives
/// expected vs actual where there is one (see expected_actual()).
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, ErrorContext where, const std::string& message);
  ErrorKind kind() const { return kind_; }
  const ErrorContext& where() const { return where_; }
  /// The message without the "[fsdp rank R] unit 'U' OP: " prefix.
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_;
  ErrorContext where_;
  std::string message_;
};

/// "[fsdp rank R] unit 'U' OP: " for `where` (the prefix of Error::what()).
std::string error_prefix(const ErrorContext& where);

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

namespace detail {
template <typename... Args>
Error make_error(ErrorKind kind, ErrorContext where, const Args&... args) {
  return Error(kind, std::move(where), str_cat(args...));
}
}  // namespace detail

/// An exception's message for a one-line error: a c10::Error's without the C++ backtrace libtorch
/// appends to its what() (c10d's store and libtorch's ops throw them), any other's what().
std::string message_of(const std::exception& e);

/// The first `shown` items joined with ", ", then " and K more" for the rest (lists in errors).
std::string join_first(const std::vector<std::string>& items, size_t shown = 6);

/// "WHAT: expected E, got A".
template <typename E, typename A>
std::string expected_actual(const std::string& what, const E& expected, const A& actual) {
  return str_cat(what, ": expected ", expected, ", got ", actual);
}

}  // namespace fsdp

/// Throws fsdp::Error(kind, where, message) when cond is false; the message is the remaining
/// arguments joined with operator<<:
///   FSDP_CHECK(n == m, ErrorKind::kInvalidArgument, unit.where("unshard"),
///              expected_actual("all-gather output numel", m, n));
#define FSDP_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      throw ::fsdp::detail::make_error(__VA_ARGS__);                                   \
    }                                                                                  \
  } while (0)
