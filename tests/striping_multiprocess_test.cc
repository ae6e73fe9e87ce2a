// A job striped over several switch hosts, every party in its own process over loopback:
// `switchml switch` processes and `switchml worker --switch h1,h2,...` processes. Every result
// is verified by the workers (--report: "status=ok verified=1"); a switch killed with SIGKILL in
// the middle of a run is failed over and the run completes; bad host lists are refused at setup
// with an error that names what to fix.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "process.h"

namespace switchml {
namespace {

using std::chrono::seconds;
using testing::Process;
using testing::SwitchProcess;

constexpr char kSecret[] = "striping-test-secret";

struct Switches {
  std::vector<SwitchProcess> processes;
  std::string list;  // "127.0.0.1:p1,127.0.0.1:p2,..."
};

Switches StartSwitches(size_t k, const std::vector<std::string>& extra = {}) {
  Switches s;
  for (size_t i = 0; i < k; ++i) {
    s.processes.push_back(testing::StartSwitchProcess(extra));
    EXPECT_FALSE(s.processes.back().control.empty()) << s.processes.back().process->output();
    s.list += (i == 0 ? "" : ",") + s.processes.back().control;
  }
  return s;
}

struct Job {
  std::string switches;
  uint32_t workers = 2;
  std::string size = "100000";
  std::string dtype = "float32";
  std::string iterations = "3";
  std::vector<std::string> extra;
};

std::vector<std::unique_ptr<Process>> StartWorkers(const Job& j) {
  std::vector<std::unique_ptr<Process>> ps;
  for (uint32_t r = 0; r < j.workers; ++r) {
    testing::WorkerCommand w{
        j.switches, r, j.workers, j.size, j.dtype, j.iterations, {"--job-secret", kSecret}};
    w.extra.insert(w.extra.end(), j.extra.begin(), j.extra.end());
    ps.push_back(testing::StartWorkerProcess(w));
  }
  return ps;
}

void ExpectAllVerified(std::vector<std::unique_ptr<Process>>& ps, seconds timeout) {
  for (auto& p : ps) {
    ASSERT_TRUE(p->Wait(timeout)) << p->output();
    EXPECT_EQ(p->exit_code(), 0) << p->output();
    EXPECT_NE(p->output().find("status=ok verified=1"), std::string::npos) << p->output();
  }
}

// Given 2 switches and 3 workers, Expect int32 sums exact and float32 within the bound (the
// workers verify), each switch aggregating a share (its counters show packets of the job).
TEST(StripingProcessTest, TwoSwitchesInt32ExactAndFloat32WithinTheBound) {
  Switches s = StartSwitches(2);
  for (const char* dtype : {"int32", "float32"}) {
    Job j{s.list, 3,   "300001",
          dtype,  "3", {"--session", std::string(dtype) == "int32" ? "11" : "12"}};
    auto ps = StartWorkers(j);
    ExpectAllVerified(ps, seconds(120));
  }
  // Each switch saw the job's packets (SIGUSR1 prints the counters).
  for (SwitchProcess& sp : s.processes) {
    sp.process->Kill(SIGUSR1);
    EXPECT_TRUE(sp.process->WaitForOutput("received", seconds(10))) << sp.process->output();
    std::smatch m;
    const std::string out = sp.process->output();
    ASSERT_TRUE(std::regex_search(out, m, std::regex("received ([0-9]+)"))) << out;
    EXPECT_GT(std::stoull(m[1].str()), 1000u) << out;
  }
}

// Given 3 switches, 2 workers of 2 threads each and a window of 100 per worker (50 slots per
// thread: 17, 17 and 16 per switch), and a size that is no multiple of a packet, Expect every
// result verified.
TEST(StripingProcessTest, ThreeSwitchesUnevenShares) {
  Switches s = StartSwitches(3);
  Job j{s.list, 2, "123457", "float32", "3", {"--threads", "2", "--window", "100"}};
  auto ps = StartWorkers(j);
  ExpectAllVerified(ps, seconds(120));
}

// Given 2 switches and the authenticated data plane (a key per switch), Expect every result
// verified and no datagram refused.
TEST(StripingProcessTest, AuthenticatedDataPlaneKeysEachSwitch) {
  Switches s = StartSwitches(2);
  Job j{s.list, 2, "100000", "int32", "3", {"--auth-data"}};
  auto ps = StartWorkers(j);
  ExpectAllVerified(ps, seconds(120));
  for (auto& p : ps) EXPECT_NE(p->output().find("auth_dropped=0"), std::string::npos);
}

// Given 4 switches and 3 workers running 10 all-reduces of 16 MiB, When one switch is killed
// with SIGKILL about the sixth (a moment after the fifth was verified), Expect every worker to move
// off it (each says so), the run to complete with every result verified, and the next all-reduce to
// complete within the 2 s (asserted with room for a loaded machine; the time measured is
// printed).
TEST(StripingProcessTest, AKilledSwitchIsFailedOverAndTheRunCompletes) {
  Switches s = StartSwitches(4);
  Job j{s.list, 3, "4M", "float32", "10", {"--session", "21"}};
  auto ps = StartWorkers(j);
  ASSERT_TRUE(ps[0]->WaitForOutput("iteration 5/", seconds(120))) << ps[0]->output();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  s.processes[2].process->Kill(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  const size_t seen = ps[0]->output().size();
  // The first iteration line rank 0 prints after the kill.
  double took = -1;
  while (took < 0 && std::chrono::steady_clock::now() - killed < seconds(30)) {
    if (ps[0]->output().find(" iteration ", seen) != std::string::npos) {
      took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    } else if (!ps[0]->running()) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ExpectAllVerified(ps, seconds(120));
  for (auto& p : ps) {
    EXPECT_NE(p->output().find("is gone"), std::string::npos) << p->output();
    const std::string out = p->output();
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, std::regex("moved off in [^\n]*"))) << out;
    if (!m.empty()) std::printf("  %s\n", m[0].str().c_str());
  }
  std::printf("killed switch: the next all-reduce completed %.3f s after the kill\n", took);
  ::testing::Test::RecordProperty("failover_ms", static_cast<int>(took * 1e3));
  EXPECT_GE(took, 0) << "no iteration completed after the kill";
  EXPECT_LE(took, 6.0);
}

// Given a list with a host where no switch listens, Expect setup to fail within the setup
// timeout, naming that host.
TEST(StripingProcessTest, AnUnreachableHostIsNamed) {
  Switches s = StartSwitches(1);
  const std::string dead = "127.0.0.1:1";
  Job j{s.list + "," + dead, 1, "1000", "int32", "1", {"--setup-timeout-ms", "2000"}};
  auto ps = StartWorkers(j);
  ASSERT_TRUE(ps[0]->Wait(seconds(60))) << ps[0]->output();
  EXPECT_NE(ps[0]->exit_code(), 0);
  EXPECT_NE(ps[0]->output().find(dead), std::string::npos) << ps[0]->output();
}

// Given a host listed twice, Expect the worker to refuse the flag at once.
TEST(StripingProcessTest, AHostListedTwiceIsRefused) {
  Switches s = StartSwitches(1);
  Job j{s.list + "," + s.list, 1, "1000", "int32", "1", {}};
  auto ps = StartWorkers(j);
  ASSERT_TRUE(ps[0]->Wait(seconds(30))) << ps[0]->output();
  EXPECT_EQ(ps[0]->exit_code(), 2) << ps[0]->output();
  EXPECT_NE(ps[0]->output().find("twice"), std::string::npos) << ps[0]->output();
}

// Given two workers that list different switches (rank 1 names a third instead of the second),
// Expect both to fail at setup with an error that shows both lists.
TEST(StripingProcessTest, WorkersWithDifferentListsAreRefusedAtSetup) {
  Switches s = StartSwitches(3);
  const std::string a = s.processes[0].control, b = s.processes[1].control,
                    c = s.processes[2].control;
  std::vector<std::unique_ptr<Process>> ps;
  for (uint32_t r = 0; r < 2; ++r) {
    testing::WorkerCommand w{
        r == 0 ? a + "," + b : a + "," + c,          r, 2, "1000", "int32", "1",
        {"--job-secret", kSecret, "--session", "31"}};
    ps.push_back(testing::StartWorkerProcess(w));
  }
  for (auto& p : ps) {
    ASSERT_TRUE(p->Wait(seconds(60))) << p->output();
    EXPECT_NE(p->exit_code(), 0) << p->output();
  }
  const std::string out = ps[1]->output();
  EXPECT_NE(out.find("switch hosts"), std::string::npos) << out;
  EXPECT_NE(out.find(b), std::string::npos) << out;
  EXPECT_NE(out.find(c), std::string::npos) << out;
}

// `switchml run --switches 3`: the main job striped over three local switches.
TEST(StripingProcessTest, RunStripesOverLocalSwitches) {
  Process p({testing::SwitchmlBinary(), "run", "--workers", "2", "--switches", "3", "--size",
             "100000", "--iterations", "2", "--transport", "udp"});
  ASSERT_TRUE(p.Wait(seconds(120))) << p.output();
  EXPECT_EQ(p.exit_code(), 0) << p.output();
  EXPECT_NE(p.output().find("striped over the 3 switches"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("every result verified"), std::string::npos) << p.output();
}

}  // namespace
}  // namespace switchml
