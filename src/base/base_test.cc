#include <gtest/gtest.h>
#include <sched.h>

#include <string>
#include <thread>
#include <vector>

#include "base/affinity.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "switchml/status.h"

namespace switchml {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, OkAndErrorToString) {
  EXPECT_EQ(Status().ToString(), "OK");
  EXPECT_EQ(DeadlineExceededError("no answer").ToString(), "DEADLINE_EXCEEDED: no answer");
}

TEST(StatusTest, AssignOrReturnPropagatesTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "odd: 3");
}

TEST(StatusTest, ResultFromOkStatusIsAnInternalError) {
  Result<int> r{Status()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(LoggingTest, SinkReceivesMessagesAtOrAboveLevel) {
  std::vector<std::string> got;
  SetLogSink([&](LogLevel, LogSubsystem, const std::string& m) { got.push_back(m); });
  SetLogLevel(LogLevel::kInfo);
  LOG(kDebug, kGeneral) << "hidden";
  LOG(kInfo, kControl) << "shown " << 42;
  SetLogSink(nullptr);
  SetLogLevel(LogLevel::kWarning);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], "shown 42");
}

}  // namespace
}  // namespace switchml

#include "base/endpoint.h"

namespace switchml {
namespace {

TEST(EndpointTest, ParsesAndPrintsDottedQuads) {
  uint32_t ip = 0;
  ASSERT_TRUE(ParseIpv4("127.0.0.1", &ip));
  EXPECT_EQ(ip, kLoopbackIpv4);
  EXPECT_EQ((Endpoint{ip, 48864}).ToString(), "127.0.0.1:48864");
  ASSERT_TRUE(ParseIpv4("10.200.3.255", &ip));
  EXPECT_EQ(Ipv4ToString(ip), "10.200.3.255");
  for (const char* bad : {"", "1.2.3", "1.2.3.4.5", "256.1.1.1", "a.b.c.d", "1..2.3", "1.2.3.4 "}) {
    EXPECT_FALSE(ParseIpv4(bad, &ip)) << bad;
  }
}

// Given: this process's allowed CPUs. Expect: a thread pinned to the last of them runs there and
// may run nowhere else; thread t's CPU is the t-th, round robin; a CPU that does not exist is
// refused with an error naming it, and the thread keeps its CPUs.
TEST(AffinityTest, PinsAThreadToOneAllowedCpu) {
  Result<std::vector<int>> cpus = AllowedCpus();
  ASSERT_TRUE(cpus.ok()) << cpus.status().ToString();
  ASSERT_FALSE(cpus->empty());
  EXPECT_EQ(CpuOfThread(*cpus, 0), cpus->front());
  EXPECT_EQ(CpuOfThread(*cpus, static_cast<uint32_t>(cpus->size())), cpus->front());
  EXPECT_EQ(CpuOfThread(*cpus, static_cast<uint32_t>(cpus->size()) - 1), cpus->back());
  std::thread t([&] {
    ASSERT_TRUE(PinCurrentThread(cpus->back()).ok());
    Result<std::vector<int>> now = AllowedCpus();
    ASSERT_TRUE(now.ok());
    EXPECT_EQ(*now, std::vector<int>{cpus->back()});
    EXPECT_EQ(sched_getcpu(), cpus->back());
  });
  t.join();
  std::thread u([&] {
    const Status st = PinCurrentThread(CPU_SETSIZE - 1);
    if (cpus->back() != CPU_SETSIZE - 1) {
      EXPECT_FALSE(st.ok());
      EXPECT_NE(st.message().find("CPU " + std::to_string(CPU_SETSIZE - 1)), std::string::npos)
          << st.ToString();
      EXPECT_EQ(*AllowedCpus(), *cpus);
    }
    EXPECT_FALSE(PinCurrentThread(-1).ok());
    PinDataThread(-1, LogSubsystem::kWorker);  // not pinned: the CPUs stay
    EXPECT_EQ(*AllowedCpus(), *cpus);
    if (cpus->back() != CPU_SETSIZE - 1) {
      PinDataThread(CPU_SETSIZE - 1, LogSubsystem::kWorker);  // warns, and the CPUs stay
      EXPECT_EQ(*AllowedCpus(), *cpus);
    }
  });
  u.join();
  std::thread v([&] {
    PinDataThread(cpus->front(), LogSubsystem::kDataplane);
    EXPECT_EQ(*AllowedCpus(), std::vector<int>{cpus->front()});
  });
  v.join();
}

}  // namespace
}  // namespace switchml
