#include "diagnose/diagnosis.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace apps::diagnose {
namespace {

namespace fs = std::filesystem;

std::string ranks_text(const std::vector<int>& rs) {
  std::ostringstream os;
  os << (rs.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < rs.size(); ++i) {
    if (i) os << (i + 1 == rs.size() ? " and " : ", ");
    os << rs[i];
  }
  return os.str();
}

std::string describe(const Entry& e) {
  std::ostringstream os;
  os << "#" << e.seq << " (" << e.kind;
  if (!e.unit.empty()) os << ", unit " << e.unit;
  if (!e.phase.empty()) os << ", " << e.phase;
  if (e.group != "world") os << ", group " << e.group;
  os << ")";
  return os.str();
}

// Where a rank waits: the collective that timed out, else the one running, else the oldest
// queued.
const Entry* waiting_in(const Dump& d) {
  const Entry* best = nullptr;
  auto rank_of = [](const std::string& s) { return s == "timed out" ? 3 : s == "running" ? 2 : s == "queued" ? 1 : 0; };
  for (const auto& e : d.records) {
    const int r = rank_of(e.state);
    if (r == 0) continue;
    if (!best || r > rank_of(best->state)) best = &e;
  }
  return best;
}

const Entry* last_completed(const Dump& d, const std::string& group) {
  const Entry* best = nullptr;
  for (const auto& e : d.records) {
    if (e.group == group && e.state == "completed" && (!best || e.seq > best->seq)) best = &e;
  }
  return best;
}

}  // namespace

std::vector<Dump> read_dumps(const std::string& dir, std::vector<std::string>* problems) {
  if (!fs::is_directory(dir)) throw std::runtime_error("'" + dir + "' is not a directory of flight-recorder dumps");
  std::vector<Dump> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("rank-", 0) != 0 || f.path().extension() != ".json") continue;
    try {
      std::ifstream in(f.path());
      nlohmann::json j = nlohmann::json::parse(in);
      Dump d;
      d.rank = j.at("rank").get<int>();
      d.world_size = j.value("world_size", 0);
      d.reason = j.value("reason", "");
      d.process_started_unix_s = j.value("process_started_unix_s", 0.0);
      d.written_unix_s = j.value("written_unix_s", 0.0);
      for (const auto& r : j.at("records")) {
        Entry e;
        e.group = r.value("group", "world");
        e.kind = r.value("kind", "");
        e.dtype = r.value("dtype", "");
        e.unit = r.value("unit", "");
        e.phase = r.value("phase", "");
        e.state = r.value("state", "");
        e.error = r.value("error", "");
        e.seq = r.value("seq", 0LL);
        e.numel = r.value("numel", 0LL);
        e.bytes = r.value("bytes", 0LL);
        d.records.push_back(std::move(e));
      }
      out.push_back(std::move(d));
    } catch (const std::exception& e) {
      if (problems) problems->push_back(name + ": not a flight-recorder dump (" + e.what() + ")");
    }
  }
  // [Note: stale dumps] A directory outlives a job (the default is beside --metrics, or
  // ./flight-recorder): an earlier job's dump of a rank that this job's ranks did not overwrite
  // would place that rank where it was then. Every dump of one job is written after all of that
  // job's processes started, an earlier job's before.
  const Dump* newest = nullptr;
  for (const auto& d : out) {
    if (!newest || d.written_unix_s > newest->written_unix_s) newest = &d;
  }
  if (newest && newest->process_started_unix_s > 0) {
    const double since = newest->process_started_unix_s - kStaleSlack_s;
    std::vector<Dump> current;
    for (auto& d : out) {
      if (d.written_unix_s > 0 && d.written_unix_s < since) {
        if (problems) {
          const auto before_s = static_cast<long long>(since + kStaleSlack_s - d.written_unix_s);
          problems->push_back("rank " + std::to_string(d.rank) + "'s dump: from an earlier job (written " +
                              std::to_string(before_s) + " s before the newest job's rank " +
                              std::to_string(newest->rank) + " started), left out");
        }
      } else {
        current.push_back(std::move(d));
      }
    }
    out = std::move(current);
  }
  std::sort(out.begin(), out.end(), [](const Dump& a, const Dump& b) { return a.rank < b.rank; });
  return out;
}

std::string diagnose(const std::vector<Dump>& dumps, int world_size) {
  if (dumps.empty()) return "No flight-recorder dumps: no rank recorded a collective timeout or error.";
  if (world_size <= 0) {
    for (const auto& d : dumps) world_size = std::max(world_size, d.world_size);
  }
  std::ostringstream os;
  // A disagreement the ranks detected themselves (the collective check): every rank reports the
  // same verdict, so the newest one of any dump is enough.
  const Entry* mismatch = nullptr;
  for (const auto& d : dumps) {
    for (const auto& e : d.records) {
      if (e.state == "failed" && e.error.find("ranks disagree") != std::string::npos &&
          (!mismatch || e.seq > mismatch->seq)) {
        mismatch = &e;
      }
    }
  }
  if (mismatch) {
    std::string verdict = mismatch->error.substr(mismatch->error.find("ranks disagree"));
    while (!verdict.empty() && (verdict.back() == ' ' || verdict.back() == '.')) verdict.pop_back();
    os << "The ranks disagreed at " << describe(*mismatch) << ": " << verdict << ". ";
  }
  {
    // Who waits where.
    std::map<std::string, std::vector<int>> waiting;  // description -> ranks
    std::map<std::string, const Entry*> waiting_entry;
    std::vector<int> idle;
    std::set<int> present;
    std::vector<std::string> suspended;  // ranks whose own timeout came from being suspended
    for (const auto& d : dumps) {
      present.insert(d.rank);
      const Entry* w = waiting_in(d);
      if (w && w->error.find("was suspended ") != std::string::npos) {
        const auto at = w->error.find("suspended for ");
        std::ostringstream line;
        line << "rank " << d.rank << " was suspended";
        if (at != std::string::npos) {
          line << " for " << std::fixed << std::setprecision(1) << std::strtod(w->error.c_str() + at + 14, nullptr)
               << " s";
        }
        line << " while in " << describe(*w) << " (stopped, swapped out or descheduled): the others waited for it";
        suspended.push_back(line.str());
        continue;
      }
      if (const Entry* e = w) {
        // A rank still inside a collective that its peers have completed fell behind there: the
        // data moved, then it stopped (SIGSTOP, swapped out) before finishing; it wrote its dump
        // only when the job's end woke it up. The others then wait for it elsewhere. A rank that
        // timed out there itself was running and waiting, not stopped: some peers can finish a
        // collective that it cannot (it waits for data relayed through a rank that stopped inside
        // that collective), so it is placed as waiting, and the stopped rank is the one named.
        std::vector<int> ahead;
        for (const auto& o : dumps) {
          if (e->state == "timed out") break;
          const Entry* c = o.rank == d.rank ? nullptr : last_completed(o, e->group);
          if (c && c->seq >= e->seq) ahead.push_back(o.rank);
        }
        if (!ahead.empty()) {
          suspended.push_back("rank " + std::to_string(d.rank) + " is behind: it was still in " + describe(*e) +
                              ", which " + ranks_text(ahead) + " completed (stopped, swapped out or descheduled "
                              "before it could finish): the others waited for it");
          continue;
        }
        waiting[describe(*e)].push_back(d.rank);
        waiting_entry[describe(*e)] = e;
      } else {
        idle.push_back(d.rank);
      }
    }
    bool first = true;
    for (const auto& [what, rs] : waiting) {
      const bool timed_out = waiting_entry[what]->state == "timed out";
      os << (first ? "" : "; ") << ranks_text(rs) << (timed_out ? (rs.size() == 1 ? " timed out" : " timed out")
                                                               : (rs.size() == 1 ? " waits" : " wait"))
         << " in " << what;
      const Entry* e = waiting_entry[what];
      if (e->bytes > 0) os << " of " << e->bytes << " bytes";
      first = false;
    }
    if (!first) os << ". ";
    for (const auto& line : suspended) os << line << ". ";
    // Ranks that left no dump: the last collective the others completed (with them) in the group
    // of the wait.
    std::vector<int> missing;
    for (int r = 0; r < world_size; ++r) {
      if (!present.count(r)) missing.push_back(r);
    }
    if (!missing.empty()) {
      os << ranks_text(missing) << " left no dump";
      std::string group = "world";
      if (!waiting.empty()) group = waiting_entry.begin()->second->group;
      const Entry* met = nullptr;
      for (const auto& d : dumps) {
        const Entry* c = last_completed(d, group);
        if (c && (!met || c->seq < met->seq)) met = c;  // what every live rank completed
      }
      if (met) {
        os << " (stopped, killed or stuck outside fsdp-cpp); the others last completed " << describe(*met)
           << " with " << (missing.size() == 1 ? "it" : "them");
        if (!waiting.empty()) os << ", so " << (missing.size() == 1 ? "it has" : "they have") << " not joined the next one";
      }
      os << ". ";
    }
    if (!idle.empty()) {
      os << ranks_text(idle) << (idle.size() == 1 ? " has" : " have") << " no collective pending";
      std::map<std::string, std::vector<int>> last;  // last completed -> ranks
      for (const auto& d : dumps) {
        if (std::find(idle.begin(), idle.end(), d.rank) == idle.end()) continue;
        if (const Entry* c = last_completed(d, "world")) last[describe(*c)].push_back(d.rank);
      }
      const char* sep = "; last completed: ";
      for (const auto& [what, rs] : last) {
        os << sep << (rs.size() == idle.size() ? std::string("all ") + what : ranks_text(rs) + " " + what);
        sep = ", ";
      }
      os << ". ";
    }
  }
  std::string text = os.str();
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

}  // namespace apps::diagnose
