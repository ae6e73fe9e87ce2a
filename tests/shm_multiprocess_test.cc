// End to end over the shared-memory transport (--transport shm): a `switchml switch` process and
// `switchml worker` processes, and `switchml run`, all in a shm directory of the test's own
// (SWITCHML_SHM_DIR, inherited by the children), which must be empty again once they are gone.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "base/affinity.h"
#include "process.h"

namespace switchml {
namespace {

using std::chrono::seconds;
using testing::Process;

class ShmMultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/switchml-e2e-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::setenv("SWITCHML_SHM_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("SWITCHML_SHM_DIR");
    for (const std::string& f : Files()) ::unlink((dir_ + "/" + f).c_str());
    ::rmdir(dir_.c_str());
  }

  // The shm directory's files, each after a space ("" when it is empty), for a failure message.
  std::string FileNames() const {
    std::string names;
    for (const std::string& f : Files()) names += " " + f;
    return names;
  }

  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") out.push_back(n);
      }
      ::closedir(d);
    }
    return out;
  }

  static std::unique_ptr<Process> Worker(const std::string& control, uint32_t rank,
                                         uint32_t workers, const std::string& size,
                                         const std::string& iterations, const std::string& session,
                                         std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--threads", "2", "--session", session, "--transport", "shm"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return testing::StartWorkerProcess(
        {control, rank, workers, size, "float32", iterations, flags});
  }

  std::string dir_;
};

// The group_received= count of a worker's SWITCHML_RESULT line (-1: no such line).
long long GroupReceived(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("group_received=([0-9]+)"))) return -1;
  return std::stoll(m[1].str());
}

// Given a switch process and two worker processes of two threads each over shm, Expect every
// result verified, and no inbox left once the switch has stopped.
TEST_F(ShmMultiProcessTest, SwitchAndTwoWorkerProcessesVerifyTheirResults) {
  testing::SwitchProcess sw = testing::StartSwitchProcess({"--transport", "shm"});
  ASSERT_FALSE(sw.control.empty()) << sw.process->output();
  std::vector<std::unique_ptr<Process>> ps;
  for (uint32_t r = 0; r < 2; ++r) ps.push_back(Worker(sw.control, r, 2, "1048583", "3", "11"));
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(ps[r]->Wait(seconds(120))) << "rank " << r << ":\n" << ps[r]->output();
    EXPECT_EQ(ps[r]->exit_code(), 0) << "rank " << r << ":\n" << ps[r]->output();
    EXPECT_NE(ps[r]->output().find("status=ok verified=1"), std::string::npos) << ps[r]->output();
    // Over shm both sides use the job's groups by default (--multicast auto).
    EXPECT_GT(GroupReceived(ps[r]->output()), 0) << ps[r]->output();
  }
  // The workers' inboxes and groups went with them; the switch's inbox stays while it runs.
  EXPECT_EQ(Files().size(), 1u);
  sw.process->Kill(SIGINT);
  ASSERT_TRUE(sw.process->Wait(seconds(30))) << sw.process->output();
  EXPECT_TRUE(Files().empty()) << Files().front();
}

// Given a switch over shm that loses 1% of datagrams each way, and a job of three worker
// processes of two threads each, two of them in the job's groups (the default) and one not
// (--multicast off, as a reference worker), Expect every result verified: the members read each
// result once from the group's ring, the third gets its own copies, and results the switch lost
// (a group datagram lost is lost for every member) come back as unicast retransmissions.
TEST_F(ShmMultiProcessTest, GroupMembersAndANonMemberWithLossVerifyTheirResults) {
  testing::SwitchProcess sw =
      testing::StartSwitchProcess({"--transport", "shm", "--loss", "0.01", "--seed", "7"});
  ASSERT_FALSE(sw.control.empty()) << sw.process->output();
  std::vector<std::unique_ptr<Process>> ps;
  for (uint32_t r = 0; r < 3; ++r) {
    std::vector<std::string> extra = {"--timeout-ms", "2", "--min-timeout-us", "2000"};
    if (r == 2) extra.insert(extra.end(), {"--multicast", "off"});
    ps.push_back(Worker(sw.control, r, 3, "300007", "3", "31", extra));
  }
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(ps[r]->Wait(seconds(120))) << "rank " << r << ":\n" << ps[r]->output();
    EXPECT_EQ(ps[r]->exit_code(), 0) << "rank " << r << ":\n" << ps[r]->output();
    EXPECT_NE(ps[r]->output().find("status=ok verified=1"), std::string::npos) << ps[r]->output();
    if (r < 2) {
      EXPECT_GT(GroupReceived(ps[r]->output()), 0) << ps[r]->output();
    } else {
      EXPECT_EQ(GroupReceived(ps[r]->output()), 0) << ps[r]->output();
    }
  }
  EXPECT_EQ(Files().size(), 1u);  // the switch's inbox; the groups went with their members
  sw.process->Kill(SIGINT);
  ASSERT_TRUE(sw.process->Wait(seconds(30))) << sw.process->output();
}

// Given `switchml run --transport shm` with 1% loss each way (the loss wrapper around shm),
// Expect every result verified: the workers recover the losses.
TEST_F(ShmMultiProcessTest, RunCommandWithLoss) {
  Process p({testing::SwitchmlBinary(), "run", "--transport", "shm", "--workers", "3", "--size",
             "300001", "--dtype", "int32", "--iterations", "3", "--loss", "0.01"});
  ASSERT_TRUE(p.Wait(seconds(120))) << p.output();
  EXPECT_EQ(p.exit_code(), 0) << p.output();
  EXPECT_NE(p.output().find("switchml run: OK"), std::string::npos) << p.output();
  EXPECT_TRUE(Files().empty());
}

// Given jumbo packets (--packet-numel 2048, docs/protocol.md 2.6) over shm, Expect every float32
// result verified: ring entries hold the 8202-byte datagrams on both sides.
TEST_F(ShmMultiProcessTest, RunCommandWithJumboPackets) {
  Process p({testing::SwitchmlBinary(), "run", "--transport", "shm", "--workers", "2", "--size",
             "300001", "--dtype", "float32", "--iterations", "2", "--packet-numel", "2048"});
  ASSERT_TRUE(p.Wait(seconds(120))) << p.output();
  EXPECT_EQ(p.exit_code(), 0) << p.output();
  EXPECT_NE(p.output().find("switchml run: OK"), std::string::npos) << p.output();
  EXPECT_TRUE(Files().empty());
}

// Given `switchml run` without --transport, Expect it to choose shm (every process is on this
// host) and say so, with shm's automatic threads and window (2 worker and 2 switch threads on a
// host with 2 or more cores, window 1024), the threads pinned (--pin-threads auto) where they
// are as many as the CPUs this process may use; and given a shm directory that cannot be made,
// Expect it to say why and run the job over UDP instead, with one thread each and the rule's
// window (256), not pinned, verified either way.
TEST_F(ShmMultiProcessTest, RunCommandChoosesShmByDefaultAndFallsBackToUdp) {
  const std::vector<std::string> job = {
      testing::SwitchmlBinary(), "run", "--workers", "2", "--size", "100003", "--iterations", "2"};
  Process p(job);
  ASSERT_TRUE(p.Wait(seconds(120))) << p.output();
  EXPECT_EQ(p.exit_code(), 0) << p.output();
  EXPECT_NE(p.output().find("transport shm (auto)"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("over auth(shm)"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("switchml run: OK"), std::string::npos) << p.output();
  const bool two_cores = std::thread::hardware_concurrency() >= 2;
  EXPECT_NE(p.output().find(two_cores ? "2 workers x 2 threads" : "2 workers x 1 threads"),
            std::string::npos)
      << p.output();
  EXPECT_NE(p.output().find("window 1024,"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find(two_cores ? "by 2 threads" : "by 1 thread "), std::string::npos)
      << p.output();
  Result<std::vector<int>> cpus = AllowedCpus();
  ASSERT_TRUE(cpus.ok());
  const bool pinned = two_cores && cpus->size() == 2;
  EXPECT_EQ(p.output().find("threads (thread t of each process on CPU t),") != std::string::npos,
            pinned)
      << p.output();
  EXPECT_TRUE(Files().empty());

  const std::string not_a_dir = dir_ + "/plain-file";
  {
    FILE* f = std::fopen(not_a_dir.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  ::setenv("SWITCHML_SHM_DIR", (not_a_dir + "/sub").c_str(), 1);
  Process q(job);
  ASSERT_TRUE(q.Wait(seconds(120))) << q.output();
  ::setenv("SWITCHML_SHM_DIR", dir_.c_str(), 1);
  EXPECT_EQ(q.exit_code(), 0) << q.output();
  EXPECT_NE(q.output().find("transport udp (auto: shm cannot be used here: "), std::string::npos)
      << q.output();
  EXPECT_NE(q.output().find("switchml run: OK"), std::string::npos) << q.output();
  EXPECT_NE(q.output().find("2 workers x 1 threads"), std::string::npos) << q.output();
  EXPECT_NE(q.output().find("window 256,"), std::string::npos) << q.output();
  EXPECT_NE(q.output().find("by 1 thread "), std::string::npos) << q.output();
  EXPECT_EQ(q.output().find("on CPU t"), std::string::npos) << q.output();
  ::unlink(not_a_dir.c_str());
}

// Given `switchml run` over shm under way, When it is interrupted (SIGINT, as Ctrl-C; it
// stops its workers with SIGTERM, on which each removes its inboxes, not the group they share),
// Expect it to fail saying so and to leave no file behind in the shm directory (run removes
// what its workers left).
TEST_F(ShmMultiProcessTest, InterruptedRunLeavesNoFilesBehind) {
  Process p({testing::SwitchmlBinary(), "run", "--transport", "shm", "--workers", "2", "--size",
             "1000000", "--iterations", "100000", "--warmup", "0"});
  ASSERT_TRUE(p.WaitForOutput("iteration 2/", seconds(60))) << p.output();
  EXPECT_FALSE(Files().empty());
  p.Kill(SIGINT);
  ASSERT_TRUE(p.Wait(seconds(60))) << p.output();
  EXPECT_EQ(p.exit_code(), 1) << p.output();
  EXPECT_NE(p.output().find("FAILED: interrupted"), std::string::npos) << p.output();
  const std::string left = FileNames();
  EXPECT_TRUE(left.empty()) << "left behind:" << left;
}

// Given a `switchml worker` over shm waiting in its setup for a switch that is not there (its
// inbox made), When it is stopped with SIGTERM, Expect it to exit 1 saying it was interrupted
// and to leave no file behind (it used to die of the signal and leave its inbox).
TEST_F(ShmMultiProcessTest, WorkerStoppedBySigtermDuringSetupLeavesNoFilesBehind) {
  // A control port nobody listens on (the worker waits for it up to its setup timeout).
  std::unique_ptr<Process> p =
      Worker("127.0.0.1:1", 1, 2, "1000", "2", "31", {"--setup-timeout-ms", "60000"});
  const auto start = std::chrono::steady_clock::now();
  while (Files().empty() && std::chrono::steady_clock::now() - start < seconds(30)) {
    ::usleep(20000);
  }
  ASSERT_FALSE(Files().empty()) << "the worker made no inbox:\n" << p->output();
  p->Kill(SIGTERM);
  ASSERT_TRUE(p->Wait(seconds(30))) << p->output();
  EXPECT_EQ(p->exit_code(), 1) << p->output();
  EXPECT_NE(p->output().find("interrupted (SIGTERM)"), std::string::npos) << p->output();
  EXPECT_NE(p->output().find("status=error"), std::string::npos) << p->output();
  const std::string left = FileNames();
  EXPECT_TRUE(left.empty()) << "left behind:" << left;
}

// Given a job of two `switchml worker`s over shm under way, When one is interrupted (SIGINT, as
// Ctrl-C), Expect it to exit 1 saying so with its inboxes removed at once, its peer to fail,
// and, once the switch has stopped too, no file left.
TEST_F(ShmMultiProcessTest, WorkerInterruptedMidJobRemovesItsInboxes) {
  testing::SwitchProcess sw = testing::StartSwitchProcess({"--transport", "shm"});
  ASSERT_FALSE(sw.control.empty()) << sw.process->output();
  std::vector<std::unique_ptr<Process>> ps;
  ps.push_back(Worker(sw.control, 0, 2, "1000000", "100000", "32"));
  ps.push_back(Worker(sw.control, 1, 2, "1000000", "100000", "32", {"--udp-port", "39500"}));
  ASSERT_TRUE(ps[0]->WaitForOutput("iteration 2/", seconds(60))) << ps[0]->output();
  auto has = [&](const std::string& name) {
    const std::vector<std::string> files = Files();
    return std::find(files.begin(), files.end(), name) != files.end();
  };
  ASSERT_TRUE(has("inbox-39500") && has("inbox-39501"));
  ps[1]->Kill(SIGINT);
  ASSERT_TRUE(ps[1]->Wait(seconds(30))) << ps[1]->output();
  EXPECT_EQ(ps[1]->exit_code(), 1) << ps[1]->output();
  EXPECT_NE(ps[1]->output().find("interrupted (SIGINT)"), std::string::npos) << ps[1]->output();
  EXPECT_FALSE(has("inbox-39500") || has("inbox-39501")) << "rank 1 left its inboxes";
  ASSERT_TRUE(ps[0]->Wait(seconds(60))) << ps[0]->output();
  EXPECT_NE(ps[0]->exit_code(), 0) << ps[0]->output();
  sw.process->Kill(SIGTERM);
  ASSERT_TRUE(sw.process->Wait(seconds(30))) << sw.process->output();
  const std::string left = FileNames();
  EXPECT_TRUE(left.empty()) << "left behind:" << left;
}

// Given a job under way, When one worker process is killed (its rings in the switch's inbox
// left registered to a dead process, its own inbox left behind), Expect its peer to fail, and
// the same switch to serve a new job of two workers to verified results.
TEST_F(ShmMultiProcessTest, KilledWorkerLeavesTheSwitchServingTheNextJob) {
  testing::SwitchProcess sw = testing::StartSwitchProcess({"--transport", "shm"});
  ASSERT_FALSE(sw.control.empty()) << sw.process->output();
  std::vector<std::unique_ptr<Process>> ps;
  for (uint32_t r = 0; r < 2; ++r)
    ps.push_back(Worker(sw.control, r, 2, "2000000", "100000", "21"));
  ASSERT_TRUE(ps[0]->WaitForOutput("iteration 3/", seconds(60))) << ps[0]->output();
  ps[1]->Kill(SIGKILL);
  ASSERT_TRUE(ps[0]->Wait(seconds(60))) << ps[0]->output();
  EXPECT_NE(ps[0]->exit_code(), 0) << ps[0]->output();
  ps.clear();
  for (uint32_t r = 0; r < 2; ++r) ps.push_back(Worker(sw.control, r, 2, "300000", "2", "22"));
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(ps[r]->Wait(seconds(120))) << "rank " << r << ":\n" << ps[r]->output();
    EXPECT_EQ(ps[r]->exit_code(), 0) << "rank " << r << ":\n" << ps[r]->output();
    EXPECT_NE(ps[r]->output().find("status=ok verified=1"), std::string::npos) << ps[r]->output();
  }
  sw.process->Kill(SIGINT);
  ASSERT_TRUE(sw.process->Wait(seconds(30))) << sw.process->output();
}

}  // namespace
}  // namespace switchml
