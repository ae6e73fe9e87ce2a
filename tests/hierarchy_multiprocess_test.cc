// Hierarchical aggregation over loopback, all in separate processes: one spine `switchml switch`,
// two top-of-rack `switchml switch --upstream` (racks 0 and 1), and `switchml worker`s with their
// global ranks, each pointed at its rack's switch. int32 results exact and float32 within the
// quantizer's bound (the workers verify both), without and with loss on every switch (each drops
// packets in both directions: every link of the hierarchy loses some).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
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

SwitchProcess StartSwitch(std::vector<std::string> extra) {
  SwitchProcess s = testing::StartSwitchProcess(extra);
  EXPECT_FALSE(s.control.empty()) << s.process->output();
  return s;
}

// Sends one datagram that is not a SwitchML packet to every data port of a switch.
void SendStrayDatagram(const SwitchProcess& s) {
  std::smatch m;
  const std::string out = s.process->output();
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex("data ports? ([0-9]+)[-0-9]* \\(UDP, transport [^,]*, ([0-9]+) thread")))
      << out;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  for (int k = 0; k < std::stoi(m[2].str()); ++k) {
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(static_cast<uint16_t>(std::stoi(m[1].str()) + k));
    const char stray[] = "stray";
    EXPECT_EQ(sendto(fd, stray, sizeof stray, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(sizeof stray));
  }
  close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // for the switch to take it
}

struct Case {
  const char* dtype;
  const char* size;
  const char* loss;
  std::vector<uint32_t> racks;  // workers per rack: rack r has ranks [r*N/R, (r+1)*N/R)
  std::vector<std::string> worker_extra;
  std::vector<std::string> switch_extra = {};  // for the spine and both ToRs
};

class HierarchyProcessTest : public ::testing::TestWithParam<Case> {};

TEST_P(HierarchyProcessTest, JobThroughTwoTorsAndASpine) {
  const Case& c = GetParam();
  const uint32_t racks = static_cast<uint32_t>(c.racks.size());
  auto with_extra = [&](std::vector<std::string> args) {
    args.insert(args.end(), c.switch_extra.begin(), c.switch_extra.end());
    return args;
  };
  SwitchProcess spine = StartSwitch(with_extra({"--loss", c.loss, "--seed", "7"}));
  ASSERT_FALSE(spine.control.empty());
  std::vector<SwitchProcess> tors;
  for (uint32_t r = 0; r < racks; ++r) {
    tors.push_back(StartSwitch(
        with_extra({"--upstream", spine.control, "--racks", std::to_string(racks), "--rack-index",
                    std::to_string(r), "--loss", c.loss, "--seed", std::to_string(11 + r)})));
    ASSERT_FALSE(tors.back().control.empty());
  }
  uint32_t n = 0;
  for (uint32_t k : c.racks) n += k;
  std::vector<std::unique_ptr<Process>> workers;
  uint32_t rank = 0;
  for (uint32_t r = 0; r < racks; ++r) {
    for (uint32_t i = 0; i < c.racks[r]; ++i, ++rank) {
      workers.push_back(testing::StartWorkerProcess(
          {tors[r].control, rank, n, c.size, c.dtype, "2", c.worker_extra}));
    }
  }
  for (uint32_t w = 0; w < n; ++w) {
    ASSERT_TRUE(workers[w]->Wait(seconds(120))) << "rank " << w << " still running:\n"
                                                << workers[w]->output();
    EXPECT_EQ(workers[w]->exit_code(), 0) << "rank " << w << ":\n" << workers[w]->output();
    EXPECT_NE(workers[w]->output().find("status=ok verified=1"), std::string::npos)
        << workers[w]->output();
  }
  // The results came down from the spine through both ToRs (their exit counters say so: the
  // switch-wide count, summed over the shards; a job's own table is gone once its workers
  // closed it and a shard saw any later datagram, such as a late retransmission, which this
  // stray datagram stands for).
  for (uint32_t r = 0; r < racks; ++r) {
    SendStrayDatagram(tors[r]);
    tors[r].process->Kill(SIGTERM);
    ASSERT_TRUE(tors[r].process->Wait(seconds(20)));
    const std::string out = tors[r].process->output();
    const std::regex summary("switch: [^\n]*upstream_results ([0-9]+)");
    uint64_t results = 0;
    for (auto it = std::sregex_iterator(out.begin(), out.end(), summary);
         it != std::sregex_iterator(); ++it) {
      results += std::stoull((*it)[1].str());
    }
    EXPECT_GT(results, 0u) << out;
  }
  spine.process->Kill(SIGTERM);
  ASSERT_TRUE(spine.process->Wait(seconds(20)));
}

INSTANTIATE_TEST_SUITE_P(
    Loopback, HierarchyProcessTest,
    ::testing::Values(
        Case{"int32", "300007", "0", {2, 2}, {}},
        Case{"float32", "300007", "0", {1, 2}, {"--threads", "2"}},
        Case{"int32", "100003", "0.01", {2, 2}, {}}, Case{"float32", "100003", "0.01", {1, 2}, {}},
        // Two data-plane threads on every switch, four worker threads: slots of
        // thread t go through ToR shard t mod 2 to spine shard t mod 2.
        Case{"int32", "200003", "0.01", {2, 2}, {"--threads", "4"}, {"--threads", "2"}},
        // Block-sparse all-reduces (docs/protocol.md 2.5): each ToR passes sparse on to the
        // spine; the announcement and the union slice are ordinary slices to both levels.
        Case{"int32",
             "300007",
             "0.01",
             {1, 2},
             {"--sparse", "--density", "0.02", "--overlap", "0.5", "--threads", "2"}}));


// Given two racks whose workers disagree on --sparse (rack 0's ask for block-sparse all-reduces,
// rack 1's do not; each rack agrees within itself, so each ToR accepts its own), Expect the spine
// to refuse the second rack's registration naming the field, that rack's workers to fail at setup
// with it, and rack 0's workers to fail too rather than wait forever for a job that cannot run.
TEST(HierarchyProcessMismatchTest, RacksThatDisagreeOnSparseAreRefusedAtTheSpine) {
  SwitchProcess spine = StartSwitch({});
  ASSERT_FALSE(spine.control.empty());
  std::vector<SwitchProcess> tors;
  for (uint32_t r = 0; r < 2; ++r) {
    tors.push_back(StartSwitch(
        {"--upstream", spine.control, "--racks", "2", "--rack-index", std::to_string(r)}));
    ASSERT_FALSE(tors.back().control.empty());
  }
  const std::vector<std::string> timeout = {"--setup-timeout-ms", "20000"};
  std::vector<std::unique_ptr<Process>> workers;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    const uint32_t rack = rank / 2;
    std::vector<std::string> extra = timeout;
    if (rack == 0) extra.push_back("--sparse");
    workers.push_back(
        testing::StartWorkerProcess({tors[rack].control, rank, 4, "1000", "int32", "2", extra}));
  }
  bool named = false;  // some worker was told which field disagrees
  for (uint32_t rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(workers[rank]->Wait(seconds(40)))
        << "rank " << rank << " hangs:\n" << workers[rank]->output();
    const std::string out = workers[rank]->output();
    EXPECT_NE(workers[rank]->exit_code(), 0) << "rank " << rank << ":\n" << out;
    EXPECT_EQ(out.find("status=ok"), std::string::npos) << "rank " << rank << ":\n" << out;
    named = named || out.find("sparse") != std::string::npos;
  }
  EXPECT_TRUE(named) << "no worker's error names sparse:\n"
                     << workers[2]->output() << "\n"
                     << workers[0]->output();
  for (SwitchProcess* s : {&tors[0], &tors[1], &spine}) {
    s->process->Kill(SIGTERM);
    ASSERT_TRUE(s->process->Wait(seconds(20)));
  }
}

}  // namespace
}  // namespace switchml
