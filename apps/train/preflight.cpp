// Checks before step 1 (preflight.h).
#include "train/preflight.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "fsdp/accounting/budget.h"
#include "train/errors.h"

namespace apps::train {
namespace {

namespace fs = std::filesystem;

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// Writes and removes `dir`/.fsdp-probe-<rank> (4 KiB, flushed); "" or why it failed.
std::string probe_write(const fs::path& dir, int rank) {
  const fs::path probe = dir / (".fsdp-probe-" + std::to_string(rank));
  std::string why;
  {
    errno = 0;  // before the open: a read-only file system refuses it (EROFS)
    std::ofstream f(probe, std::ios::binary | std::ios::trunc);
    const std::vector<char> block(4096, 0);
    if (f) f.write(block.data(), static_cast<std::streamsize>(block.size()));
    if (f) f.flush();
    if (!f) why = std::string("cannot write a file there: ") + (errno ? std::strerror(errno) : "write failed");
  }
  std::error_code ec;
  fs::remove(probe, ec);
  return why;
}

// The directory `path` is in must exist and take a file of `need_bytes` (0: no space check).
std::string check_file_target(const std::string& flag, const std::string& path, int rank,
                              int64_t need_bytes) {
  std::error_code ec;
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string head = flag + " '" + path + "': ";
  if (fs::is_directory(p, ec)) return head + "is a directory, expected a file path";
  if (!fs::is_directory(dir, ec)) return head + "its directory '" + dir.string() + "' does not exist";
  std::string why = probe_write(dir, rank);
  if (!why.empty()) return head + why;
  const fs::space_info space = fs::space(dir, ec);
  if (!ec && need_bytes > 0 && space.available < static_cast<uintmax_t>(need_bytes)) {
    return head + "needs about " + mib(need_bytes) + ", '" + dir.string() + "' has " +
           mib(static_cast<int64_t>(space.available)) + " free";
  }
  return "";
}

// The flight recorder's directory is made only when a dump is written (a timeout or a failed
// collective): it must be a directory that takes a file, or creatable in its nearest existing
// ancestor, by this process. Permission bits do not tell (root may "write" /proc): the check
// writes a probe file in the directory, or makes and removes a probe directory of this rank in
// the ancestor. The target itself is never created here.
std::string check_dump_dir(const std::string& dir, int rank) {
  std::error_code ec;
  const std::string head = "the flight recorder's directory '" + dir +
                           "' (--flight-recorder-dir, FSDP_FLIGHT_RECORDER_DIR or beside --metrics): ";
  fs::path p = fs::absolute(dir, ec);
  if (fs::exists(p, ec)) {
    if (!fs::is_directory(p, ec)) return head + "exists and is not a directory";
    const std::string why = probe_write(p, rank);
    return why.empty() ? "" : head + why;
  }
  while (!fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  if (!fs::is_directory(p, ec)) return head + "'" + p.string() + "' is not a directory";
  const fs::path probe = p / (".fsdp-probe-dir-" + std::to_string(rank) + "-" + std::to_string(::getpid()));
  if (::mkdir(probe.c_str(), 0700) != 0) {
    return head + "cannot be created in '" + p.string() + "': " + std::strerror(errno);
  }
  const std::string why = probe_write(probe, rank);
  fs::remove_all(probe, ec);
  return why.empty() ? "" : head + "cannot be written in '" + p.string() + "': " + why;
}

std::string check_save_dir(const TrainConfig& c, int rank, int64_t need_bytes) {
  std::error_code ec;
  const std::string head = "--save '" + c.save + "': ";
  if (!fs::is_directory(c.save, ec)) return head + "not a directory (cannot be created)";
  std::string why = probe_write(c.save, rank);
  if (!why.empty()) return head + why;
  const fs::space_info space = fs::space(c.save, ec);
  if (!ec && space.available < static_cast<uintmax_t>(need_bytes)) {
    return head + "a checkpoint needs about " + mib(need_bytes) + ", the file system has " +
           mib(static_cast<int64_t>(space.available)) + " free";
  }
  return "";
}

// This rank's first problem, or "".
std::string local_problem(const TrainConfig& c, const PreflightFacts& f, int rank, const std::string& dump_dir) {
  if (c.sample_tokens > 0 && f.prompt_tokens == 0) {
    return "--sample-prompt '" + c.sample_prompt + "' encodes to no token: give a non-empty "
           "prompt, or --sample-tokens 0";
  }
  if (c.sample_top_k > f.vocab_size) {
    return "--sample-top-k " + std::to_string(c.sample_top_k) + " exceeds the vocabulary of " +
           std::to_string(f.vocab_size) + " tokens (0 samples among all)";
  }
  const int64_t memory = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  const int64_t limit = c.memory_budget_bytes > 0 && (memory <= 0 || c.memory_budget_bytes < memory) ? c.memory_budget_bytes : memory;
  if (limit > 0 && f.build_bytes > limit) {
    return "the model (--model " + c.model + " with these --n-layer / --n-embd / --vocab-size) needs at least " +
           fsdp::accounting::format_bytes(f.build_bytes) + " on each rank to build (" +
           (c.meta_init ? "its model state with --meta-init" : "every rank builds it in full; --meta-init builds only its shards") +
           "), more than " + (limit == memory ? "this machine's memory, " : "--memory-budget, ") +
           fsdp::accounting::format_bytes(limit);
  }
  std::string why;
  if (!c.save.empty()) why = check_save_dir(c, rank, f.checkpoint_bytes);
  if (why.empty() && !dump_dir.empty()) why = check_dump_dir(dump_dir, rank);
  if (why.empty() && !c.profile.empty()) {
    why = check_file_target("--profile", rank == 0 ? c.profile : c.profile + ".rank" + std::to_string(rank), rank, 0);
  }
  if (rank != 0) return why;
  if (why.empty() && !c.export_path.empty()) why = check_file_target("--export", c.export_path, rank, f.export_bytes);
  // The Hugging Face directories: created now (as --save's), probed with their main file.
  struct HfDir {
    const char* flag;
    const std::string& dir;
    const char* file;
    int64_t bytes;
  };
  for (const HfDir& d : {HfDir{"--export-hf", c.export_hf, "model.safetensors", f.export_bytes},
                         HfDir{"--export-adapter", c.export_adapter, "adapter_model.safetensors", int64_t(1) << 20}}) {
    if (!why.empty() || d.dir.empty()) continue;
    std::error_code ec;
    fs::create_directories(d.dir, ec);
    if (ec && !fs::is_directory(d.dir)) why = std::string(d.flag) + " '" + d.dir + "': cannot create the directory: " + ec.message();
    if (why.empty()) why = check_file_target(d.flag, (fs::path(d.dir) / d.file).string(), rank, d.bytes);
  }
  if (why.empty() && !c.metrics.empty()) why = check_file_target("--metrics", c.metrics, rank, 0);
  if (why.empty() && !c.trace.empty()) why = check_file_target("--trace", c.trace, rank, 0);
  return why;
}

}  // namespace

int64_t checkpoint_bytes_of(int64_t num_params) { return 3 * 4 * num_params + (int64_t(1) << 20); }

int64_t export_bytes_of(int64_t num_params) { return 4 * num_params + (int64_t(1) << 20); }

void preflight(const TrainConfig& c, const PreflightFacts& facts, fsdp::comm::ProcessGroup& group) {
  const int rank = group.rank();
  if (!c.save.empty() && rank == 0) {
    std::error_code ec;
    fs::create_directories(c.save, ec);  // a failure shows as "not a directory" below
  }
  group.barrier()->wait();  // the --save directory exists before any rank probes it
  const std::string mine = local_problem(c, facts, rank, group.options().flight_recorder_dir);
  const std::vector<std::string> all = fsdp::comm::all_gather_strings(group, mine);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    throw UsageError(all.size() > 1 ? all[r] + " (rank " + std::to_string(r) + ")" : all[r]);
  }
}

}  // namespace apps::train
