// Rendezvous of a Gloo job: the torchrun environment, c10d's TCPStore behind Gloo's Store
// interface, Gloo's file store, the check that Gloo's symbols come from the system's library.
#include <dlfcn.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <gloo/allgather.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "fsdp/comm/comm_stats.h"
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

// Gloo's Store, plus a check that does not wait: which ranks have joined (joining below).
class RendezvousStore : public gloo::rendezvous::Store {
 public:
  /// True when `key` is set; returns at once.
  virtual bool has(const std::string& key) = 0;
  /// Waits up to timeout for every key to be set; false when some are not by then. Logs nothing.
  virtual bool wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

// Gloo's Store over c10d's TCPStore (the store torchrun's agent serves).
class TcpStoreAdapter final : public RendezvousStore {
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
  bool has(const std::string& key) override { return store_->check({key}); }
  // c10d's wait with a timeout logs two warnings each time it times out: one check of all the keys
  // (one request) every 100 ms instead.
  bool wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (store_->check(keys)) return true;
      if (std::chrono::steady_clock::now() >= end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// Gloo's file store, with its own (protected) check made public.
class CheckedFileStore final : public RendezvousStore {
 public:
  explicit CheckedFileStore(const std::string& dir) : store_(dir) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return store_.get(key); }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }
  bool has(const std::string& key) override { return store_.check({key}); }
  bool wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    try {
      store_.wait(keys, timeout);
      return true;
    } catch (const std::exception&) {
      return false;  // not all there by then
    }
  }

 private:
  struct Exposed : gloo::rendezvous::FileStore {
    using FileStore::FileStore;
    using FileStore::check;
  };
  Exposed store_;
};

// When the first notice of a slow rendezvous step is printed, and how often after it: soon enough
// that a user who started too few ranks learns it in seconds, rarely enough not to flood a log.
double first_notice_s(double timeout_s) { return std::min(10.0, timeout_s / 4); }
double notice_every_s(double timeout_s) { return std::min(30.0, timeout_s / 2); }

// Prints text(seconds so far) on stderr at first_notice_s and then every notice_every_s while it
// lives, from a thread of its own: for a step that blocks in a library call (c10d's TCPStore
// connecting to a server that is not there yet retries silently until its timeout).
class SlowStepNotice {
 public:
  SlowStepNotice(double timeout_s, std::function<std::string(double)> text)
      : thread_([this, timeout_s, text = std::move(text)] {
          const double t0 = now_s();
          double next = t0 + first_notice_s(timeout_s);
          std::unique_lock<std::mutex> lock(mu_);
          for (;;) {
            const auto wait = std::chrono::duration<double>(std::max(0.0, next - now_s()));
            if (cv_.wait_for(lock, wait, [this] { return done_; })) return;
            std::fprintf(stderr, "[fsdp] %s\n", text(now_s() - t0).c_str());
            next = now_s() + notice_every_s(timeout_s);
          }
        }) {}
  ~SlowStepNotice() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started once the members it reads exist
};

std::string store_description(const GlooRendezvous& rv) {
  if (!rv.file_store_dir.empty()) return str_cat("file store ", rv.file_store_dir);
  return str_cat("TCP store ", rv.master_addr, ":", rv.master_port,
                 rv.store_is_served ? " (served by the launcher)" : " (served by rank 0)");
}

// "rank 3", "ranks 0, 2, 5" (the first 16, then how many more)
std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) out += str_cat(" and ", ranks.size() - 16, " more");
  return out;
}

// [Note: joining] Gloo's full-mesh connect waits, silently, until its timeout for a rank that never
// comes (torchrun's --nproc-per-node or --nnodes smaller than WORLD_SIZE says, a host that did not
// start, a rank that died before it reached the rendezvous). So every rank first sets a key of its
// own and waits for all of them, the store doing the waiting (one wait per notice period, not a
// poll per rank); while some are missing it says every so often which, and past the connect
// timeout it fails naming them. The key prefix carries torchrun's restart count, so a restarted
// generation never counts the ranks of the one before.
void join(RendezvousStore& store, const GlooRendezvous& rv) {
  const std::string prefix = rv.key_prefix + "joined/";
  store.set(prefix + std::to_string(rv.rank), std::vector<char>{'1'});
  std::vector<std::string> keys;
  for (int r = 0; r < rv.world_size; ++r) keys.push_back(prefix + std::to_string(r));
  const double t0 = now_s(), deadline = t0 + rv.connect_timeout_s;
  double slice_s = first_notice_s(rv.connect_timeout_s);
  for (;;) {
    const double left_s = deadline - now_s();
    std::vector<int> missing;
    try {
      if (store.wait_for(keys, ms_of(std::max(0.001, std::min(slice_s, left_s))))) return;
      for (int r = 0; r < rv.world_size; ++r) {
        if (!store.has(keys[r])) missing.push_back(r);
      }
    } catch (const std::exception& e) {  // the store's server went away (rank 0 or the launcher ended)
      throw Error(ErrorKind::kCollective, ErrorContext{rv.rank, "", "gloo rendezvous"},
                  str_cat("lost the ", store_description(rv), " while waiting for the other ranks: ", message_of(e)));
    }
    if (missing.empty()) return;
    const double waited_s = now_s() - t0;
    FSDP_CHECK(now_s() < deadline, ErrorKind::kTimeout, (ErrorContext{rv.rank, "", "gloo rendezvous"}),
               ranks_text(missing), " did not join the rendezvous (",
               store_description(rv), ") within ", rv.connect_timeout_s, " s; WORLD_SIZE = ", rv.world_size,
               ": every rank must start (torchrun's --nproc-per-node and --nnodes, one process per rank)");
    std::fprintf(stderr, "[fsdp] rank %d: waiting for %s to join the rendezvous (%s): %.0f s so far, giving up after %.0f s\n",
                 rv.rank, ranks_text(missing).c_str(), store_description(rv).c_str(), waited_s, rv.connect_timeout_s);
    slice_s = notice_every_s(rv.connect_timeout_s);
  }
}

// [Note: reaching the store] c10d's TCPStore client, given nothing listening at the address (a
// rank with another MASTER_PORT, rank 0 not started), tries one connect for the whole timeout, then
// logs the failure with libtorch's C++ backtrace and retries after a back-off past the timeout.
// So a client first waits here, with plain sockets, until something accepts a connection at the
// store's address (or the timeout passes: an error naming the address and the likely causes), and
// only then builds the TCPStore, which connects at once.
void wait_until_listening(const GlooRendezvous& rv, double deadline_s) {
  std::string last = "nothing tried";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(rv.master_port);
    if (getaddrinfo(rv.master_addr.c_str(), port.c_str(), &hints, &found) == 0) {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) continue;
        bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        if (!ok && errno == EINPROGRESS) {  // an address that does not answer at once: up to 1 s
          pollfd pfd{fd, POLLOUT, 0};
          int err = 0;
          socklen_t len = sizeof(err);
          ok = ::poll(&pfd, 1, 1000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
          if (!ok) errno = err != 0 ? err : ETIMEDOUT;
        }
        if (!ok) last = std::strerror(errno);
        ::close(fd);
        if (ok) {
          freeaddrinfo(found);
          return;
        }
      }
      freeaddrinfo(found);
    }
    FSDP_CHECK(now_s() < deadline_s, ErrorKind::kTimeout, (ErrorContext{rv.rank, "", "gloo rendezvous"}),
               "nothing answered at the ", store_description(rv), " within ", rv.connect_timeout_s, " s (", last,
               "): rank 0 serves it at MASTER_ADDR:MASTER_PORT; give every rank the same MASTER_ADDR and "
               "MASTER_PORT, and start rank 0 (FSDP_RENDEZVOUS_TIMEOUT_S sets the wait)");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::shared_ptr<RendezvousStore> open_store(const GlooRendezvous& rv) {
  if (!rv.file_store_dir.empty()) {
    std::filesystem::create_directories(rv.file_store_dir);
    return std::make_shared<CheckedFileStore>(rv.file_store_dir);
  }
  {
    // c10d's store retries an address that does not resolve until its timeout, printing a warning
    // a second: a typo in MASTER_ADDR is named at once instead.
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(rv.master_addr.c_str(), nullptr, &hints, &found);
    if (found) freeaddrinfo(found);
    FSDP_CHECK(rc == 0, ErrorKind::kInvalidArgument, (ErrorContext{rv.rank, "", "gloo rendezvous"}),
               "MASTER_ADDR '", rv.master_addr, "' does not resolve (", gai_strerror(rc),
               "): set it to the host name or address of the node that runs rank 0");
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(rv.master_port);
  o.isServer = !rv.store_is_served && rv.rank == 0;
  if (o.isServer) o.numWorkers = static_cast<size_t>(rv.world_size);
  o.waitWorkers = false;
  o.timeout = ms_of(rv.connect_timeout_s);
  const double deadline_s = now_s() + rv.connect_timeout_s;
  std::unique_ptr<SlowStepNotice> notice;
  if (!o.isServer) {
    notice = std::make_unique<SlowStepNotice>(rv.connect_timeout_s, [&rv](double waited_s) {
      return str_cat("rank ", rv.rank, ": still connecting to the ", store_description(rv), ": ",
                     static_cast<int>(waited_s), " s so far, giving up after ", rv.connect_timeout_s, " s");
    });
    wait_until_listening(rv, deadline_s);  // [Note: reaching the store]
    o.timeout = ms_of(std::max(1.0, deadline_s - now_s()));
  }
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
  // Under an MPI launcher, RANK and WORLD_SIZE (left in the environment, or passed on with -x) are
  // the same in every rank: a Gloo world from them would have every process claim one rank.
  const char* mpi_var = mpi_launcher_variable();
  FSDP_CHECK(!mpi_var, ErrorKind::kInvalidArgument, (ErrorContext{launcher_rank(), "", "gloo rendezvous"}),
             "the gloo backend takes its ranks from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, "
             "MASTER_PORT), but this process was started by an MPI launcher (", mpi_var,
             " is set", env_or_null("RANK") ? "; RANK and WORLD_SIZE then say nothing of this process" : ", RANK and WORLD_SIZE are not",
             "): use the mpi backend under mpirun, or launch with torchrun");
  if (!env_or_null("WORLD_SIZE") && !env_or_null("RANK")) {
    // No launcher at all: a job of this one process, over a TCP store it serves on a free port.
    rv.master_port = 0;
    return rv;
  }
  rv.world_size = env_int("WORLD_SIZE", 1, 1 << 20, -1);
  rv.rank = env_int("RANK", 0, rv.world_size - 1, -1);
  if (env_or_null("FSDP_RENDEZVOUS_TIMEOUT_S")) rv.connect_timeout_s = env_int("FSDP_RENDEZVOUS_TIMEOUT_S", 1, 86400, rv.rank);
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
  if (rendezvous.world_size > 1) join(*store, rendezvous);
  set_job_channel(std::make_shared<GlooJobChannel>(store, rendezvous.key_prefix, rendezvous.rank,
                                                   rendezvous.world_size));
  auto backend = std::make_unique<GlooBackend>(store, device, rendezvous.key_prefix + "world/", rendezvous.rank,
                                               rendezvous.world_size, rendezvous.connect_timeout_s);
  return std::make_shared<ProcessGroup>(std::move(backend), options, "world");
}

}  // namespace fsdp::comm
