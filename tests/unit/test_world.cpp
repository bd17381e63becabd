// Tier `unit`: how a process finds its world from its launcher's environment (fsdp/comm/world.h,
// gloo_backend.h): the backend `auto` picks, the launcher mistakes refused with a clear error, and
// a process started with no launcher forming a world of one over Gloo.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../common/error_of.h"
#include "fsdp/comm/backend_registry.h"
#include "fsdp/comm/gloo_backend.h"
#include "fsdp/comm/world.h"
#include "fsdp/common/check.h"

using fsdp_test::error_of;

namespace {

// Sets (or, for nullopt, unsets) environment variables for one test and restores them after.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::optional<std::string>>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      set(name, value);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) set(name, value);
  }

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      setenv(name.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

// Every variable a launcher sets, unset: a process started by hand.
std::map<std::string, std::optional<std::string>> no_launcher() {
  std::map<std::string, std::optional<std::string>> vars;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
                           "PMIX_RANK", "PMI_RANK", "FSDP_GLOO_FILE_STORE", "TORCHELASTIC_RESTART_COUNT",
                           "TORCHELASTIC_USE_AGENT_STORE"}) {
    vars[name] = std::nullopt;
  }
  return vars;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(World, AutoPicksGlooUnderTorchrunAndOtherwiseMpiWhenTheBuildHasIt) {
  auto vars = no_launcher();
  {
    const ScopedEnv env(vars);
    EXPECT_EQ(fsdp::comm::resolve_backend("auto"), fsdp::comm::mpi_available() ? "mpi" : "gloo");
    EXPECT_EQ(fsdp::comm::resolve_backend("gloo"), "gloo");
  }
  vars["RANK"] = "1";
  vars["WORLD_SIZE"] = "2";
  {
    const ScopedEnv env(vars);
    EXPECT_EQ(fsdp::comm::resolve_backend("auto"), "gloo");
    // mpi inside torchrun: its ranks would be MPI jobs of one rank each.
    const fsdp::Error e = error_of([] { fsdp::comm::resolve_backend("mpi"); });
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument);
    EXPECT_TRUE(contains(e.what(), "in a torchrun job")) << e.what();
    EXPECT_TRUE(contains(e.what(), "rank 1")) << e.what();
  }
  // The same variables beside an MPI launcher's: mpirun started it, auto stays with MPI.
  vars["OMPI_COMM_WORLD_RANK"] = "1";
  {
    const ScopedEnv env(vars);
    EXPECT_EQ(fsdp::comm::resolve_backend("auto"), fsdp::comm::mpi_available() ? "mpi" : "gloo");
  }
  const fsdp::Error e = error_of([] { fsdp::comm::resolve_backend("ncl"); });
  EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "backend 'ncl': expected one of auto, mpi, gloo, nccl")) << e.what();
}

// The registry of world backends: one entry per known name, whether this build has it (MPI as
// the build found it, Gloo always, NCCL only in a CUDA build), and the lines the apps print.
TEST(BackendRegistry, KnownNamesWhatThisBuildHasAndTheRefusals) {
  using fsdp::comm::backend_refusal;
  std::vector<std::string> names;
  for (const auto& b : fsdp::comm::world_backends()) {
    names.push_back(b.name);
    EXPECT_FALSE(b.description.empty()) << b.name;
    EXPECT_EQ(b.description.find('\n'), std::string::npos) << b.name << ": one line";
    EXPECT_TRUE(b.built || (!b.needs.empty() && !b.instead.empty())) << b.name << ": a refusal says what it needs";
  }
  EXPECT_EQ(names, (std::vector<std::string>{"mpi", "gloo", "nccl"}));
  ASSERT_NE(fsdp::comm::find_world_backend("mpi"), nullptr);
  EXPECT_EQ(fsdp::comm::find_world_backend("mpi")->built, fsdp::comm::mpi_available());
  EXPECT_TRUE(fsdp::comm::find_world_backend("gloo")->built);
  EXPECT_EQ(fsdp::comm::find_world_backend("NCCL"), nullptr);  // names are exact
  EXPECT_EQ(fsdp::comm::find_world_backend("threaded"), nullptr);  // tests' own, not a world's
#if defined(FSDP_WITH_CUDA) && FSDP_WITH_CUDA
  EXPECT_TRUE(fsdp::comm::find_world_backend("nccl")->built);
#else
  EXPECT_FALSE(fsdp::comm::find_world_backend("nccl")->built);
  EXPECT_EQ(backend_refusal("nccl"),
            "backend 'nccl' is not in this build (it needs a CUDA build (FSDP_WITH_CUDA)): use --backend mpi "
            "(mpirun) or gloo (torchrun)");
#endif
  // What a --backend flag accepts: auto and what this build has, in the registry's order.
  std::vector<std::string> accepted{"auto"};
  for (const auto& b : fsdp::comm::world_backends()) {
    if (b.built) accepted.push_back(b.name);
  }
  EXPECT_EQ(fsdp::comm::buildable_backend_names(), accepted);
  for (const auto& name : accepted) EXPECT_EQ(backend_refusal(name), "") << name;
  if (!fsdp::comm::mpi_available()) {
    EXPECT_TRUE(contains(backend_refusal("mpi"), "backend 'mpi' is not in this build (it needs FSDP_WITH_MPI=ON"));
  }
  EXPECT_EQ(backend_refusal("tcp"), "backend 'tcp': expected one of auto, mpi, gloo, nccl");
  EXPECT_EQ(backend_refusal(""), "backend '': expected one of auto, mpi, gloo, nccl");
  // The help names every known backend and marks those this build lacks.
  const std::string help = fsdp::comm::backend_flag_help();
  for (const auto& b : fsdp::comm::world_backends()) {
    EXPECT_TRUE(contains(help, "'" + b.name + "': " + b.description)) << help;
    EXPECT_EQ(contains(help, "'" + b.name + "': " + b.description + " (not in this build)"), !b.built) << help;
  }
}

// A known backend this build lacks is refused by world setup as unsupported, with the registry's
// line, after the launch checks every name gets.
// The apps train and measure on CPU tensors: a backend of device tensors is refused with a line
// that says so in a build that has it, with the registry's own refusal in one that does not.
TEST(BackendRegistry, ACpuProgramRefusesABackendOfDeviceTensors) {
  using fsdp::comm::backend_refusal_for_cpu_program;
  for (const auto& b : fsdp::comm::world_backends()) {
    EXPECT_TRUE(b.tensors_on == "cpu" || b.tensors_on == "cuda") << b.name;
    if (b.tensors_on == "cpu") {
      EXPECT_EQ(backend_refusal_for_cpu_program(b.name, "fsdp-train"), fsdp::comm::backend_refusal(b.name));
    } else if (!b.built) {
      EXPECT_EQ(backend_refusal_for_cpu_program(b.name, "fsdp-train"), fsdp::comm::backend_refusal(b.name));
    } else {
      const std::string why = backend_refusal_for_cpu_program(b.name, "fsdp-train");
      EXPECT_TRUE(contains(why, "backend '" + b.name + "' moves cuda tensors: fsdp-train runs on the CPU")) << why;
    }
  }
  EXPECT_EQ(fsdp::comm::find_world_backend("nccl")->tensors_on, "cuda");
  EXPECT_EQ(backend_refusal_for_cpu_program("auto", "fsdp-plan"), "");
  EXPECT_TRUE(contains(backend_refusal_for_cpu_program("bogus", "fsdp-plan"), "expected one of auto, mpi, gloo, nccl"));
}

TEST(BackendRegistry, WorldSetupRefusesAKnownBackendThisBuildLacks) {
  const ScopedEnv env(no_launcher());
  for (const auto& b : fsdp::comm::world_backends()) {
    if (b.built) continue;
    const fsdp::Error e = error_of([&] { fsdp::comm::resolve_backend(b.name); });
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kUnsupported) << e.what();
    EXPECT_TRUE(contains(e.what(), fsdp::comm::backend_refusal(b.name))) << e.what();
  }
}

TEST(World, GlooUnderAnMpiLauncherNamesTheLauncher) {
  for (const char* mpi_var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    auto vars = no_launcher();
    vars[mpi_var] = "1";
    const ScopedEnv env(vars);
    const fsdp::Error e = error_of([] { fsdp::comm::GlooRendezvous::from_env(); });
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument);
    EXPECT_TRUE(contains(e.what(), std::string(mpi_var) + " is set")) << e.what();
    EXPECT_TRUE(contains(e.what(), "started by an MPI launcher")) << e.what();
    EXPECT_TRUE(contains(e.what(), "use the mpi backend under mpirun, or launch with torchrun")) << e.what();
    // torchrun's variables left in the environment (or passed on with mpirun -x): the same in
    // every rank, so they say nothing of this process, and the launch is refused as well.
    auto leftover = vars;
    leftover["RANK"] = "0";
    leftover["WORLD_SIZE"] = "2";
    leftover["MASTER_ADDR"] = "127.0.0.1";
    leftover["MASTER_PORT"] = "29500";
    const ScopedEnv env2(leftover);
    const fsdp::Error e2 = error_of([] { fsdp::comm::GlooRendezvous::from_env(); });
    EXPECT_EQ(e2.kind(), fsdp::ErrorKind::kInvalidArgument);
    EXPECT_TRUE(contains(e2.what(), std::string(mpi_var) + " is set; RANK and WORLD_SIZE then say nothing")) << e2.what();
  }
}

// A MASTER_ADDR that does not resolve is named at once (c10d's store would retry it until its
// timeout, printing a warning a second).
TEST(World, AMasterAddressThatDoesNotResolveIsNamedAtOnce) {
  const ScopedEnv env(no_launcher());
  fsdp::comm::GlooRendezvous rv;
  rv.rank = 1;
  rv.world_size = 2;
  rv.master_addr = "no-such-host.invalid";
  rv.master_port = 29599;
  rv.connect_timeout_s = 60.0;
  const fsdp::Error e = error_of([&] { fsdp::comm::gloo_world(rv); });
  EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument) << e.what();
  EXPECT_TRUE(contains(e.what(), "MASTER_ADDR 'no-such-host.invalid' does not resolve")) << e.what();
  EXPECT_TRUE(contains(e.what(), "rank 1")) << e.what();
}

TEST(World, TorchrunVariablesMissingOrMalformedAreNamed) {
  auto vars = no_launcher();
  vars["WORLD_SIZE"] = "2";
  vars["RANK"] = "2";
  {
    const ScopedEnv env(vars);
    const fsdp::Error e = error_of([] { fsdp::comm::GlooRendezvous::from_env(); });
    EXPECT_TRUE(contains(e.what(), "RANK = '2': expected an integer in [0, 1]")) << e.what();
  }
  vars["RANK"] = "1";
  {
    const ScopedEnv env(vars);
    const fsdp::Error e = error_of([] { fsdp::comm::GlooRendezvous::from_env(); });
    EXPECT_TRUE(contains(e.what(), "MASTER_ADDR is not set")) << e.what();
  }
}

// No launcher: a world of one over a TCP store on a free port; its collectives run.
TEST(World, AProcessWithNoLauncherFormsAGlooWorldOfOne) {
  const ScopedEnv env(no_launcher());
  const fsdp::comm::GlooRendezvous rv = fsdp::comm::GlooRendezvous::from_env();
  EXPECT_EQ(rv.world_size, 1);
  EXPECT_EQ(rv.rank, 0);
  EXPECT_EQ(rv.master_port, 0);
  EXPECT_TRUE(rv.file_store_dir.empty());
  const fsdp::comm::ProcessGroupPtr world = fsdp::comm::gloo_world(rv);
  EXPECT_EQ(world->size(), 1);
  at::Tensor t = at::arange(4, at::kFloat);
  world->all_reduce(t)->wait();
  EXPECT_TRUE(at::equal(t, at::arange(4, at::kFloat)));
}

// RANK without WORLD_SIZE (or the reverse), as a launch half set up by hand: refused under every
// backend name, naming the missing variable, instead of training as independent jobs of one rank.
TEST(World, HalfOfTheTorchrunVariablesIsRefused) {
  for (const char* set : {"RANK", "WORLD_SIZE"}) {
    auto vars = no_launcher();
    vars[set] = "1";
    const ScopedEnv env(vars);
    const std::string missing = std::string(set) == "RANK" ? "WORLD_SIZE" : "RANK";
    for (const char* backend : {"auto", "gloo", "mpi"}) {
      const fsdp::Error e = error_of([&] { fsdp::comm::resolve_backend(backend); });
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument) << e.what();
      EXPECT_TRUE(contains(e.what(), std::string(set) + " is set but " + missing + " is not")) << e.what();
    }
  }
}

// init_launcher initialises MPI only in a process an MPI launcher started: started by hand, the
// environment stays as it was (a singleton MPI_Init would set PMIX_RANK, and the gloo rendezvous
// would then take the process for an mpirun rank).
TEST(World, InitLauncherLeavesAProcessStartedByHandAlone) {
  const ScopedEnv env(no_launcher());
  fsdp::comm::init_launcher();
  EXPECT_EQ(fsdp::comm::mpi_launcher_variable(), nullptr);
  EXPECT_EQ(fsdp::comm::GlooRendezvous::from_env().master_port, 0);
}

// A peer that never comes: rank 0 of 3 says while it waits which ranks have not joined, then gives
// up after its connect timeout with one message naming them, with no C++ backtrace from c10d's
// store error in it (fsdp::message_of).
TEST(World, AMissingPeerIsNamedWhileWaitingAndAtTheTimeout) {
  const ScopedEnv env(no_launcher());
  fsdp::comm::GlooRendezvous rv;
  rv.rank = 0;
  rv.world_size = 3;
  rv.master_port = 0;  // rank 0 serves the store on a free port; ranks 1 and 2 are never started
  rv.connect_timeout_s = 2.0;
  testing::internal::CaptureStderr();
  const fsdp::Error e = error_of([&] { fsdp::comm::gloo_world(rv); });
  const std::string said = testing::internal::GetCapturedStderr();
  const std::string what = e.what();
  EXPECT_EQ(e.kind(), fsdp::ErrorKind::kTimeout) << what;
  EXPECT_TRUE(contains(what, "ranks 1, 2 did not join the rendezvous")) << what;
  EXPECT_TRUE(contains(what, "within 2 s")) << what;
  EXPECT_TRUE(contains(said, "rank 0: waiting for ranks 1, 2 to join the rendezvous")) << said;
  EXPECT_FALSE(contains(said, "[c10d]")) << said;  // no store warnings beside the notice
  EXPECT_FALSE(contains(what, "frame #")) << what;
  EXPECT_FALSE(contains(what, "Exception raised from")) << what;
}

// A rank whose TCP store server (rank 0) never comes says so while it waits, then fails at the
// timeout naming the store and the likely causes, with no C++ backtrace (c10d's client is built
// only once something listens: [Note: reaching the store]).
TEST(World, AStoreServerThatNeverComesIsNamedWhileWaiting) {
  const ScopedEnv env(no_launcher());
  fsdp::comm::GlooRendezvous rv;
  rv.rank = 1;
  rv.world_size = 2;
  rv.master_port = 29597;  // nothing listens there
  rv.connect_timeout_s = 2.0;
  testing::internal::CaptureStderr();
  const fsdp::Error e = error_of([&] { fsdp::comm::gloo_world(rv); });
  const std::string said = testing::internal::GetCapturedStderr();
  const std::string what = e.what();
  EXPECT_EQ(e.kind(), fsdp::ErrorKind::kTimeout) << what;
  EXPECT_TRUE(contains(what, "nothing answered at the TCP store 127.0.0.1:29597 (served by rank 0) within 2 s")) << what;
  EXPECT_TRUE(contains(what, "give every rank the same MASTER_ADDR and MASTER_PORT")) << what;
  EXPECT_FALSE(contains(said, "[c10d]")) << said;  // c10d never tried a connect: no warning, no backtrace
  EXPECT_TRUE(contains(said, "rank 1: still connecting to the TCP store 127.0.0.1:29597 (served by rank 0)")) << said;
  EXPECT_FALSE(contains(what, "Exception raised from")) << what;
}

// The same over a file store: two ranks of three join (threads of this process), the third is
// named by both.
TEST(World, AMissingPeerIsNamedOverAFileStore) {
  const ScopedEnv env(no_launcher());
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("fsdp-join-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  std::vector<std::string> whats(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      fsdp::comm::GlooRendezvous rv;
      rv.rank = r;
      rv.world_size = 3;
      rv.file_store_dir = dir;
      rv.connect_timeout_s = 1.0;
      whats[r] = error_of([&] { fsdp::comm::gloo_world(rv); }).what();
    });
  }
  for (auto& t : ranks) t.join();
  std::filesystem::remove_all(dir);
  for (const std::string& what : whats) EXPECT_TRUE(contains(what, "rank 2 did not join the rendezvous (file store")) << what;
}
