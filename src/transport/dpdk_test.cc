// The DPDK memif transport's doorbells (dpdk.cc): a receiver that sleeps is woken by the frames
// sent to it and by Wake(), not by the end of its sleep. The sleeps are capped at a minute here
// (SWITCHML_DPDK_MAX_SLEEP_US), so a missed ring shows as a Receive that returns nothing within
// its timeout. EAL runs in this test's own process; skipped, saying why, where it cannot start.
#include "transport/dpdk.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "transport/dpdk_test_util.h"
#include "transport/environment.h"
#include "transport/factory.h"
#include "transport/private_dir.h"
#include "transport/transport.h"

namespace switchml::transport {
namespace {

using std::chrono::milliseconds;

// Sets an environment variable for the transports opened in one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

class DpdkDoorbellTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status s = DpdkReady(); !s.ok()) GTEST_SKIP() << "dpdk cannot run here: " << s.ToString();
  }

  static std::unique_ptr<Transport> Open(bool switch_side) {
    TransportOptions o;
    o.kind = "dpdk";
    o.bind_ipv4 = kLoopbackIpv4;
    o.switch_side = switch_side;
    auto t = OpenTransport(o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }

  // `rounds` round trips between a worker (this thread) and a switch side that echoes (another
  // thread), each side waiting in Receive (no spinning: it sleeps at once). Returns how many
  // completed; every Receive must return a datagram within `each`.
  static int PingPong(Transport& sw, Transport& worker, int rounds, milliseconds each) {
    std::thread echo([&] {
      std::vector<RxDatagram> rx(8);
      for (int i = 0; i < rounds; ++i) {
        auto n = sw.Receive(rx, each);
        ASSERT_TRUE(n.ok()) << n.status().ToString();
        ASSERT_EQ(*n, 1u) << "switch side, round " << i << ": no datagram within the timeout";
        const TxDatagram back{rx[0].source, rx[0].data};
        auto s = sw.Send({&back, 1});
        ASSERT_TRUE(s.ok() && *s == 1u);
      }
    });
    std::vector<RxDatagram> rx(8);
    int done = 0;
    for (int i = 0; i < rounds; ++i) {
      const uint32_t value = static_cast<uint32_t>(i);
      const TxDatagram tx{sw.local_endpoint(),
                          {reinterpret_cast<const uint8_t*>(&value), sizeof(value)}};
      auto s = worker.Send({&tx, 1});
      if (!s.ok() || *s != 1u) break;
      auto n = worker.Receive(rx, each);
      if (!n.ok() || *n != 1u || rx[0].data.size() != sizeof(value)) {
        ADD_FAILURE() << "worker, round " << i << ": no echo within the timeout";
        break;
      }
      ++done;
    }
    echo.join();
    return done;
  }
};

// Given a switch side and a worker over memif that sleep up to a minute when idle, Expect 2000
// round trips, each Receive woken by the other side's frame within 5 s (a missed ring, e.g. a
// race between the receiver's last poll and the sender's look at its flag, would stall one).
TEST_F(DpdkDoorbellTest, SleepingReceiversAreWokenByEachFrame) {
  ScopedEnv sleep("SWITCHML_DPDK_MAX_SLEEP_US", "60000000");
  auto sw = Open(true);
  auto worker = Open(false);
  ASSERT_TRUE(sw && worker);
  ASSERT_EQ(PingPong(*sw, *worker, 1, milliseconds(5000)), 1);  // connected
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(PingPong(*sw, *worker, 2000, milliseconds(5000)), 2000);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

// Given a connected worker asleep in a Receive without a deadline (sleeps capped at a minute),
// Expect Wake() from another thread to end it at once (it rings the doorbell the worker took on
// connecting, not the one it had before).
TEST_F(DpdkDoorbellTest, WakeEndsASleepOnTheSharedDoorbell) {
  ScopedEnv sleep("SWITCHML_DPDK_MAX_SLEEP_US", "60000000");
  auto sw = Open(true);
  auto worker = Open(false);
  ASSERT_TRUE(sw && worker);
  ASSERT_EQ(PingPong(*sw, *worker, 1, milliseconds(5000)), 1);  // connected
  std::thread waker([&] {
    std::this_thread::sleep_for(milliseconds(50));
    worker->Wake();
  });
  std::vector<RxDatagram> rx(4);
  const auto start = std::chrono::steady_clock::now();
  auto r = worker->Receive(rx, std::chrono::hours(48));
  waker.join();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// Given a switch side and a worker that connected (each made its doorbell and the worker its
// memif id lock), Expect the lock directory to be this user's own, closed to everyone else, and
// its files 0600 (issue 28, found 2 and 3: it was /tmp/switchml-dpdk, 1777, whose files other
// users could replace with links or lock).
TEST_F(DpdkDoorbellTest, LockDirectoryAndFilesAreThisUsersOwn) {
  auto sw = Open(true);
  auto worker = Open(false);
  ASSERT_TRUE(sw && worker);
  ASSERT_EQ(PingPong(*sw, *worker, 1, milliseconds(5000)), 1);  // connected
  DpdkOptions from_env;
  ASSERT_TRUE(ReadDpdkEnvironment(ProcessEnvironment(), &from_env).ok());
  const std::string dir = PrivateDirectoryPath("dpdk", from_env.lock_dir);
  struct stat st {};
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0) << dir << ": " << std::strerror(errno);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_mode & 07777, 0700u) << std::oct << (st.st_mode & 07777);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    ASSERT_EQ(::lstat(e.path().c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode)) << e.path();
    EXPECT_EQ(st.st_mode & 07777, 0600u) << e.path() << " " << std::oct << (st.st_mode & 07777);
    ++files;
  }
  EXPECT_GT(files, 0);
}

// Given doorbells turned off (SWITCHML_DPDK_DOORBELL=off: naps of 20 us to 1 ms, the way of a
// device whose peers cannot ring), Expect the same exchange to work.
TEST_F(DpdkDoorbellTest, WithoutDoorbellsNapsStillCarryTheExchange) {
  ScopedEnv off("SWITCHML_DPDK_DOORBELL", "off");
  auto sw = Open(true);
  auto worker = Open(false);
  ASSERT_TRUE(sw && worker);
  EXPECT_EQ(PingPong(*sw, *worker, 200, milliseconds(5000)), 200);
}

// The listening unix sockets (flag __SO_ACCEPTCON in /proc/net/unix) bound to abstract name `name`.
int Listeners(const std::string& name) {
  std::ifstream in("/proc/net/unix");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string num, ref, proto, flags, type, st, inode, path;
    if (f >> num >> ref >> proto >> flags >> type >> st >> inode >> path && path == "@" + name &&
        flags == "00010000") {
      ++n;
    }
  }
  return n;
}

// Given a memif server opened and closed 30 times on the same port in one process, each time with
// a worker that leaves a datagram unread behind, Expect one listener on the socket throughout (it
// used to leak one per open: DPDK 22.11 frees the socket of a removed last device without closing
// its listener, which then collides and crashes EAL's interrupt thread), and each reopened port
// to carry a fresh exchange with none of the previous worker's datagrams.
TEST_F(DpdkDoorbellTest, ReopeningAMemifServerReusesItsListenerAndStartsClean) {
  uint16_t port = 0;
  for (int round = 0; round < 30; ++round) {
    TransportOptions o;
    o.kind = "dpdk";
    o.bind_ipv4 = kLoopbackIpv4;
    o.switch_side = true;
    o.port = port;
    auto sw = OpenTransport(o);
    ASSERT_TRUE(sw.ok()) << "round " << round << ": " << sw.status().ToString();
    port = (*sw)->local_endpoint().port;
    const std::string sock = "switchml-memif-" + std::to_string(port);
    EXPECT_EQ(Listeners(sock), 1) << "round " << round;
    auto worker = Open(false);
    ASSERT_TRUE(worker);
    std::vector<RxDatagram> rx(8);
    for (uint32_t value : {1000u + round, 0xdeadu}) {
      const TxDatagram tx{(*sw)->local_endpoint(),
                          {reinterpret_cast<const uint8_t*>(&value), sizeof(value)}};
      auto s = worker->Send({&tx, 1});
      ASSERT_TRUE(s.ok() && *s == 1u) << "round " << round;
      if (value == 0xdeadu) break;  // left unread: must not reach the next round's switch
      auto n = (*sw)->Receive(rx, milliseconds(5000));
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      ASSERT_EQ(*n, 1u) << "round " << round << ": nothing received on the reopened port";
      uint32_t got = 0;
      ASSERT_EQ(rx[0].data.size(), sizeof(got));
      std::memcpy(&got, rx[0].data.data(), sizeof(got));
      EXPECT_EQ(got, 1000u + round) << "round " << round << ": a stale datagram";
    }
    worker.reset();
    sw->reset();
    EXPECT_LE(Listeners(sock), 1) << "round " << round;
  }
}

// Replies built over the datagrams they answer (RxDatagram::reply_buffer): the switch side's
// received mbufs go back out without a copy, one to one worker and one to two (the second
// destination built in place once memif has copied the first).
class DpdkReplyBufferTest : public DpdkDoorbellTest {};

// Given a switch side and two workers over memif, each round both workers send a datagram;
// Expect each received datagram lent for a reply (reply_buffer at its bytes, max_datagram_bytes
// long), and the reply written over worker 1's datagram to reach both workers and the reply over
// worker 2's to reach worker 2, with their contents, for 3000 rounds (a double free or a lost
// mbuf of this path would corrupt a later round or exhaust the pool).
TEST_F(DpdkReplyBufferTest, RepliesOverReceivedDatagramsReachEveryDestination) {
  auto sw = Open(true);
  auto w1 = Open(false);
  auto w2 = Open(false);
  ASSERT_TRUE(sw && w1 && w2);
  const size_t len = 1034;
  std::vector<uint8_t> out(len);
  std::vector<RxDatagram> rx(8);
  for (uint32_t round = 0; round < 3000; ++round) {
    for (uint8_t w : {1, 2}) {
      std::fill(out.begin(), out.end(), static_cast<uint8_t>(w));
      std::memcpy(out.data(), &round, sizeof(round));
      const TxDatagram tx{sw->local_endpoint(), out};
      auto s = (w == 1 ? w1 : w2)->Send({&tx, 1});
      ASSERT_TRUE(s.ok() && *s == 1u) << "round " << round;
    }
    std::vector<RxDatagram> got;
    for (int tries = 0; got.size() < 2 && tries < 100; ++tries) {
      auto n = sw->Receive(rx, milliseconds(100));
      ASSERT_TRUE(n.ok());
      got.insert(got.end(), rx.begin(), rx.begin() + static_cast<long>(*n));
    }
    ASSERT_EQ(got.size(), 2u) << "round " << round;
    if (got[0].data[4] != 1) std::swap(got[0], got[1]);
    std::vector<TxDatagram> replies;
    for (size_t k = 0; k < 2; ++k) {
      RxDatagram& d = got[k];
      ASSERT_EQ(d.data.size(), len);
      ASSERT_EQ(d.reply_buffer.data(), d.data.data()) << "round " << round;
      ASSERT_EQ(d.reply_buffer.size(), sw->max_datagram_bytes());
      uint32_t seen;
      std::memcpy(&seen, d.data.data(), sizeof(seen));
      ASSERT_EQ(seen, round);
      // The reply: 10 + k, then the round, over the whole datagram.
      std::fill(d.reply_buffer.begin(), d.reply_buffer.begin() + len, static_cast<uint8_t>(10 + k));
      std::memcpy(d.reply_buffer.data() + 4, &round, sizeof(round));
    }
    const std::span<const uint8_t> r1(got[0].reply_buffer.data(), len);
    const std::span<const uint8_t> r2(got[1].reply_buffer.data(), len);
    replies.push_back({got[0].source, r1});
    replies.push_back({got[1].source, r1});
    replies.push_back({got[1].source, r2});
    auto s = sw->Send(replies);
    ASSERT_TRUE(s.ok() && *s == 3u) << "round " << round;
    for (auto* w : {w1.get(), w2.get()}) {
      const size_t want = w == w1.get() ? 1 : 2;
      std::vector<std::vector<uint8_t>> back;
      for (int tries = 0; back.size() < want && tries < 100; ++tries) {
        auto n = w->Receive(rx, milliseconds(100));
        ASSERT_TRUE(n.ok());
        for (size_t i = 0; i < *n; ++i) back.emplace_back(rx[i].data.begin(), rx[i].data.end());
      }
      ASSERT_EQ(back.size(), want) << "round " << round;
      for (size_t k = 0; k < want; ++k) {
        ASSERT_EQ(back[k].size(), len);
        uint32_t seen;
        std::memcpy(&seen, back[k].data() + 4, sizeof(seen));
        EXPECT_EQ(seen, round);
        EXPECT_EQ(back[k][0], 10 + k);
        EXPECT_EQ(back[k][len - 1], 10 + k) << "round " << round;
      }
    }
  }
}

}  // namespace
}  // namespace switchml::transport
