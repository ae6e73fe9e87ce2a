// Failure detection end to end, every party in its own process over loopback: a `switchml
// switch` (or a spine and two top-of-rack switches) and `switchml worker`s. A worker or the
// switch killed with SIGKILL in the middle of a job, and workers that disagree on the tensor's
// size or type: every surviving worker must fail with a clear error, quickly (issue 7: within
// 2 s; the assertions allow more for loaded CI machines, and each test prints the time it
// measured: "detected in X s").
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "process.h"

namespace switchml {
namespace {

using std::chrono::seconds;
using testing::Process;
using testing::SwitchProcess;

// The bound is 2 s; the assertion allows a loaded machine (2 cores shared with other
// builds and tests, sanitizers) more. The measured times are printed.
constexpr double kDetectBoundSeconds = 2.0;
constexpr double kAssertSeconds = 6.0;

SwitchProcess StartSwitch(const std::vector<std::string>& extra = {}) {
  SwitchProcess s = testing::StartSwitchProcess(extra);
  EXPECT_FALSE(s.control.empty()) << s.process->output();
  return s;
}

struct Job {
  uint32_t workers = 2;
  std::string size = "1000";
  std::string dtype = "float32";
  std::string iterations = "2";
  std::vector<std::string> extra;
};

std::unique_ptr<Process> StartWorker(const std::string& control, const Job& j, uint32_t rank,
                                     std::vector<std::string> rank_extra = {}) {
  testing::WorkerCommand w{control,
                           rank,
                           j.workers,
                           j.size,
                           j.dtype,
                           j.iterations,
                           {"--job-secret", "failure-test-secret"}};
  w.extra.insert(w.extra.end(), j.extra.begin(), j.extra.end());
  w.extra.insert(w.extra.end(), rank_extra.begin(), rank_extra.end());
  return testing::StartWorkerProcess(w);
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Waits for each of `ps` to exit; expects each to fail within the bound with `expected` in its
// output; prints and returns the slowest time.
double ExpectAllFailFast(const std::vector<Process*>& ps, std::chrono::steady_clock::time_point t0,
                         const std::string& expected, const std::string& what) {
  double slowest = 0;
  for (Process* p : ps) {
    const bool ended = p->Wait(std::chrono::milliseconds(static_cast<int>(kAssertSeconds * 1e3)));
    const double took = SecondsSince(t0);
    EXPECT_TRUE(ended) << what << ": a worker still runs after " << took << " s:\n" << p->output();
    if (!ended) continue;
    slowest = std::max(slowest, took);
    EXPECT_NE(p->exit_code(), 0) << p->output();
    // The worker's error line, for the log.
    const std::string out = p->output();
    const size_t at = out.rfind("failed: ");
    if (at != std::string::npos) {
      const size_t from = out.rfind('\n', at);
      const size_t to = out.find('\n', at);
      std::printf("  %s\n", out.substr(from == std::string::npos ? 0 : from + 1,
                                       to == std::string::npos ? std::string::npos : to - from - 1)
                                .c_str());
    }
    EXPECT_NE(p->output().find(expected), std::string::npos)
        << what << ": the error does not say \"" << expected << "\":\n"
        << p->output();
  }
  std::printf("%s: every worker failed; detected in %.3f s (the slowest; bound %.1f s)\n",
              what.c_str(), slowest, kDetectBoundSeconds);
  ::testing::Test::RecordProperty("detected_ms", static_cast<int>(slowest * 1e3));
  return slowest;
}

// Given a job of 3 workers under way (the peer timeout left at its default, 10 s), When rank 2
// is killed, Expect ranks 0 and 1 to fail within the bound, naming rank 2: the switch sees its
// control stream break and fails the job (before issue 7's fix: after the 10 s peer timeout,
// without naming the rank).
TEST(FailureProcessTest, KilledWorkerFailsEveryPeerNamingTheRank) {
  SwitchProcess sw = StartSwitch();
  ASSERT_FALSE(sw.control.empty());
  Job j{3, "2000000", "float32", "100000", {}};
  std::vector<std::unique_ptr<Process>> ps;
  for (uint32_t r = 0; r < j.workers; ++r) ps.push_back(StartWorker(sw.control, j, r));
  ASSERT_TRUE(ps[0]->WaitForOutput("iteration 3/", seconds(60))) << ps[0]->output();
  ps[2]->Kill(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  const double took = ExpectAllFailFast({ps[0].get(), ps[1].get()}, t0,
                                        "rank 2 lost its control connection", "killed worker");
  EXPECT_LE(took, kAssertSeconds);
}

// Given a job under way, When the switch process is killed, Expect every worker to fail within
// the bound saying it lost the switch (before: the workers noticed only when a barrier call
// waited out its timeout, or after the peer timeout).
TEST(FailureProcessTest, KilledSwitchFailsEveryWorker) {
  SwitchProcess sw = StartSwitch();
  ASSERT_FALSE(sw.control.empty());
  Job j{2, "2000000", "float32", "100000", {}};
  std::vector<std::unique_ptr<Process>> ps;
  for (uint32_t r = 0; r < j.workers; ++r) ps.push_back(StartWorker(sw.control, j, r));
  ASSERT_TRUE(ps[0]->WaitForOutput("iteration 3/", seconds(60))) << ps[0]->output();
  sw.process->Kill(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  // "lost the control connection to the switch at HOST:PORT" (the worker's stream), or "switch
  // control plane at HOST:PORT is unavailable" (a barrier under way): both name the switch.
  ExpectAllFailFast({ps[0].get(), ps[1].get()}, t0, sw.control, "killed switch");
  for (auto& p : ps) EXPECT_NE(p->output().find("UNAVAILABLE"), std::string::npos) << p->output();
}

// Counts the all-reduces a worker reported ("...: iteration N/M: ...").
size_t IterationsDone(const Process& p) {
  const std::string out = p.output();
  size_t n = 0;
  for (size_t at = out.find(": iteration "); at != std::string::npos;
       at = out.find(": iteration ", at + 1)) {
    ++n;
  }
  return n;
}

// Given a job under way, When the switch (or a worker) is stopped with SIGSTOP for 3 s and then
// continued, Expect the job to finish with verified results and nobody to report a lost
// connection: a stalled host (load, a VM's stolen time, a paused process) answers keepalive
// pings late but is not a vanished one (docs/protocol.md, 4.10). Before the keepalive timeout
// was raised from 1 s to 10 s, gRPC closed the stalled party's connections ("keepalive watchdog
// timeout") and the job failed.
TEST(FailureProcessTest, JobSurvivesAStalledSwitchOrWorker) {
  constexpr auto kStall = std::chrono::milliseconds(3000);
  for (const bool stall_switch : {true, false}) {
    const std::string what = stall_switch ? "stalled switch" : "stalled worker (rank 1)";
    SCOPED_TRACE(what);
    SwitchProcess sw = StartSwitch({"--log-level", "info"});
    ASSERT_FALSE(sw.control.empty());
    Job j{2, "1000", "float32", "400", {}};
    std::vector<std::unique_ptr<Process>> ps;
    for (uint32_t r = 0; r < j.workers; ++r) ps.push_back(StartWorker(sw.control, j, r));
    ASSERT_TRUE(ps[0]->WaitForOutput("iteration 3/", seconds(60))) << ps[0]->output();
    Process* stalled = stall_switch ? sw.process.get() : ps[1].get();
    stalled->Kill(SIGSTOP);
    // Lines rank 0 wrote before the stop may still be on their way through the pipe to this
    // test (seen on a loaded host: 10 counted, 18 once they arrived): let them arrive first.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const size_t before = IterationsDone(*ps[0]);
    // The stall must fall inside the job, or it proves nothing.
    ASSERT_TRUE(ps[0]->running()) << what << ": the job ended before the stall:\n"
                                  << ps[0]->output();
    std::this_thread::sleep_for(kStall);
    // Rank 0 waited for the stalled party (at most the all-reduce under way finished).
    EXPECT_LE(IterationsDone(*ps[0]), before + 1) << ps[0]->output();
    stalled->Kill(SIGCONT);
    for (auto& p : ps) {
      ASSERT_TRUE(p->Wait(seconds(60))) << what << ": a worker still runs:\n" << p->output();
      EXPECT_EQ(p->exit_code(), 0) << what << ":\n" << p->output();
      EXPECT_NE(p->output().find("status=ok verified=1"), std::string::npos) << p->output();
      EXPECT_EQ(p->output().find("lost the control connection"), std::string::npos) << p->output();
    }
    EXPECT_EQ(sw.process->output().find("lost its control connection"), std::string::npos)
        << sw.process->output();
    std::printf("%s: %zu of %s all-reduces done before a %.1f s stall; then the job ended\n",
                what.c_str(), before, j.iterations.c_str(),
                std::chrono::duration<double>(kStall).count());
  }
}

// Given workers that pass tensors of different sizes, or of different types, to the same
// all-reduce, Expect every worker to fail at once, the error naming both ranks and what each
// passed (before: a size mismatch hung one rank until its timeout; a float32/int32 mix gave the
// int32 rank garbage).
TEST(FailureProcessTest, MismatchedTensorSizeOrTypeFailsEveryWorker) {
  SwitchProcess sw = StartSwitch();
  ASSERT_FALSE(sw.control.empty());
  struct Case {
    std::vector<std::string> rank1;
    std::string expected;
  };
  for (const Case& c : {Case{{"--size", "300000"}, "300000 float32 elements"},
                        Case{{"--dtype", "int32"}, "200000 int32 elements"}}) {
    Job j{2, "200000", "float32", "2", {}};
    auto p0 = StartWorker(sw.control, j, 0);
    auto p1 = StartWorker(sw.control, j, 1, c.rank1);
    ASSERT_TRUE(p0->WaitForOutput("joined session", seconds(30))) << p0->output();
    const auto t0 = std::chrono::steady_clock::now();
    ExpectAllFailFast({p0.get(), p1.get()}, t0, "does not match across workers",
                      "mismatch " + c.rank1[0]);
    for (Process* p : {p0.get(), p1.get()}) {
      EXPECT_NE(p->output().find(c.expected), std::string::npos) << p->output();
      EXPECT_NE(p->output().find("200000 float32 elements"), std::string::npos) << p->output();
      EXPECT_EQ(p->output().find("wrong result"), std::string::npos) << p->output();
    }
  }
}

// A spine and two top-of-rack switches (racks of 2: ranks 0-1 and 2-3), each in its own process.
struct Hierarchy {
  SwitchProcess spine;
  std::vector<SwitchProcess> tors;
  bool ok() const {
    return !spine.control.empty() && tors.size() == 2 && !tors[0].control.empty() &&
           !tors[1].control.empty();
  }
};

Hierarchy StartHierarchy(const std::vector<std::string>& extra = {}) {
  Hierarchy h;
  h.spine = StartSwitch(extra);
  if (h.spine.control.empty()) return h;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {"--upstream", h.spine.control, "--racks",
                                     "2",          "--rack-index",  std::to_string(r)};
    args.insert(args.end(), extra.begin(), extra.end());
    h.tors.push_back(StartSwitch(args));
  }
  return h;
}

// Four workers, ranks 0-1 on rack 0's switch and 2-3 on rack 1's.
std::vector<std::unique_ptr<Process>> StartRackWorkers(
    const Hierarchy& h, const Job& j,
    const std::vector<std::vector<std::string>>& rank_extra = {}) {
  std::vector<std::unique_ptr<Process>> ps;
  for (uint32_t r = 0; r < 4; ++r) {
    ps.push_back(StartWorker(h.tors[r / 2].control, j, r,
                             r < rank_extra.size() ? rank_extra[r] : std::vector<std::string>{}));
  }
  return ps;
}

std::vector<Process*> AllBut(const std::vector<std::unique_ptr<Process>>& ps, size_t skip) {
  std::vector<Process*> out;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i != skip) out.push_back(ps[i].get());
  }
  return out;
}

// Given a job of 4 workers across two racks, When rank 1 (rack 0) is killed, Expect every other
// worker, those of rack 1 too, to fail within the bound naming rank 1 by its global rank: rack
// 0's switch sees its stream break, fails its job and reports why up its own stream; the spine
// fails the job on rack 1's switch, which fails its workers with that reason (before: the ToR
// refused worker streams, and the peers waited for the 10 s peer timeout; rack 1 was never told
// why).
TEST(FailureProcessTest, KilledWorkerInOneRackFailsEveryRackNamingTheRank) {
  Hierarchy h = StartHierarchy();
  ASSERT_TRUE(h.ok());
  Job j{4, "1000000", "float32", "100000", {}};
  auto ps = StartRackWorkers(h, j);
  ASSERT_TRUE(ps[0]->WaitForOutput("iteration 3/", seconds(60))) << ps[0]->output();
  ps[1]->Kill(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  ExpectAllFailFast(AllBut(ps, 1), t0, "rank 1 lost its control connection",
                    "two racks, killed worker");
}

// Given a job across two racks, When rack 1's switch is killed, Expect every worker to fail
// within the bound: rack 1's workers lose their switch, rack 0's are told by the spine that
// rack 1 (ranks 2..3) is gone.
TEST(FailureProcessTest, KilledTopOfRackSwitchFailsEveryRack) {
  Hierarchy h = StartHierarchy();
  ASSERT_TRUE(h.ok());
  Job j{4, "1000000", "float32", "100000", {}};
  auto ps = StartRackWorkers(h, j);
  ASSERT_TRUE(ps[0]->WaitForOutput("iteration 3/", seconds(60))) << ps[0]->output();
  h.tors[1].process->Kill(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  ExpectAllFailFast({ps[0].get(), ps[1].get()}, t0, "rack 1 (ranks 2..3) lost its control",
                    "two racks, killed top-of-rack switch (rack 0's workers)");
  ExpectAllFailFast({ps[2].get(), ps[3].get()}, t0, h.tors[1].control,
                    "two racks, killed top-of-rack switch (rack 1's workers)");
}

// Given a job across two racks, When the spine is killed, Expect every worker to fail within
// the bound, saying that the switch above their rack's is gone.
TEST(FailureProcessTest, KilledSpineFailsEveryRack) {
  Hierarchy h = StartHierarchy();
  ASSERT_TRUE(h.ok());
  Job j{4, "1000000", "float32", "100000", {}};
  auto ps = StartRackWorkers(h, j);
  ASSERT_TRUE(ps[0]->WaitForOutput("iteration 3/", seconds(60))) << ps[0]->output();
  h.spine.process->Kill(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  ExpectAllFailFast(AllBut(ps, 99), t0, h.spine.control, "two racks, killed spine");
}

// Given a job across two racks whose racks disagree on the tensor size (both of rack 1's workers
// pass another size), or whose workers in one rack disagree on the type, Expect every worker of
// both racks to fail at once, the error saying what each side passed.
TEST(FailureProcessTest, MismatchedTensorsAcrossRacksFailEveryWorker) {
  Hierarchy h = StartHierarchy();
  ASSERT_TRUE(h.ok());
  struct Case {
    std::vector<std::vector<std::string>> extra;
    std::vector<std::string> expected;
  };
  const std::vector<std::string> big = {"--size", "300000"};
  for (const Case& c :
       {Case{{{}, {}, big, big},
             {"rack 0 (ranks 0..1)", "rack 1 (ranks 2..3)", "300000 float32 elements"}},
        Case{{{}, {}, {}, {"--dtype", "int32"}}, {"rank 3", "200000 int32 elements"}}}) {
    Job j{4, "200000", "float32", "2", {}};
    auto ps = StartRackWorkers(h, j, c.extra);
    ASSERT_TRUE(ps[0]->WaitForOutput("joined session", seconds(30))) << ps[0]->output();
    const auto t0 = std::chrono::steady_clock::now();
    ExpectAllFailFast(AllBut(ps, 99), t0, "does not match across workers",
                      "two racks, mismatch " + c.expected.back());
    for (auto& p : ps) {
      for (const std::string& e : c.expected) {
        EXPECT_NE(p->output().find(e), std::string::npos) << e << ":\n" << p->output();
      }
    }
  }
}

// Given a job across two racks that ends normally, Expect every level to close it (the workers
// close at their rack's switch, each rack's switch at the spine): no job lingers for its lease.
TEST(FailureProcessTest, FinishedHierarchicalJobIsClosedAtEveryLevel) {
  Hierarchy h = StartHierarchy({"--log-level", "info"});
  ASSERT_TRUE(h.ok());
  Job j{4, "100000", "int32", "2", {"--session", "4242"}};
  auto ps = StartRackWorkers(h, j);
  for (auto& p : ps) {
    ASSERT_TRUE(p->Wait(seconds(60))) << p->output();
    EXPECT_EQ(p->exit_code(), 0) << p->output();
    EXPECT_NE(p->output().find("status=ok verified=1"), std::string::npos) << p->output();
  }
  for (SwitchProcess* s : {&h.tors[0], &h.tors[1], &h.spine}) {
    EXPECT_TRUE(s->process->WaitForOutput("session 4242 closed by all its ranks", seconds(5)))
        << s->process->output();
    EXPECT_EQ(s->process->output().find("lost its control connection"), std::string::npos)
        << s->process->output();
  }
}

}  // namespace
}  // namespace switchml
