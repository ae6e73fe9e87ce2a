// Multi-process tests over DPDK memif: a software switch (in this process, the memif server) and
// `switchml worker` processes (memif clients), and `switchml run --transport dpdk`. Skipped,
// saying why, where the build has no DPDK or EAL cannot start here.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "process.h"
#include "runtime/switch_daemon.h"
#include "transport/dpdk_test_util.h"

namespace switchml {
namespace {

using std::chrono::seconds;
using testing::Process;

class DpdkMultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status s = transport::DpdkReady(); !s.ok()) {
      GTEST_SKIP() << "dpdk cannot run here: " << s.ToString();
    }
  }

  static std::unique_ptr<runtime::SwitchDaemon> StartSwitch(uint32_t threads) {
    runtime::SwitchDaemonOptions o;
    o.bind_address = "127.0.0.1";
    o.data_port = 0;
    o.control_port = 0;
    o.threads = threads;
    o.transport = "dpdk";
    auto d = runtime::SwitchDaemon::Start(o);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::move(d).value() : nullptr;
  }

  static std::unique_ptr<Process> Worker(const runtime::SwitchDaemon& d, uint32_t rank,
                                         uint32_t workers, const std::string& size,
                                         const std::string& dtype, const std::string& threads) {
    return testing::StartWorkerProcess(
        {"127.0.0.1:" + std::to_string(d.control_port()),
         rank,
         workers,
         size,
         dtype,
         "2",
         {"--threads", threads, "--session", "7", "--transport", "dpdk"}});
  }
};

// Given a 2-thread memif switch and 4 worker processes of 2 threads each, Expect verified results
// and both shards to have served their worker threads.
TEST_F(DpdkMultiProcessTest, FourWorkersTwoThreadsEachOverMemif) {
  auto d = StartSwitch(2);
  ASSERT_NE(d, nullptr);
  EXPECT_NE(d->FormatCounters(false).find("memif server"), std::string::npos);
  std::vector<std::unique_ptr<Process>> ps;
  for (uint32_t r = 0; r < 4; ++r) ps.push_back(Worker(*d, r, 4, "1048583", "float32", "2"));
  for (uint32_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(ps[r]->Wait(seconds(120))) << "rank " << r << ":\n" << ps[r]->output();
    EXPECT_EQ(ps[r]->exit_code(), 0) << "rank " << r << ":\n" << ps[r]->output();
    EXPECT_NE(ps[r]->output().find("status=ok verified=1"), std::string::npos) << ps[r]->output();
  }
  for (const runtime::DaemonCounters& c : d->shard_counters()) {
    EXPECT_GT(c.received, 1000u);
    EXPECT_GT(c.sent, 1000u);
  }
  EXPECT_EQ(d->switch_counters().dropped_unknown_source, 0u);
}

// Given `switchml run --transport dpdk` with 1% loss each way, Expect every result verified (the
// workers recover the losses) and the run to say it used memif.
TEST_F(DpdkMultiProcessTest, RunCommandWithLossOverMemif) {
  Process p({testing::SwitchmlBinary(), "run", "--transport", "dpdk", "--workers", "3", "--size",
             "300001", "--dtype", "int32", "--iterations", "3", "--loss", "0.01"});
  ASSERT_TRUE(p.Wait(seconds(120))) << p.output();
  EXPECT_EQ(p.exit_code(), 0) << p.output();
  EXPECT_NE(p.output().find("switchml run: OK"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("memif server"), std::string::npos) << p.output();
}

// Given `switchml run --transport dpdk --auth-data` (the authenticated data plane over memif:
// tags written behind datagrams in the mbufs the transport lends), Expect every result verified
// and no tag failure at the switch or the workers.
TEST_F(DpdkMultiProcessTest, RunCommandWithAuthenticatedDataOverMemif) {
  Process p({testing::SwitchmlBinary(), "run", "--transport", "dpdk", "--workers", "2", "--size",
             "300001", "--dtype", "float32", "--iterations", "2", "--auth-data"});
  ASSERT_TRUE(p.Wait(seconds(120))) << p.output();
  EXPECT_EQ(p.exit_code(), 0) << p.output();
  EXPECT_NE(p.output().find("switchml run: OK"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("memif server"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("authenticated data plane:               on; tags that failed: 0 at "
                            "the switch, 0 at the workers"),
            std::string::npos)
      << p.output();
}

// Given a worker over dpdk and a switch over kernel UDP, Expect the worker to fail saying that no
// memif switch serves the data port, not to hang.
TEST_F(DpdkMultiProcessTest, WorkerWithoutMemifSwitchSaysWhy) {
  runtime::SwitchDaemonOptions o;
  o.bind_address = "127.0.0.1";
  o.data_port = 0;
  o.control_port = 0;
  auto d = runtime::SwitchDaemon::Start(o);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto w = Worker(**d, 0, 1, "1000", "float32", "1");
  ASSERT_TRUE(w->Wait(seconds(60))) << w->output();
  EXPECT_NE(w->exit_code(), 0);
  EXPECT_NE(w->output().find("is a switch with --transport dpdk serving data port"),
            std::string::npos)
      << w->output();
}

}  // namespace
}  // namespace switchml
