#include "publish.h"

#include <cstdint>
#include <filesystem>
#include <system_error>

#include "io.h"
#include "manifest.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

void rename_or_throw(const fs::path& from, const fs::path& to, const ErrorContext& where) {
  std::error_code ec;
  fs::rename(from, to, ec);
  FSDP_CHECK(!ec, ErrorKind::kIo, where, "rename '", from.string(), "' -> '", to.string(),
             "' failed: ", ec.message());
}

}  // namespace

std::string tmp_dir_of(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / (kTmpPrefix + name)).string();
}

void prepare_save_dir(const std::string& dir, const std::string& name, const ErrorContext& where) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  FSDP_CHECK(!ec, ErrorKind::kIo, where, "cannot create directory '", dir, "': ", ec.message());
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    std::error_code ignored;  // best effort: debris never looks like a checkpoint
    if (n.rfind(kTmpPrefix, 0) == 0 || n.rfind(kTrashPrefix, 0) == 0) fs::remove_all(e.path(), ignored);
  }
  FSDP_CHECK(!ec, ErrorKind::kIo, where, "cannot list directory '", dir, "': ", ec.message());
  const std::string tmp = tmp_dir_of(dir, name);
  fs::create_directory(tmp, ec);
  FSDP_CHECK(!ec, ErrorKind::kIo, where, "cannot create directory '", tmp, "': ", ec.message());
}

void publish(const std::string& dir, const std::string& name, const SaveOptions& options,
             const ErrorContext& where) {
  using Stage = FaultInjection::Stage;
  auto fault = [&](Stage s, const char* what) {
    FSDP_CHECK(options.fault.stage != s, ErrorKind::kIo, where, "injected fault: simulated crash ",
               what);
  };
  const fs::path final_path = fs::path(dir) / name;
  const fs::path trash = fs::path(dir) / (kTrashPrefix + name);
  fault(Stage::kBeforeRename, "before renaming the checkpoint directory");
  std::error_code ec;
  if (fs::exists(final_path, ec)) rename_or_throw(final_path, trash, where);  // re-save: move aside
  rename_or_throw(tmp_dir_of(dir, name), final_path, where);
  if (options.durable) io::fsync_dir(dir);
  fs::remove_all(trash, ec);
  fault(Stage::kBeforeLatest, "after publishing, before updating 'latest'");
  io::atomic_write_file((fs::path(dir) / kLatestFile).string(), name + "\n", options.durable);
  if (options.keep_last_k <= 0) return;
  const auto all = list_checkpoints(dir);
  int64_t excess = static_cast<int64_t>(all.size()) - options.keep_last_k;
  for (const auto& victim : all) {
    if (excess <= 0) break;
    if (fs::path(victim).filename() == name) continue;
    // rename first: a half-deleted directory must never look like a complete checkpoint
    const fs::path t = fs::path(dir) / (kTrashPrefix + fs::path(victim).filename().string());
    rename_or_throw(victim, t, where);
    fs::remove_all(t, ec);
    --excess;
  }
}

}  // namespace fsdp::checkpoint
