// Barrier and Broadcast through the gRPC control plane, and the client's failure messages.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "control/control_client.h"
#include "control/control_server.h"
#include "control/switchml.grpc.pb.h"
#include "dataplane/switch.h"

namespace switchml::control {
namespace {

using namespace std::chrono_literals;

class ControlSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sw_ = std::make_unique<dataplane::LockedSwitch>(dataplane::SwitchConfig{});
    ControlServerOptions options;
    options.bind_address = "127.0.0.1";
    options.port = 0;
    auto server = ControlServer::Start(options, sw_.get());
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    target_ = "127.0.0.1:" + std::to_string(server_->port());
  }

  // Waits until exactly n sync calls wait on the server (fails after 5 s).
  void ExpectWaiting(uint32_t n) {
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (server_->registry().counts().waiting_calls != n &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_EQ(server_->registry().counts().waiting_calls, n);
  }

  std::unique_ptr<dataplane::LockedSwitch> sw_;
  std::unique_ptr<ControlServer> server_;
  std::string target_;
};

// Given 8 workers, the last arriving 200 ms late, expect none released before it arrived.
TEST_F(ControlSyncTest, EightThreadsAreReleasedTogether) {
  ControlClient client(target_, 10s);
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      if (i == 7) {
        std::this_thread::sleep_for(200ms);
      }
      arrived.fetch_add(1);
      Status st = client.Barrier(5, 8);
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (arrived.load() != 8) early.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(early.load(), 0);
  EXPECT_EQ(server_->registry().counts().waiting_calls, 0u);
}

// Given one worker waiting in each of two sessions' barriers, expect neither released by the
// other; each is released by its own second worker.
TEST_F(ControlSyncTest, ScopedBarriersDoNotReleaseEachOther) {
  ControlClient client(target_, 10s);
  auto a1 = std::async(std::launch::async, [&] { return client.Barrier(1, 2); });
  auto b1 = std::async(std::launch::async, [&] { return client.Barrier(2, 2); });
  ExpectWaiting(2);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(a1.wait_for(0ms), std::future_status::timeout);
  EXPECT_EQ(b1.wait_for(0ms), std::future_status::timeout);
  EXPECT_TRUE(client.Barrier(1, 2).ok());
  EXPECT_TRUE(a1.get().ok());
  EXPECT_EQ(b1.wait_for(100ms), std::future_status::timeout);
  EXPECT_TRUE(client.Barrier(2, 2).ok());
  EXPECT_TRUE(b1.get().ok());
}

TEST_F(ControlSyncTest, UnscopedBarrierWorksAndGroupsByNumWorkers) {
  ControlClient client(target_, 10s);
  std::vector<std::future<Status>> three;
  for (int i = 0; i < 2; ++i) {
    three.push_back(std::async(std::launch::async, [&] { return client.Barrier(0, 3); }));
  }
  // An unscoped barrier of another size is another group.
  auto two = std::async(std::launch::async, [&] { return client.Barrier(0, 2); });
  ExpectWaiting(3);
  EXPECT_TRUE(client.Barrier(0, 2).ok());
  EXPECT_TRUE(two.get().ok());
  EXPECT_TRUE(client.Barrier(0, 3).ok());
  for (auto& f : three) EXPECT_TRUE(f.get().ok());
}

// Given a worker waiting in a session's barrier of 2 and another arriving with 3, Expect both to
// fail at once with a message naming the mismatch, and later calls of that session too.
TEST_F(ControlSyncTest, MismatchedNumWorkersFailsTheWholeRound) {
  ControlClient client(target_, 10s);
  auto first = std::async(std::launch::async, [&] { return client.Barrier(9, 2); });
  ExpectWaiting(1);
  Status st = client.Barrier(9, 3);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("num_workers 3 of one worker does not match the 2"),
            std::string::npos)
      << st.message();
  Status waiting = first.get();
  EXPECT_EQ(waiting.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(waiting.message(), st.message());
  EXPECT_FALSE(client.Barrier(9, 2).ok());
}

// (The switch answers a tenth of the timeout early, at least 20 ms: these tests use 1 s or more,
// so that a loaded or sanitized run gets the switch's answer before the client's own deadline.)

// Given a worker whose barrier (without its rank, as a reference client calls it) times out,
// expect kDeadlineExceeded from the switch just before the deadline, saying how many workers did
// not arrive, and the next round needing a full set of fresh arrivals.
TEST_F(ControlSyncTest, TimedOutBarrierLeavesTheRound) {
  ControlClient impatient(target_, 1s);
  const auto start = std::chrono::steady_clock::now();
  Status st = impatient.Barrier(9, 2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(st.message(),
              ::testing::MatchesRegex("barrier of session 9 \\(2 workers\\): 1 of 2 workers did "
                                      "not arrive within [0-9]+ ms: did it fail or start "
                                      "with other arguments\\?"));
  ExpectWaiting(0);

  ControlClient client(target_, 10s);
  auto first = std::async(std::launch::async, [&] { return client.Barrier(9, 2); });
  ExpectWaiting(1);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(first.wait_for(0ms), std::future_status::timeout) << "released by a departed call";
  EXPECT_TRUE(client.Barrier(9, 2).ok());
  EXPECT_TRUE(first.get().ok());
}

// Given ranks 0 and 2 of 3 waiting and rank 1 absent, expect both to fail before their deadline
// naming rank 1 as the missing one.
TEST_F(ControlSyncTest, ExpiredBarrierNamesTheMissingRank) {
  ControlClient client(target_, 1s);
  auto zero = std::async(std::launch::async, [&] { return client.Barrier(21, 3, "", 0u); });
  auto two = std::async(std::launch::async, [&] { return client.Barrier(21, 3, "", 2u); });
  for (Status st : {zero.get(), two.get()}) {
    EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
    EXPECT_THAT(st.message(), ::testing::StartsWith("barrier of session 21 (3 workers): rank 1 "
                                                    "did not arrive within "));
    // The second to time out sees the first as having come and gone.
    EXPECT_THAT(st.message(),
                ::testing::AnyOf(::testing::HasSubstr("(waiting: ranks 0 and 2)"),
                                 ::testing::HasSubstr("(waiting: rank 0; arrived and timed out: "
                                                      "rank 2)"),
                                 ::testing::HasSubstr("(waiting: rank 2; arrived and timed out: "
                                                      "rank 0)")));
  }
  ExpectWaiting(0);
}

// Given rank 0 leaving at its deadline before rank 2 gives up, with rank 1 never arriving, expect
// rank 2's error to name rank 1 alone as missing and rank 0 as having come and left.
TEST_F(ControlSyncTest, ExpiredBarrierDoesNotBlameARankThatCameAndLeft) {
  ControlClient early(target_, 1s);
  ControlClient late(target_, 2500ms);
  auto zero = std::async(std::launch::async, [&] { return early.Barrier(22, 3, "", 0u); });
  ExpectWaiting(1);
  auto two = std::async(std::launch::async, [&] { return late.Barrier(22, 3, "", 2u); });
  const Status first = zero.get();
  EXPECT_EQ(first.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(first.message(), ::testing::HasSubstr("rank 1 did not arrive"));
  EXPECT_THAT(first.message(), ::testing::HasSubstr("(waiting: ranks 0 and 2)"));
  const Status second = two.get();
  EXPECT_EQ(second.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(second.message(), ::testing::HasSubstr("rank 1 did not arrive"));
  EXPECT_THAT(second.message(),
              ::testing::HasSubstr("(waiting: rank 2; arrived and timed out: rank 0)"));
}

// Given rank 0 timing out while rank 2 waits, and rank 1 arriving after that, expect rank 2's
// error to say that every rank came but not together, rather than name a missing rank.
TEST_F(ControlSyncTest, ExpiredBarrierWithNoRankMissingSaysTheyCameApart) {
  ControlClient early(target_, 1s);
  ControlClient late(target_, 2500ms);
  ControlClient patient(target_, 10s);
  auto zero = std::async(std::launch::async, [&] { return early.Barrier(23, 3, "", 0u); });
  ExpectWaiting(1);
  auto two = std::async(std::launch::async, [&] { return late.Barrier(23, 3, "", 2u); });
  EXPECT_EQ(zero.get().code(), StatusCode::kDeadlineExceeded);
  auto one = std::async(std::launch::async, [&] { return patient.Barrier(23, 3, "", 1u); });
  const Status st = two.get();
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(st.message(), ::testing::HasSubstr("every rank arrived, but not together: rank 0 "
                                                 "timed out before ranks 1 and 2 came"));
  EXPECT_THAT(st.message(), ::testing::HasSubstr("start the workers within each other's timeout"));
  patient.CancelCalls(CancelledError("test over"));
  one.get();
}

// Given an unscoped broadcast (how workers agree on a job id) with rank 1 of 2 absent, expect
// the switch's error to name rank 1 and the round once.
TEST_F(ControlSyncTest, ExpiredUnscopedBroadcastNamesTheMissingRank) {
  ControlClient client(target_, 1s);
  const Result<uint64_t> v = client.Broadcast(0, 7, 0, 2, 0);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(v.status().message(),
              ::testing::StartsWith("unscoped broadcast of 2 workers: rank 1 did not arrive "
                                    "within "));
}

// Given a waiting call without a deadline whose client cancels, expect it to leave the round.
TEST_F(ControlSyncTest, CancelledBarrierLeavesTheRound) {
  auto channel = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
  auto stub = switchml_proto::Sync::NewStub(channel);
  grpc::ClientContext ctx;
  switchml_proto::BarrierRequest req;
  req.set_session_id(12);
  req.set_num_workers(2);
  switchml_proto::BarrierResponse resp;
  auto call = std::async(std::launch::async, [&] { return stub->Barrier(&ctx, req, &resp); });
  ExpectWaiting(1);
  ctx.TryCancel();
  EXPECT_EQ(call.get().error_code(), grpc::StatusCode::CANCELLED);
  ExpectWaiting(0);

  ControlClient client(target_, 10s);
  auto first = std::async(std::launch::async, [&] { return client.Barrier(12, 2); });
  ExpectWaiting(1);
  EXPECT_EQ(first.wait_for(100ms), std::future_status::timeout) << "released by a departed call";
  EXPECT_TRUE(client.Barrier(12, 2).ok());
  EXPECT_TRUE(first.get().ok());
}

TEST_F(ControlSyncTest, BroadcastDeliversTheRootsValue) {
  ControlClient client(target_, 10s);
  for (uint32_t root : {2u, 0u}) {
    std::vector<std::future<Result<uint64_t>>> calls;
    for (uint32_t rank = 0; rank < 4; ++rank) {
      calls.push_back(std::async(std::launch::async, [&, rank] {
        return client.Broadcast(33, 1000 + rank, rank, 4, root);
      }));
    }
    for (auto& f : calls) {
      auto v = f.get();
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      EXPECT_EQ(*v, 1000 + root);
    }
  }
}

// Given a broadcast with a rank or root out of range, Expect it refused. Given a second caller
// with a rank already waiting (two workers with one rank), Expect the whole round to fail, and
// the session to be marked failed, instead of a round that completes with the wrong workers.
TEST_F(ControlSyncTest, BroadcastRefusesBadRanks) {
  ControlClient client(target_, 10s);
  EXPECT_EQ(client.Broadcast(33, 1, 0, 2, 2).status().code(), StatusCode::kInvalidArgument);
  auto first = std::async(std::launch::async, [&] { return client.Broadcast(33, 1, 1, 2, 0); });
  ExpectWaiting(1);
  auto dup = client.Broadcast(33, 2, 1, 2, 0);
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("rank 1 is already waiting"), std::string::npos);
  auto v = first.get();
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client.Broadcast(33, 7, 0, 2, 0).status().code(), StatusCode::kFailedPrecondition);
  // A broadcast in another session is unaffected.
  auto other = std::async(std::launch::async, [&] { return client.Broadcast(34, 1, 1, 2, 0); });
  auto root = client.Broadcast(34, 7, 0, 2, 0);
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  EXPECT_EQ(*root, 7u);
  ASSERT_TRUE(other.get().ok());
}

TEST_F(ControlSyncTest, ShutdownReleasesWaitingCalls) {
  ControlClient client(target_, 20s);
  auto waiting = std::async(std::launch::async, [&] { return client.Barrier(4, 2); });
  ExpectWaiting(1);
  const auto start = std::chrono::steady_clock::now();
  server_->Shutdown();
  Status st = waiting.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
}

// A TCP port on 127.0.0.1 where nothing listens (bound, then closed).
uint16_t UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(ControlClientTest, NoSwitchListeningFailsWithinTheTimeout) {
  const std::string target = "127.0.0.1:" + std::to_string(UnusedPort());
  ControlClient client(target, 500ms);
  const auto start = std::chrono::steady_clock::now();
  UdpSessionArgs args;
  args.job_id = 1;
  args.num_workers = 1;
  auto reply = client.UdpSession(args);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(reply.status().message(),
            "switch control plane at " + target +
                " did not answer within 500 ms: is `switchml switch` running there, and is "
                "--control-port right?");
  Status barrier = client.Barrier(1, 2);
  EXPECT_EQ(barrier.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(barrier.message().find("did not answer within 500 ms"), std::string::npos)
      << barrier.message();
}

// Given a worker that calls before the switch starts, expect the call to succeed once it does.
TEST(ControlClientTest, SwitchStartingLateIsFine) {
  const uint16_t port = UnusedPort();
  ControlClient client("127.0.0.1:" + std::to_string(port), 10s);
  auto barrier = std::async(std::launch::async, [&] { return client.Barrier(0, 1); });
  std::this_thread::sleep_for(300ms);
  dataplane::LockedSwitch sw{dataplane::SwitchConfig{}};
  ControlServerOptions options;
  options.bind_address = "127.0.0.1";
  options.port = port;
  auto server = ControlServer::Start(options, &sw);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const Status st = barrier.get();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

}  // namespace
}  // namespace switchml::control
