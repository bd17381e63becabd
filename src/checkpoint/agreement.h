// Error agreement across the ranks of a group (internal to the checkpoint subsystem).
//
// [Note: error agreement] Every phase that can fail locally (I/O, validation) runs inside
// Agreement::run: one all-reduce of "who failed", then, only on failure, an all-gather of the
// failing ranks' errors (kind and message). Every rank then throws fsdp::Error: a failing rank its
// own error, with its rank and the phase filled in where the thrower did not know them; the others
// an error of the same kind saying "failed on rank R during <phase>: <R's message>", where R is the
// highest failing rank. So a local failure never leaves the other ranks blocked in the next
// collective, every rank's message names the rank where the failure happened, and a load writes
// nothing unless every rank has read and verified everything it needs.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <new>
#include <optional>
#include <string>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"

namespace fsdp::checkpoint {

class Agreement {
 public:
  /// op: what every error names, e.g. "load_sharded '<path>'". g must outlive the agreement.
  Agreement(comm::ProcessGroup& g, std::string op) : g_(g), op_(std::move(op)) {}

  /// Runs fn on this rank, then agrees with every rank of g whether any failed (collective and
  /// blocking: every rank calls run with the same phases in the same order). Returns when no rank
  /// failed; otherwise throws fsdp::Error on every rank (see the note above). Exceptions other than
  /// fsdp::Error become one: std::filesystem errors kIo, std::bad_alloc kOutOfMemory, the others
  /// kInvalidArgument.
  template <typename Fn>
  void run(const char* phase, Fn&& fn) {
    std::optional<Error> mine;
    try {
      fn();
    } catch (const Error& e) {
      mine = placed(e, phase);
    } catch (const std::filesystem::filesystem_error& e) {
      mine = Error(ErrorKind::kIo, in_phase(phase), e.what());
    } catch (const std::bad_alloc& e) {
      mine = Error(ErrorKind::kOutOfMemory, in_phase(phase), e.what());
    } catch (const std::exception& e) {
      const std::string what = e.what();
      mine = Error(ErrorKind::kInvalidArgument, in_phase(phase), what.empty() ? "unknown error" : what);
    } catch (...) {
      mine = Error(ErrorKind::kInvalidArgument, in_phase(phase), "unknown non-standard exception");
    }
    settle(phase, mine);
  }

  /// {this rank, "", "<op> (<phase>)"}.
  ErrorContext in_phase(const char* phase) const;

  /// Every rank read the same contents: `fingerprint` (a hash of what this rank read) is
  /// all-gathered and compared with rank 0's, in the phase "comparing the ranks' files"; ranks
  /// that differ are named (kInvalidArgument: the same path holds other contents there, as on
  /// hosts with disks of their own). Collective and blocking, as run.
  void check_same_contents(uint64_t fingerprint);

 private:
  /// e with this rank and the phase, when its thrower did not know the rank (its own op, if any,
  /// starts the message).
  Error placed(const Error& e, const char* phase) const;
  /// The collective part of run: returns when mine is empty on every rank, else throws.
  void settle(const char* phase, const std::optional<Error>& mine);

  comm::ProcessGroup& g_;
  std::string op_;
};

}  // namespace fsdp::checkpoint
