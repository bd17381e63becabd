// Rendezvous of a Gloo job: the torchrun environment, c10d's TCPStore behind Gloo's Store
// interface, Gloo's file store, the check that Gloo's symbols come from the system's library.
#include <dlfcn.h>
#include <unistd.h>
#include <gloo/allgather.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "fsdp/comm/gloo_backend.h"
#include "fsdp/comm/job_channel.h"
#include "fsdp/comm/world.h"
#include "fsdp/common/check.h"

namespace fsdp::comm {
namespace {

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int lo, int hi, int rank) {
  const char* v = env_or_null(name);
  FSDP_CHECK(v != nullptr, ErrorKind::kInvalidArgument, (ErrorContext{rank, "", "gloo rendezvous"}),
             "the environment variable ", name, " is not set (set by torchrun, or set it yourself)");
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  FSDP_CHECK(*end == '\0' && x >= lo && x <= hi, ErrorKind::kInvalidArgument,
             (ErrorContext{rank, "", "gloo rendezvous"}), name, " = '", v, "': expected an integer in [", lo, ", ",
             hi, "]");
  return static_cast<int>(x);
}

std::chrono::milliseconds ms_of(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0)); }

// Gloo's Store over c10d's TCPStore (the store torchrun's agent serves).
class TcpStoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit TcpStoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::vector<uint8_t> v = store_->get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

std::shared_ptr<gloo::rendezvous::Store> open_store(const GlooRendezvous& rv) {
  if (!rv.file_store_dir.empty()) {
    std::filesystem::create_directories(rv.file_store_dir);
    return std::make_shared<gloo::rendezvous::FileStore>(rv.file_store_dir);
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(rv.master_port);
  o.isServer = !rv.store_is_served && rv.rank == 0;
  if (o.isServer) o.numWorkers = static_cast<size_t>(rv.world_size);
  o.waitWorkers = false;
  o.timeout = ms_of(rv.connect_timeout_s);
  try {
    return std::make_shared<TcpStoreAdapter>(c10::make_intrusive<c10d::TCPStore>(rv.master_addr, o));
  } catch (const std::exception& e) {
    throw Error(ErrorKind::kCollective, ErrorContext{rv.rank, "", "gloo rendezvous"},
                str_cat("cannot reach the TCP store at ", rv.master_addr, ":", rv.master_port, ": ", message_of(e)));
  }
}

// JobChannel over the rendezvous store: the k-th agreement is the keys job/k/<rank>.
class GlooJobChannel final : public JobChannel {
 public:
  GlooJobChannel(std::shared_ptr<gloo::rendezvous::Store> store, std::string prefix, int rank, int size)
      : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<int> gather_ints(int mine, double wait_s) override {
    const std::string round = str_cat(prefix_, "job/", rounds_++, "/");
    try {
      const std::string text = std::to_string(mine);
      store_->set(round + std::to_string(rank_), std::vector<char>(text.begin(), text.end()));
      std::vector<std::string> keys;
      for (int r = 0; r < size_; ++r) keys.push_back(round + std::to_string(r));
      store_->wait(keys, ms_of(wait_s));
      std::vector<int> all;
      for (const std::string& key : keys) {
        const std::vector<char> v = store_->get(key);
        all.push_back(std::stoi(std::string(v.begin(), v.end())));
      }
      return all;
    } catch (...) {  // a peer that never came (or a store that went away): no agreement
      return {};
    }
  }

  [[noreturn]] void abort_job(int code) override {
    std::fflush(nullptr);
    std::_Exit(code == 0 ? 1 : code);
  }

 private:
  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::string prefix_;
  int rank_ = 0;
  int size_ = 1;
  int rounds_ = 0;
};

}  // namespace

const char* mpi_launcher_variable() {
  for (const char* mpi_var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (env_or_null(mpi_var)) return mpi_var;
  }
  return nullptr;
}

void check_rank_and_world_size_paired() {
  if (mpi_launcher_variable()) return;
  const bool has_rank = env_or_null("RANK") != nullptr, has_size = env_or_null("WORLD_SIZE") != nullptr;
  FSDP_CHECK(has_rank == has_size, ErrorKind::kInvalidArgument, (ErrorContext{launcher_rank(), "", "world_from_env"}),
             has_rank ? "RANK" : "WORLD_SIZE", " is set but ", has_rank ? "WORLD_SIZE" : "RANK",
             " is not: set both (with MASTER_ADDR and MASTER_PORT) or launch with torchrun; with neither, "
             "a process started by hand is a job of one rank");
}

bool torchrun_environment() { return !mpi_launcher_variable() && env_or_null("RANK") && env_or_null("WORLD_SIZE"); }

GlooRendezvous GlooRendezvous::from_env() {
  GlooRendezvous rv;
  if (!env_or_null("WORLD_SIZE") && !env_or_null("RANK")) {
    const char* mpi_var = mpi_launcher_variable();
    FSDP_CHECK(!mpi_var, ErrorKind::kInvalidArgument, (ErrorContext{launcher_rank(), "", "gloo rendezvous"}),
               "the gloo backend takes its ranks from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, "
               "MASTER_PORT), but this process was started by an MPI launcher (", mpi_var,
               " is set, RANK and WORLD_SIZE are not): use the mpi backend under mpirun, or launch with torchrun");
    // No launcher at all: a job of this one process, over a TCP store it serves on a free port.
    rv.master_port = 0;
    return rv;
  }
  rv.world_size = env_int("WORLD_SIZE", 1, 1 << 20, -1);
  rv.rank = env_int("RANK", 0, rv.world_size - 1, -1);
  const char* restarts = env_or_null("TORCHELASTIC_RESTART_COUNT");
  rv.key_prefix = str_cat("fsdp/", restarts ? restarts : "0", "/");
  if (const char* dir = env_or_null("FSDP_GLOO_FILE_STORE")) {
    rv.file_store_dir = dir;
    return rv;
  }
  const char* addr = env_or_null("MASTER_ADDR");
  FSDP_CHECK(addr != nullptr, ErrorKind::kInvalidArgument, (ErrorContext{rv.rank, "", "gloo rendezvous"}),
             "MASTER_ADDR is not set: launch with torchrun, or set MASTER_ADDR and MASTER_PORT (a TCP store) "
             "or FSDP_GLOO_FILE_STORE (a shared directory)");
  rv.master_addr = addr;
  rv.master_port = env_int("MASTER_PORT", 1, 65535, rv.rank);
  const char* agent = env_or_null("TORCHELASTIC_USE_AGENT_STORE");
  rv.store_is_served = agent && (std::string(agent) == "True" || std::string(agent) == "1");
  return rv;
}

void check_gloo_binding() {
  Dl_info info{};
  const void* fn = reinterpret_cast<const void*>(&gloo::allgather);
  const bool found = dladdr(fn, &info) != 0 && info.dli_fname != nullptr;
  const std::string lib = found ? std::filesystem::path(info.dli_fname).filename().string() : "(unknown)";
  FSDP_CHECK(lib.rfind("libgloo", 0) == 0, ErrorKind::kUnsupported, (ErrorContext{-1, "", "gloo"}),
             "gloo::allgather resolved to ", lib, ", expected the system's libgloo.so: link libgloo before "
             "libtorch (libtorch exports a Gloo of another version, docs/notes.md)");
}

ProcessGroupPtr gloo_world(const GlooRendezvous& rendezvous, const ProcessGroupOptions& options) {
  check_gloo_binding();
  gloo::transport::tcp::attr attr;
  const bool local = rendezvous.file_store_dir.empty() &&
                     (rendezvous.master_addr == "localhost" || rendezvous.master_addr == "127.0.0.1");
  attr.hostname = local ? "127.0.0.1" : "";  // "": the address this host's name resolves to
  if (attr.hostname.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    attr.hostname = host;
  }
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto store = open_store(rendezvous);
  set_job_channel(std::make_shared<GlooJobChannel>(store, rendezvous.key_prefix, rendezvous.rank,
                                                   rendezvous.world_size));
  auto backend = std::make_unique<GlooBackend>(store, device, rendezvous.key_prefix + "world/", rendezvous.rank,
                                               rendezvous.world_size, rendezvous.connect_timeout_s);
  return std::make_shared<ProcessGroup>(std::move(backend), options, "world");
}

}  // namespace fsdp::comm
