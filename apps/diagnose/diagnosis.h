// fsdp-diagnose: reads the flight-recorder dumps of a job's ranks (DIR/rank-RRRRR.json, written on
// a collective timeout or error) and says in one paragraph who is where.
#pragma once

#include <string>
#include <vector>

namespace apps::diagnose {

/// One collective of one rank's dump.
struct Entry {
  std::string group, kind, dtype, unit, phase, state, error;
  long long seq = 0, numel = 0, bytes = 0;
};

/// One rank's dump.
struct Dump {
  int rank = -1;
  int world_size = 0;
  std::string reason;
  std::vector<Entry> records;
  double process_started_unix_s = 0;  ///< when the writing process started (0: not in the dump)
  double written_unix_s = 0;          ///< when it wrote the dump (0: not in the dump)
};

/// Reads the rank-*.json of dir written by the newest job (sorted by rank): a dump written before
/// the newest dump's process started (kStaleSlack_s allowed for hosts' clocks) comes from an
/// earlier job that used the same directory and is left out. Unreadable files and left-out dumps
/// are reported in *problems (one line each). Throws std::runtime_error when dir does not exist.
/// Seconds a dump may predate the newest dump's process start and still count as the same job:
/// hosts' clocks differ by about this much at most.
constexpr double kStaleSlack_s = 5.0;

std::vector<Dump> read_dumps(const std::string& dir, std::vector<std::string>* problems);

/// The paragraph: which ranks wait in which collective (number, kind, unit, phase, group), which
/// ranks left no dump and where the others last met them, and disagreements the ranks reported.
/// world_size 0: taken from the dumps.
std::string diagnose(const std::vector<Dump>& dumps, int world_size = 0);

}  // namespace apps::diagnose
