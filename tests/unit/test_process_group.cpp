// Tier `unit`: ProcessGroup over hand-made backends: an error raised asynchronously on the
// communication thread comes back from Work::wait; validation happens on the calling thread;
// destroying a group drains its queue before the backend goes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "fsdp/comm/process_group.h"
#include "fsdp/comm/simulated_backend.h"
#include "fsdp/comm/threaded_backend.h"
#include "fsdp/common/check.h"

using fsdp::comm::Backend;
using fsdp::comm::ProcessGroup;
using fsdp::comm::ReduceOp;

namespace {

constexpr double kTimeoutMarker = -7.0;

// Rank 0 of a pretend 2-rank group: all_reduce doubles the tensor after `delay`, or fails with a
// collective error when the tensor's first element is negative (a timeout when it is
// kTimeoutMarker). Counts what it ran and whether it
// was destroyed while an op ran.
struct Probe {
  std::atomic<int> ran{0};
  std::atomic<bool> running{false};
  std::atomic<bool> destroyed_while_running{false};
  std::atomic<bool> destroyed{false};
};

class FakeBackend final : public Backend {
 public:
  FakeBackend(Probe& probe, std::chrono::milliseconds delay) : probe_(probe), delay_(delay) {}
  ~FakeBackend() override {
    if (probe_.running) probe_.destroyed_while_running = true;
    probe_.destroyed = true;
  }
  std::string name() const override { return "fake"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
  int64_t max_elements() const override { return 1000; }
  const std::vector<int>& host_of_ranks() const override { return hosts_; }
  void all_gather(const at::Tensor& out, const at::Tensor& in) override { out.view(-1).copy_(in.view(-1).repeat(2)); }
  void reduce_scatter(const at::Tensor&, const at::Tensor&, ReduceOp) override {}
  void all_reduce(const at::Tensor& t, ReduceOp) override {
    probe_.running = true;
    std::this_thread::sleep_for(delay_);
    const double first = t.view(-1)[0].item<double>();
    const bool fail = first < 0;
    probe_.running = false;
    if (first == kTimeoutMarker) {  // what the MPI backend throws after a SIGSTOP
      throw fsdp::Error(fsdp::ErrorKind::kTimeout, fsdp::ErrorContext{0, "", "fake_allreduce"},
                        "not complete after 9 s (deadline reached); this rank was suspended for 8 s of the wait");
    }
    if (fail) {
      throw fsdp::Error(fsdp::ErrorKind::kCollective, fsdp::ErrorContext{0, "", "fake_allreduce"},
                        "the transport lost the peer");
    }
    t.mul_(2);
    probe_.ran++;
  }
  void all_to_all(const at::Tensor& out, const at::Tensor& in) override { out.copy_(in); }
  void broadcast(const at::Tensor&, int) override {}
  void barrier() override {}
  std::unique_ptr<Backend> split(int, int) override { return std::make_unique<FakeBackend>(probe_, delay_); }
  // A pretend group of one process: a simulated control channel mirrors this rank's signature.
  std::unique_ptr<Backend> make_control_channel() override { return fsdp::comm::simulated_backend(size(), rank()); }
  [[noreturn]] void abort_job(int) override { std::abort(); }

 private:
  Probe& probe_;
  std::chrono::milliseconds delay_;
  std::vector<int> hosts_{0, 0};
};

}  // namespace

TEST(ProcessGroup, AsyncBackendErrorIsRethrownByWaitAndLaterOpsStillRun) {
  Probe probe;
  ProcessGroup g(std::make_unique<FakeBackend>(probe, std::chrono::milliseconds(20)));
  at::Tensor bad = at::full({4}, -1.0);
  at::Tensor good = at::full({4}, 3.0);
  auto w_bad = g.all_reduce(bad);     // fails on the communication thread, after the call returned
  auto w_good = g.all_reduce(good);   // queued behind it
  EXPECT_FALSE(w_bad->is_completed()) << "the op ran on the calling thread";
  for (int attempt = 0; attempt < 2; ++attempt) {  // every wait() rethrows the same error
    try {
      w_bad->wait();
      ADD_FAILURE() << "the backend's error was swallowed";
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kCollective);
      EXPECT_NE(std::string(e.what()).find("lost the peer"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[fsdp rank 0]"), std::string::npos) << e.what();
    }
  }
  w_good->wait();
  EXPECT_TRUE(at::equal(good, at::full({4}, 6.0)));
  EXPECT_EQ(probe.ran.load(), 1);
}

TEST(ProcessGroup, ValidationHappensOnTheCallingThreadBeforeAnythingIsQueued) {
  Probe probe;
  ProcessGroup g(std::make_unique<FakeBackend>(probe, std::chrono::milliseconds(0)));
  const auto before = g.stats().snapshot();
  auto expect_invalid = [&](auto&& issue, const char* needle) {
    try {
      issue();
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid([&] { g.all_reduce(at::empty({4}, at::TensorOptions().device(c10::kMeta))); }, "device");
  expect_invalid([&] { g.all_reduce(at::empty({1001})); }, "1000");  // the backend's element limit
  expect_invalid([&] { g.all_gather_into_tensor(at::empty({7}), at::empty({3})); }, "6 elements");
  expect_invalid([&] { g.all_to_all(at::empty({3}), at::empty({3})); }, "world size 2");
  expect_invalid([&] { g.all_reduce(at::empty({4, 4}).t()); }, "contiguous");
  const auto after = g.stats().snapshot();
  for (size_t k = 0; k < after.size(); ++k) EXPECT_EQ(after[k].calls, before[k].calls) << "a rejected op was counted";
  EXPECT_EQ(probe.ran.load(), 0);
}

TEST(ProcessGroup, DestructionFinishesQueuedOpsBeforeTheBackendGoes) {
  Probe probe;
  std::vector<at::Tensor> ts;
  std::vector<fsdp::comm::WorkPtr> works;
  {
    ProcessGroup g(std::make_unique<FakeBackend>(probe, std::chrono::milliseconds(15)));
    for (int i = 0; i < 4; ++i) {
      ts.push_back(at::ones({2}));
      works.push_back(g.all_reduce(ts.back()));
    }
  }  // destroyed with ops still queued
  EXPECT_TRUE(probe.destroyed.load());
  EXPECT_FALSE(probe.destroyed_while_running.load()) << "the backend was destroyed under a running op";
  EXPECT_EQ(probe.ran.load(), 4) << "queued ops were dropped";
  for (auto& w : works) {
    EXPECT_TRUE(w->is_completed());
    w->wait();
  }
  for (auto& t : ts) EXPECT_TRUE(at::equal(t, at::full({2}, 2.0)));
}

// [Note: host traffic]: the per-rank split of a collective's peer volume by host, exact values.
TEST(HostSplit, FormulaPerKind) {
  using fsdp::comm::CollectiveKind;
  using fsdp::comm::split_by_host;
  // 4 ranks, 2 per host, 4000 logical bytes: V = 3000 (all-gather), of which 1/3 from the host.
  auto ag = split_by_host(CollectiveKind::kAllGather, 4000, 4, 2);
  EXPECT_EQ(ag.intra_host_bytes, 1000);
  EXPECT_EQ(ag.inter_host_bytes, 2000);
  auto rs = split_by_host(CollectiveKind::kReduceScatter, 4000, 4, 2);
  EXPECT_EQ(rs.intra_host_bytes, 1000);
  EXPECT_EQ(rs.inter_host_bytes, 2000);
  auto ar = split_by_host(CollectiveKind::kAllReduce, 4000, 4, 2);  // V = 2 x 3000
  EXPECT_EQ(ar.intra_host_bytes, 2000);
  EXPECT_EQ(ar.inter_host_bytes, 4000);
  // One rank per host (hybrid_shard's replicate group of 2): everything crosses.
  auto rep = split_by_host(CollectiveKind::kAllReduce, 4000, 2, 1);
  EXPECT_EQ(rep.intra_host_bytes, 0);
  EXPECT_EQ(rep.inter_host_bytes, 4000);
  // All on one host: nothing crosses.
  auto local = split_by_host(CollectiveKind::kAllGather, 4000, 4, 4);
  EXPECT_EQ(local.intra_host_bytes, 3000);
  EXPECT_EQ(local.inter_host_bytes, 0);
  EXPECT_EQ(split_by_host(CollectiveKind::kBarrier, 0, 4, 2).inter_host_bytes, 0);
  EXPECT_EQ(split_by_host(CollectiveKind::kAllGather, 4000, 1, 1).intra_host_bytes, 0);
  EXPECT_THROW(split_by_host(CollectiveKind::kAllGather, 4000, 4, 5), fsdp::Error);
  EXPECT_THROW(split_by_host(CollectiveKind::kAllGather, -1, 4, 2), fsdp::Error);
}

// Threaded ranks on pretend hosts: the layout, the split groups' layouts, the stats' split and the
// per-host rule of hybrid_shard.
TEST(HostSplit, ThreadedHostsLayoutSplitsAndStats) {
  auto world = fsdp::comm::threaded_world(4, 2);
  EXPECT_EQ(world[0]->host_of_ranks(), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(world[3]->num_hosts(), 2);
  EXPECT_EQ(world[3]->host(), 1);
  EXPECT_EQ(world[3]->ranks_on_my_host(), 2);
  EXPECT_EQ(fsdp::comm::uniform_ranks_per_host(*world[1]), 2);
  std::vector<std::shared_ptr<ProcessGroup>> across(4), inside(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      across[r] = world[r]->split(r % 2, r);  // {0, 2}, {1, 3}: one rank per host
      inside[r] = world[r]->split(r / 2, r);  // {0, 1}, {2, 3}: one host
      auto out = at::zeros({4 * 250}, at::kFloat);
      world[r]->all_gather_into_tensor(out, at::ones({250}, at::kFloat))->wait();
      auto t = at::ones({100}, at::kFloat);
      across[r]->all_reduce(t)->wait();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(across[2]->host_of_ranks(), (std::vector<int>{0, 1}));
  EXPECT_EQ(inside[2]->host_of_ranks(), (std::vector<int>{0, 0}));
  EXPECT_EQ(inside[2]->num_hosts(), 1);
  const auto snap = world[0]->stats().snapshot();  // the family: world and its splits
  const auto& ag = snap[static_cast<int>(fsdp::comm::CollectiveKind::kAllGather)];
  const auto& ar = snap[static_cast<int>(fsdp::comm::CollectiveKind::kAllReduce)];
  EXPECT_EQ(ag.bytes, 4000);
  EXPECT_EQ(ag.intra_host_bytes, 1000);  // rank 1's block
  EXPECT_EQ(ag.inter_host_bytes, 2000);  // ranks 2 and 3's blocks
  EXPECT_EQ(ar.bytes, 400);
  EXPECT_EQ(ar.intra_host_bytes, 0);
  EXPECT_EQ(ar.inter_host_bytes, 400);
  auto one_host = fsdp::comm::threaded_world(3);
  EXPECT_EQ(one_host[2]->host_of_ranks(), (std::vector<int>{0, 0, 0}));
  EXPECT_THROW(fsdp::comm::threaded_world(4, 3), fsdp::Error);
}

// Hosts with different numbers of ranks, or ranks not consecutive per host, cannot hold one
// hybrid_shard shard group each: a clear error naming the layout.
TEST(HostSplit, UnevenHostsAreRejectedForPerHostGroups) {
  struct Uneven final : public Backend {
    explicit Uneven(std::vector<int> h) : hosts(std::move(h)) {}
    std::string name() const override { return "uneven"; }
    int rank() const override { return 0; }
    int size() const override { return static_cast<int>(hosts.size()); }
    c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
    int64_t max_elements() const override { return 1000; }
    const std::vector<int>& host_of_ranks() const override { return hosts; }
    void all_gather(const at::Tensor&, const at::Tensor&) override {}
    void reduce_scatter(const at::Tensor&, const at::Tensor&, ReduceOp) override {}
    void all_reduce(const at::Tensor&, ReduceOp) override {}
    void all_to_all(const at::Tensor&, const at::Tensor&) override {}
    void broadcast(const at::Tensor&, int) override {}
    void barrier() override {}
    std::unique_ptr<Backend> split(int, int) override { return nullptr; }
    std::unique_ptr<Backend> make_control_channel() override { return fsdp::comm::simulated_backend(size(), rank()); }
    [[noreturn]] void abort_job(int) override { std::abort(); }
    std::vector<int> hosts;
  };
  ProcessGroup three_one(std::make_unique<Uneven>(std::vector<int>{0, 0, 0, 1}));
  try {
    fsdp::comm::uniform_ranks_per_host(three_one);
    ADD_FAILURE() << "3 + 1 ranks per host accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("host 0: ranks 0 1 2; host 1: ranks 3"), std::string::npos) << e.what();
  }
  ProcessGroup interleaved(std::make_unique<Uneven>(std::vector<int>{0, 1, 0, 1}));
  EXPECT_THROW(fsdp::comm::uniform_ranks_per_host(interleaved), fsdp::Error);
  ProcessGroup even(std::make_unique<Uneven>(std::vector<int>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(fsdp::comm::uniform_ranks_per_host(even), 3);
  EXPECT_EQ(even.ranks_on_my_host(), 3);
}

// A timed-out collective is written to the flight recorder once, by the timeout itself, and that
// one dump already shows the op timed out with the backend's reason. A rank stopped with SIGSTOP
// and woken by the launcher's SIGCONT and SIGTERM may live for that one write only: had it shown
// the op still running, the diagnosis could not name the stopped rank.
TEST(FlightRecorder, ATimeoutIsDumpedOnceAndTheDumpSaysItTimedOutAndWhy) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fsdp-fr-timeout-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Probe probe;
  fsdp::comm::ProcessGroupOptions options;
  options.timeout_s = 5;
  options.abort_after_timeout = false;
  options.flight_recorder_dir = dir.string();
  auto backend = std::make_unique<FakeBackend>(probe, std::chrono::milliseconds(1));
  FakeBackend* left_behind = backend.get();
  auto control = backend->make_control_channel();
  fsdp::comm::Backend* control_left_behind = control.get();
  {
    ProcessGroup g(std::move(backend), std::move(control), options);
    auto w = g.all_reduce(at::full({4}, kTimeoutMarker));
    try {
      w->wait();
      ADD_FAILURE() << "the timeout was swallowed";
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kTimeout) << e.what();
    }
  }
  // A group broken by a timeout never frees its backend (a job's abort may still use it); with
  // abort_after_timeout off nothing does here, and the group's thread has ended. Nor its control
  // channel (the op that timed out may be the collective check on it).
  EXPECT_FALSE(probe.destroyed.load());
  if (!probe.destroyed.load()) {
    delete left_behind;
    delete control_left_behind;
  }
  std::ifstream in(dir / "rank-00000.json");
  ASSERT_TRUE(in) << "no dump in " << dir;
  const std::string dump((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The reason is the timeout's own line (a second dump would carry the backend's message).
  EXPECT_NE(dump.find("\"reason\": \"collective #"), std::string::npos) << dump;
  EXPECT_NE(dump.find("did not complete within 5 s on rank 0"), std::string::npos) << dump;
  EXPECT_NE(dump.find("\"state\": \"timed out\""), std::string::npos) << dump;
  EXPECT_EQ(dump.find("\"state\": \"running\""), std::string::npos) << dump;
  EXPECT_NE(dump.find("this rank was suspended for 8 s of the wait"), std::string::npos) << dump;
  fs::remove_all(dir);
}

// The flight recorder keeps the newest `capacity` records, oldest first; updates of an evicted
// record are ignored.
TEST(FlightRecorder, KeepsTheNewestRecordsInIssueOrder) {
  fsdp::comm::FlightRecorder rec(3);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) {
    fsdp::comm::CollectiveRecord r;
    r.seq = i;
    r.tag.phase = std::string(40, static_cast<char>('a' + i));  // not a short string
    ids.push_back(rec.add(std::move(r)));
    auto kept = rec.records();
    ASSERT_EQ(kept.size(), static_cast<size_t>(std::min(i + 1, 3)));
    for (size_t k = 0; k < kept.size(); ++k) EXPECT_EQ(kept[k].seq, i + 1 - static_cast<int>(kept.size()) + static_cast<int>(k));
  }
  rec.mark_done(ids[0], 1.0, fsdp::comm::OpState::kFailed, "evicted");  // ignored
  rec.mark_running(ids[3], 2.0);
  rec.mark_done(ids[4], 3.0, fsdp::comm::OpState::kCompleted, "");
  const auto kept = rec.records();
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].seq, 2);
  EXPECT_EQ(kept[0].state, fsdp::comm::OpState::kQueued);
  EXPECT_EQ(kept[1].state, fsdp::comm::OpState::kRunning);
  EXPECT_EQ(kept[1].start_s, 2.0);
  EXPECT_EQ(kept[2].state, fsdp::comm::OpState::kCompleted);
  EXPECT_EQ(kept[2].tag.phase, std::string(40, 'e'));
  for (const auto& r : kept) EXPECT_TRUE(r.error.empty()) << r.error;
}

// A dump that cannot be written (the disk full: the temporary file is /dev/full; a path under a
// file) says why, names the file and leaves no temporary behind; one that can is renamed into place.
TEST(FlightRecorder, DumpFailuresSayWhyAndLeaveNothingBehind) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fsdp-fr-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fsdp::comm::FlightRecorder rec(4);
  rec.add(fsdp::comm::CollectiveRecord{});
  std::string error;
  EXPECT_EQ(rec.dump(dir.string(), 0, 2, "test", &error), (dir / "rank-00000.json").string());
  EXPECT_TRUE(error.empty()) << error;
  EXPECT_FALSE(fs::exists(dir / "rank-00000.json.tmp"));
  if (fs::exists("/dev/full")) {
    fs::create_symlink("/dev/full", dir / "rank-00001.json.tmp");
    EXPECT_EQ(rec.dump(dir.string(), 1, 2, "test", &error), "");
    EXPECT_NE(error.find("cannot write '" + (dir / "rank-00001.json").string() + "': No space left on device"),
              std::string::npos) << error;
    EXPECT_FALSE(fs::exists(fs::symlink_status(dir / "rank-00001.json.tmp"))) << "a temporary was left";
    EXPECT_FALSE(fs::exists(dir / "rank-00001.json"));
  }
  std::ofstream(dir / "afile") << "x";
  error.clear();
  EXPECT_EQ(rec.dump((dir / "afile" / "fr").string(), 0, 2, "test", &error), "");
  EXPECT_NE(error.find("cannot write the flight recorder in"), std::string::npos) << error;
  fs::remove_all(dir);
}

// Two groups of one process (a hybrid job's shard and replica groups) can give up at the same
// moment and dump this rank's file together: every dump is written whole and renamed into place,
// none fails, no temporary is left, and the file keeps the first failure's reason.
TEST(FlightRecorder, DumpsOfOneRankAtOnceDoNotCollide) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fsdp-fr-race-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fsdp::comm::FlightRecorder rec(64);
  for (int i = 0; i < 64; ++i) rec.add(fsdp::comm::CollectiveRecord{});
  EXPECT_EQ(rec.dump(dir.string(), 3, 4, "the first failure"), (dir / "rank-00003.json").string());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        std::string error;
        if (rec.dump(dir.string(), 3, 4, "later", &error) != (dir / "rank-00003.json").string()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  std::ifstream in(dir / "rank-00003.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["records"].size(), 64u);
  EXPECT_EQ(j["reason"], "the first failure") << "a later dump kept the first reason";
  ASSERT_EQ(j["reasons"].size(), 101u);
  EXPECT_EQ(j["reasons"][0], "the first failure");
  EXPECT_EQ(j["reasons"][100], "later");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1) << "a temporary was left";
  fs::remove_all(dir);
}
