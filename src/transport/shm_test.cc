// Tests of the shared-memory transport beyond the conformance suite: ring wrap-around and full
// rings, destinations without an inbox, ports in use and stale inboxes, senders that die (in a
// child process), malformed ring contents, wake-ups across processes, closing, and transmit
// memory lent in the destination's ring (TxBufferTo).
#include "transport/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "testing/forge.h"
#include "transport/auth.h"

namespace switchml::transport {
namespace {

using std::chrono::milliseconds;

// The inbox layout (shm.h) as far as the tests that forge ring contents need it: with at most
// 120 senders (the default is 256) the header is one page; ring e starts at 4096 + e * ring_bytes;
// in a ring the producer index is at 0, the slots from 128, each a uint32_t length and then the
// data.
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kRingHead = 0, kRingSlots = 128;
constexpr size_t kSlotBytes2048 = 2112;  // a slot for 2048-byte datagrams: 8 + 2048, 64-aligned

// Forks a child process that opens a transport with `options` (a free port), waits `delay`,
// sends `payload` to `to` once and exits without closing anything (its ring stays registered to
// a dead pid): 0 when the datagram was sent (datagrams_sent == 1), 1 when the transport did not
// open, 2 when the send failed. Returns the child's pid (-1: fork failed).
pid_t ForkSenderThatExits(const TransportOptions& options, const Endpoint& to,
                          const std::vector<uint8_t>& payload, milliseconds delay) {
  const pid_t child = ::fork();
  if (child != 0) return child;
  auto t = OpenShmConsecutive(options, 1);
  if (!t.ok()) ::_exit(1);
  std::this_thread::sleep_for(delay);
  const TxDatagram tx{to, payload};
  if (!(*t)[0]->Send({&tx, 1}).ok() || (*t)[0]->counters().datagrams_sent != 1) ::_exit(2);
  ::_exit(0);  // no destructors
}

class ShmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/switchml-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") ::unlink((dir_ + "/" + n).c_str());
      }
      ::closedir(d);
    }
    ::rmdir(dir_.c_str());
  }

  TransportOptions Options(uint16_t port = 0) const {
    TransportOptions o;
    o.bind_ipv4 = kLoopbackIpv4;
    o.port = port;
    o.shm.directory = dir_;
    return o;
  }
  std::unique_ptr<Transport> Open(TransportOptions o) {
    auto ts = OpenShmConsecutive(o, 1);
    EXPECT_TRUE(ts.ok()) << ts.status().ToString();
    return ts.ok() ? std::move((*ts)[0]) : nullptr;
  }
  std::string InboxPath(uint16_t port) const { return dir_ + "/inbox-" + std::to_string(port); }
  size_t FileCount() const {
    size_t n = 0;
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
      ::closedir(d);
    }
    return n;
  }

  std::string dir_;
};

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i);
  return v;
}

// Given a ring of 8 slots, Expect a batch of 10 to stop at 8 (send_buffer_full), the slots to
// come back only on the receiver's next Receive, and many rounds across the ring's end to
// arrive intact and in order.
TEST_F(ShmTest, FullRingStopsTheBatchAndTheRingWrapsAround) {
  TransportOptions o = Options();
  o.shm.ring_slots = 8;
  auto a = Open(o), b = Open(o);
  ASSERT_TRUE(a && b);
  std::vector<std::vector<uint8_t>> payloads;
  for (uint8_t i = 0; i < 10; ++i) payloads.push_back(Bytes(100 + i, i));
  std::vector<TxDatagram> tx;
  for (auto& p : payloads) tx.push_back({b->local_endpoint(), p});
  ASSERT_EQ(*a->Send(tx), 8u);
  EXPECT_EQ(a->counters().send_buffer_full, 1u);
  std::vector<RxDatagram> rx(16);
  ASSERT_EQ(*b->Receive(rx, milliseconds(0)), 8u);
  // The 8 views are still lent: the ring stays full until the next Receive.
  EXPECT_EQ(*a->Send(std::span(tx).subspan(8)), 0u);
  for (size_t i = 0; i < 8; ++i)
    EXPECT_EQ(std::vector<uint8_t>(rx[i].data.begin(), rx[i].data.end()), payloads[i]);
  ASSERT_EQ(*b->Receive(rx, milliseconds(0)), 0u);  // returns them
  ASSERT_EQ(*a->Send(std::span(tx).subspan(8)), 2u);
  ASSERT_EQ(*b->Receive(rx, milliseconds(0)), 2u);
  EXPECT_EQ(std::vector<uint8_t>(rx[1].data.begin(), rx[1].data.end()), payloads[9]);
  // Rounds of 4: with the previous round's 4 still lent, the ring is exactly full.
  uint32_t next = 0, expect = 0;
  for (int round = 0; round < 50; ++round) {
    std::vector<std::vector<uint8_t>> p;
    for (int k = 0; k < 4; ++k, ++next) {
      p.push_back(Bytes(4 + next % 50, 0));
      std::memcpy(p.back().data(), &next, 4);
    }
    std::vector<TxDatagram> t;
    for (auto& x : p) t.push_back({b->local_endpoint(), x});
    ASSERT_EQ(*a->Send(t), 4u);
    auto n = b->Receive(rx, milliseconds(100));
    ASSERT_EQ(*n, 4u);
    for (size_t i = 0; i < 4; ++i, ++expect) {
      uint32_t seq;
      std::memcpy(&seq, rx[i].data.data(), 4);
      ASSERT_EQ(seq, expect);
      ASSERT_EQ(rx[i].data.size(), 4 + expect % 50);
      EXPECT_EQ(rx[i].source, a->local_endpoint());
    }
  }
}

TEST_F(ShmTest, DestinationWithoutAnInboxIsCountedAndSkipped) {
  auto a = Open(Options()), b = Open(Options());
  ASSERT_TRUE(a && b);
  const uint8_t byte = 1;
  const uint16_t nobody = b->local_endpoint().port == 65000 ? 65001 : 65000;
  const TxDatagram tx[3] = {{{kLoopbackIpv4, nobody}, {&byte, 1}},
                            {b->local_endpoint(), {&byte, 1}},
                            {{kLoopbackIpv4, nobody}, {&byte, 1}}};
  ASSERT_EQ(*a->Send(tx), 3u);
  EXPECT_EQ(a->counters().send_errors, 2u);
  EXPECT_EQ(a->counters().datagrams_sent, 1u);
  RxDatagram rx;
  EXPECT_EQ(*b->Receive({&rx, 1}, milliseconds(1000)), 1u);
}

TEST_F(ShmTest, PortOfALiveTransportIsRefusedAndClosingRemovesItsFile) {
  auto a = Open(Options());
  ASSERT_TRUE(a);
  const uint16_t port = a->local_endpoint().port;
  auto again = OpenShm(Options(port));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(again.status().message().find("in use"), std::string::npos);
  EXPECT_EQ(FileCount(), 1u);
  a.reset();
  EXPECT_EQ(FileCount(), 0u);
  EXPECT_TRUE(OpenShm(Options(port)).ok());
}

TEST_F(ShmTest, DirectoryOpenToOthersIsRefused) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  auto t = OpenShm(Options(30000));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("0700"), std::string::npos);
  ::chmod(dir_.c_str(), 0700);
}

// Given a process that opened a transport on port P and died without closing it (its inbox
// file left behind, unlocked), Expect P to open again (the stale file replaced), and a sender
// that still mapped the old inbox to reach the new one.
// A child process that opened a transport in `options`' directory, receives one datagram (for at
// most 5 s) and then dies without closing anything: its inbox is left behind, unlocked. port is
// 0 (and pid -1) when it could not be started or could not open one.
struct DyingReceiver {
  pid_t pid = -1;
  uint16_t port = 0;
};

DyingReceiver ForkReceiverThatDiesAfterOneDatagram(const TransportOptions& options) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return {};
  const pid_t child = ::fork();
  if (child == 0) {
    auto t = OpenShmConsecutive(options, 1);
    uint16_t p = t.ok() ? (*t)[0]->local_endpoint().port : 0;
    [[maybe_unused]] ssize_t w = ::write(pipefd[1], &p, sizeof p);
    std::vector<RxDatagram> rx(1);
    if (t.ok()) (void)(*t)[0]->Receive(rx, std::chrono::seconds(5));
    ::_exit(0);  // no destructors
  }
  DyingReceiver r;
  if (child > 0 &&
      ::read(pipefd[0], &r.port, sizeof r.port) == static_cast<ssize_t>(sizeof r.port) &&
      r.port != 0) {
    r.pid = child;
  } else if (child > 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    r.port = 0;
  }
  ::close(pipefd[0]);
  ::close(pipefd[1]);
  return r;
}

TEST_F(ShmTest, StaleInboxOfADeadProcessIsReplaced) {
  auto a = Open(Options());
  ASSERT_TRUE(a);
  const DyingReceiver dying = ForkReceiverThatDiesAfterOneDatagram(Options());
  ASSERT_NE(dying.port, 0);
  const uint16_t port = dying.port;
  const uint8_t byte = 5;
  const TxDatagram to_old{{kLoopbackIpv4, port}, {&byte, 1}};
  ASSERT_EQ(*a->Send({&to_old, 1}), 1u);
  int status = 0;
  ASSERT_EQ(::waitpid(dying.pid, &status, 0), dying.pid);
  struct stat st {};
  ASSERT_EQ(::stat(InboxPath(port).c_str(), &st), 0) << "the dead process's inbox is left";
  auto b = OpenShm(Options(port));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const uint8_t two = 6;
  const TxDatagram to_new{{kLoopbackIpv4, port}, {&two, 1}};
  ASSERT_EQ(*a->Send({&to_new, 1}), 1u);
  RxDatagram rx;
  ASSERT_EQ(*(*b)->Receive({&rx, 1}, milliseconds(2000)), 1u);
  EXPECT_EQ(rx.data[0], 6);
}

// Given a receiver with room for one sender, and a sender process that sent three datagrams and
// then died leaving a fourth written but unpublished, Expect the three to arrive, nothing else,
// and the dead sender's ring to be freed for a new sender once drained.
TEST_F(ShmTest, DeadSenderNeitherWedgesTheReceiverNorKeepsItsRing) {
  TransportOptions o = Options();
  o.shm.max_senders = 1;
  auto b = Open(o);
  ASSERT_TRUE(b);
  const Endpoint to = b->local_endpoint();
  const std::string path = InboxPath(to.port);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto t = OpenShmConsecutive(Options(), 1);
    if (!t.ok()) ::_exit(1);
    std::vector<uint8_t> p(64, 9);
    std::vector<TxDatagram> tx(3, TxDatagram{to, p});
    if (!(*t)[0]->Send(tx).ok()) ::_exit(2);
    // Half of a fourth datagram in the next slot, never published (as if it died in memcpy).
    const int fd = ::open(path.c_str(), O_RDWR);
    void* m = ::mmap(nullptr, kHeaderBytes + 16384, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) ::_exit(3);
    uint8_t* slot3 = static_cast<uint8_t*>(m) + kHeaderBytes + kRingSlots + 3 * kSlotBytes2048;
    const uint32_t len = 64;
    std::memcpy(slot3, &len, sizeof len);
    std::memset(slot3 + 8, 9, 32);
    ::_exit(0);  // no destructors: the ring stays registered to a dead pid
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::vector<RxDatagram> rx(8);
  auto n = b->Receive(rx, milliseconds(1000));
  ASSERT_EQ(*n, 3u);
  EXPECT_EQ(rx[0].data.size(), 64u);
  EXPECT_EQ(*b->Receive(rx, milliseconds(0)), 0u);
  // The receiver looked for dead senders (Receive does, at most once a second) and freed the
  // drained ring: a new sender gets it.
  auto a = Open(Options());
  ASSERT_TRUE(a);
  const uint8_t byte = 1;
  const TxDatagram tx{to, {&byte, 1}};
  ASSERT_EQ(*a->Send({&tx, 1}), 1u);
  EXPECT_EQ(a->counters().send_errors, 0u);
  EXPECT_EQ(a->counters().datagrams_sent, 1u);
  ASSERT_EQ(*b->Receive(rx, milliseconds(1000)), 1u);
  EXPECT_EQ(rx[0].source, a->local_endpoint());
}

// Given a receiver with room for one sender that polls without ever sleeping (a timeout of 0,
// as a --busy-poll switch's shards do), and a sender process that died without closing, Expect
// the dead sender's ring to be freed for a new sender all the same (it was freed only by a
// receiver that slept, so a busy switch ran out of rings as killed workers accumulated).
TEST_F(ShmTest, ReceiverThatNeverSleepsFreesTheRingOfADeadSender) {
  TransportOptions o = Options();
  o.shm.max_senders = 1;
  auto b = Open(o);
  ASSERT_TRUE(b);
  const Endpoint to = b->local_endpoint();
  const pid_t child = ForkSenderThatExits(Options(), to, {7}, milliseconds(0));
  ASSERT_GE(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto a = Open(Options());
  ASSERT_TRUE(a);
  const uint8_t byte = 1;
  const TxDatagram tx{to, {&byte, 1}};
  std::vector<RxDatagram> rx(8);
  size_t from_dead = 0;
  bool from_a = false;
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        for (int k = 0; k < 100 && !from_a; ++k) {
          auto n = b->Receive(rx, milliseconds(0));
          if (!n.ok()) return false;
          for (size_t i = 0; i < *n; ++i) {
            from_a = from_a || rx[i].source == a->local_endpoint();
            from_dead += rx[i].source != a->local_endpoint();
          }
          if (!from_a) (void)a->Send({&tx, 1});
        }
        return from_a;
      },
      milliseconds(3000)))
      << "the dead sender's ring was never freed: " << a->counters().send_errors
      << " datagrams of the new sender refused";
  EXPECT_EQ(from_dead, 1u);
}

// Given a process that made an inbox and a group and died without closing them, another dead
// process's inbox, and a live transport, Expect RemoveShmFilesLeftBy(first's pid) to remove the
// first's inbox and group only, and a second call naming the others to remove the dead one's
// inbox and leave the live one's.
TEST_F(ShmTest, FilesLeftByDeadProcessesAreRemovedOnlyForThoseNamed) {
  auto live = Open(Options());
  ASSERT_TRUE(live);
  auto dies_leaving = [&](bool join) {
    const pid_t child = ::fork();
    if (child == 0) {
      auto t = OpenShmConsecutive(Options(), 1);
      if (!t.ok()) ::_exit(1);
      if (join && !(*t)[0]->JoinGroup({0xef010203, 4000}, 0).ok()) ::_exit(2);
      ::_exit(0);  // no destructors
    }
    int status = 0;
    EXPECT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return static_cast<uint32_t>(child);
  };
  const uint32_t first = dies_leaving(true);
  const uint32_t second = dies_leaving(false);
  ASSERT_EQ(FileCount(), 4u);  // 3 inboxes and a group
  EXPECT_EQ(RemoveShmFilesLeftBy(dir_, {first}), 2u);
  EXPECT_EQ(FileCount(), 2u);
  struct stat st {};
  EXPECT_EQ(::stat(InboxPath(live->local_endpoint().port).c_str(), &st), 0);
  EXPECT_EQ(RemoveShmFilesLeftBy(dir_, {second, static_cast<uint32_t>(::getpid())}), 1u);
  EXPECT_EQ(FileCount(), 1u);
  EXPECT_EQ(::stat(InboxPath(live->local_endpoint().port).c_str(), &st), 0);
}

// Given a process with a thread that keeps making shm files (transports, each joining a group of
// its own), When the process removes its own files on its way out (RemoveOwnShmFiles, as
// `switchml worker` does on SIGTERM), Expect nothing of it left in the directory, temporary
// files included, however many more the thread tries to make (a file being made when the
// removal ran was left behind: under its temporary name, or named after the removal looked).
TEST_F(ShmTest, RemovingOwnFilesLeavesNoneBehindWhileOthersAreBeingMade) {
  const pid_t child = ::fork();
  if (child == 0) {
    std::atomic<uint32_t> attempts{0};
    std::atomic<bool> stop{false};
    std::thread maker([&] {
      std::vector<std::unique_ptr<Transport>> kept;  // closed once the files were counted
      for (uint16_t i = 0; !stop.load(); ++i) {
        auto t = OpenShmConsecutive(Options(), 1);
        if (t.ok() && (*t)[0]->JoinGroup({0xef010203, static_cast<uint16_t>(4000 + i)}, 0).ok()) {
          kept.push_back(std::move((*t)[0]));
        }
        attempts.fetch_add(1);
      }
    });
    while (attempts.load() < 3) std::this_thread::yield();
    RemoveOwnShmFiles(dir_);
    const uint32_t at_removal = attempts.load();
    while (attempts.load() < at_removal + 3) std::this_thread::yield();
    size_t left = 0;
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        left += std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0;
      }
      ::closedir(d);
    }
    stop.store(true);
    maker.join();
    ::_exit(left == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "files of the process were left behind";
}

size_t OpenDescriptors() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

// Given a long-lived sender (as the switch daemon) that served receivers one after another,
// each of which closed (12), died without closing (3, in child processes), or was the one member
// of a group that left (12), Expect the sender to let go of their files as it meets new ones:
// it kept a descriptor of each (and with it the pages of its ring there) for its whole life.
TEST_F(ShmTest, SenderLetsGoOfTheFilesOfReceiversThatAreGone) {
  auto a = Open(Options());
  ASSERT_TRUE(a);
  std::vector<RxDatagram> rx(4);
  const uint8_t byte = 3;
  auto send_to = [&](const Endpoint& to) {
    const TxDatagram tx{to, {&byte, 1}};
    ASSERT_EQ(*a->Send({&tx, 1}), 1u);
    ASSERT_EQ(a->counters().send_errors, 0u);
  };
  send_to(a->local_endpoint());  // (its own inbox: a destination that stays)
  ASSERT_EQ(*a->Receive(rx, milliseconds(1000)), 1u);
  const size_t before = OpenDescriptors();
  for (int k = 0; k < 12; ++k) {
    auto b = Open(Options());
    ASSERT_TRUE(b);
    send_to(b->local_endpoint());
    ASSERT_EQ(*b->Receive(rx, milliseconds(1000)), 1u);
  }
  for (int k = 0; k < 3; ++k) {
    const DyingReceiver dying = ForkReceiverThatDiesAfterOneDatagram(Options());
    ASSERT_NE(dying.port, 0);
    send_to({kLoopbackIpv4, dying.port});
    int status = 0;
    ASSERT_EQ(::waitpid(dying.pid, &status, 0), dying.pid);
  }
  for (int k = 0; k < 12; ++k) {
    auto m = Open(Options());
    ASSERT_TRUE(m);
    const Endpoint group{0xef000100u + static_cast<uint32_t>(k), 16000};
    ASSERT_TRUE(m->JoinGroup(group, 0).ok());
    send_to(group);
    ASSERT_EQ(*m->Receive(rx, milliseconds(1000)), 1u);
  }
  send_to(a->local_endpoint());
  // At most the last destination of each kind is still held (until the next new one).
  EXPECT_LE(OpenDescriptors(), before + 2);
}

// Given slot contents forged by another process of the user (a length word beyond any datagram;
// then a producer index beyond the ring), Expect the bad slot counted and dropped, the good one
// delivered, then the corrupt ring ignored for good while other senders still get through.
TEST_F(ShmTest, MalformedRingContentsAreCountedAndDropped) {
  TransportOptions few = Options();
  few.shm.max_senders = 8;  // a header of one page (kHeaderBytes)
  auto a = Open(Options()), b = Open(few), c = Open(Options());
  ASSERT_TRUE(a && b && c);
  const std::vector<uint8_t> p1(10, 1), p2(20, 2);
  const TxDatagram tx[2] = {{b->local_endpoint(), p1}, {b->local_endpoint(), p2}};
  ASSERT_EQ(*a->Send(tx), 2u);
  const int fd = ::open(InboxPath(b->local_endpoint().port).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void* m = ::mmap(nullptr, kHeaderBytes + 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  uint8_t* ring = static_cast<uint8_t*>(m) + kHeaderBytes;  // a's ring: the first entry
  const uint32_t huge = 0x7fffffff;
  std::memcpy(ring + kRingSlots, &huge, sizeof huge);  // slot 0's length word
  std::vector<RxDatagram> rx(8);
  ASSERT_EQ(*b->Receive(rx, milliseconds(1000)), 1u);
  EXPECT_EQ(rx[0].data.size(), 20u);
  EXPECT_EQ(b->counters().malformed, 1u);
  // A producer index far ahead of the consumer: the ring is dropped.
  const uint64_t bogus = 1'000'000;
  std::memcpy(ring + kRingHead, &bogus, sizeof bogus);
  EXPECT_EQ(*b->Receive(rx, milliseconds(0)), 0u);
  EXPECT_EQ(b->counters().malformed, 2u);
  ::munmap(m, kHeaderBytes + 4096);
  ::close(fd);
  const TxDatagram from_c{b->local_endpoint(), p1};
  ASSERT_EQ(*c->Send({&from_c, 1}), 1u);
  ASSERT_EQ(*b->Receive(rx, milliseconds(1000)), 1u);
  EXPECT_EQ(rx[0].source, c->local_endpoint());
}

// Given a receiver blocked in Receive and a sender in another process, Expect the sender's
// doorbell to end the wait with the datagram, long before the timeout.
TEST_F(ShmTest, DoorbellWakesAReceiverInAnotherProcess) {
  auto b = Open(Options());
  ASSERT_TRUE(b);
  const Endpoint to = b->local_endpoint();
  const pid_t child =
      ForkSenderThatExits(Options(), to, std::vector<uint8_t>(500, 7), milliseconds(150));
  ASSERT_GE(child, 0);
  std::vector<RxDatagram> rx(4);
  const auto start = std::chrono::steady_clock::now();
  auto n = b->Receive(rx, std::chrono::seconds(20));
  const auto took = std::chrono::steady_clock::now() - start;
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 1u);
  EXPECT_EQ(rx[0].data.size(), 500u);
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_GE(b->counters().datagrams_received, 1u);
}

// Given two processes that bounce a datagram back and forth, each blocking in Receive with a
// 5 s timeout, Expect every round trip to end by a doorbell, never by the timeout: a lost
// wake-up (the sender missing the receiver's announcement of sleep) would wait it out.
TEST_F(ShmTest, PingPongAcrossProcessesNeverWaitsOutTheTimeout) {
  auto a = Open(Options()), b = Open(Options());
  ASSERT_TRUE(a && b);
  constexpr int kRounds = 3000;
  const Endpoint pa = a->local_endpoint();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // b echoes what it receives back to a.
    std::vector<RxDatagram> rx(4);
    for (int i = 0; i < kRounds;) {
      auto n = b->Receive(rx, std::chrono::seconds(5));
      if (!n.ok() || *n == 0) ::_exit(1);
      for (size_t k = 0; k < *n; ++k, ++i) {
        const TxDatagram tx{pa, rx[k].data};
        if (!b->Send({&tx, 1}).ok()) ::_exit(2);
      }
    }
    ::_exit(0);
  }
  std::vector<RxDatagram> rx(4);
  auto slowest = std::chrono::nanoseconds::zero();
  int got = 0;
  for (int i = 0; i < kRounds; ++i) {
    const uint32_t v = static_cast<uint32_t>(i);
    const TxDatagram tx{b->local_endpoint(), {reinterpret_cast<const uint8_t*>(&v), sizeof v}};
    ASSERT_EQ(*a->Send({&tx, 1}), 1u);
    const auto start = std::chrono::steady_clock::now();
    auto n = a->Receive(rx, std::chrono::seconds(5));
    slowest = std::max(slowest, std::chrono::steady_clock::now() - start);
    ASSERT_TRUE(n.ok());
    ASSERT_EQ(*n, 1u) << "round " << i << " waited out its timeout";
    uint32_t echo;
    std::memcpy(&echo, rx[0].data.data(), sizeof echo);
    ASSERT_EQ(echo, v);
    ++got;
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(got, kRounds);
  EXPECT_LT(slowest, std::chrono::seconds(2));
  EXPECT_GT(a->counters().doorbells + b->counters().doorbells, 0u);
}

TEST_F(ShmTest, SenderForgetsAClosedReceiverAndFindsItsSuccessor) {
  auto a = Open(Options()), b = Open(Options());
  ASSERT_TRUE(a && b);
  const uint16_t port = b->local_endpoint().port;
  const uint8_t byte = 3;
  const TxDatagram tx{{kLoopbackIpv4, port}, {&byte, 1}};
  ASSERT_EQ(*a->Send({&tx, 1}), 1u);
  EXPECT_EQ(a->counters().datagrams_sent, 1u);
  b.reset();
  ASSERT_EQ(*a->Send({&tx, 1}), 1u);
  EXPECT_EQ(a->counters().send_errors, 1u);
  auto b2 = OpenShm(Options(port));
  ASSERT_TRUE(b2.ok());
  ASSERT_EQ(*a->Send({&tx, 1}), 1u);
  RxDatagram rx;
  ASSERT_EQ(*(*b2)->Receive({&rx, 1}, milliseconds(1000)), 1u);
  EXPECT_EQ(rx.data[0], 3);
  // Its old ring was marked closed by the sender when it forgot the inbox; none of it leaks.
  a.reset();
  EXPECT_EQ(*(*b2)->Receive({&rx, 1}, milliseconds(0)), 0u);
}

// Given a ring of 8 slots and batches of 5 buffers lent by TxBufferTo of which only some are
// sent, Expect every sent datagram to arrive intact and in order across many turns of the ring,
// those still at their lent slot to be sent in place (counted) and the others to be moved down.
TEST_F(ShmTest, LentSlotsAreSentInPlaceAndAbandonedOnesCostNothing) {
  TransportOptions o = Options();
  o.shm.ring_slots = 8;
  auto a = Open(o), b = Open(o);
  ASSERT_TRUE(a && b);
  const Endpoint to = b->local_endpoint();
  std::vector<RxDatagram> rx(16);
  uint32_t next = 0, expect = 0;
  uint64_t in_place = 0;
  for (int round = 0; round < 60; ++round) {
    // Odd rounds send buffers 0, 1, 2 (all in place); even rounds 0, 2, 4 (only 0 in place).
    const std::vector<size_t> sent =
        round % 2 ? std::vector<size_t>{0, 1, 2} : std::vector<size_t>{0, 2, 4};
    std::vector<std::span<uint8_t>> lent;
    for (size_t i = 0; i < 5; ++i) {
      lent.push_back(a->TxBufferTo(i, to));
      ASSERT_GE(lent.back().size(), a->max_datagram_bytes());
      std::memset(lent.back().data(), 0xee, 64);  // abandoned ones are written too
    }
    std::vector<TxDatagram> tx;
    for (size_t i : sent) {
      const size_t len = 8 + next % 40;
      std::memcpy(lent[i].data(), &next, 4);
      lent[i][len - 1] = static_cast<uint8_t>(next);
      tx.push_back({to, lent[i].first(len)});
      ++next;
    }
    in_place += round % 2 ? 3 : 1;
    ASSERT_EQ(*a->Send(tx), 3u);
    ASSERT_EQ(*b->Receive(rx, milliseconds(100)), 3u);
    for (size_t i = 0; i < 3; ++i, ++expect) {
      uint32_t seq;
      std::memcpy(&seq, rx[i].data.data(), 4);
      ASSERT_EQ(seq, expect) << "round " << round;
      ASSERT_EQ(rx[i].data.size(), 8 + expect % 40);
      EXPECT_EQ(rx[i].data.back(), static_cast<uint8_t>(expect));
    }
  }
  EXPECT_EQ(a->counters().sent_in_place, in_place);
  EXPECT_EQ(a->counters().datagrams_sent, 180u);
}

// Given a ring of 8 slots that nobody drains, Expect TxBufferTo to lend ring slots only while
// they are free (the rest is TxBuffer's memory), the batch to stop at the full ring, and the
// rest to go, intact, once the receiver has returned its slots.
TEST_F(ShmTest, FullRingWhileLentFallsBackToTransmitMemory) {
  TransportOptions o = Options();
  o.shm.ring_slots = 8;
  auto a = Open(o), b = Open(o);
  ASSERT_TRUE(a && b);
  const Endpoint to = b->local_endpoint();
  std::vector<TxDatagram> tx;
  for (uint8_t i = 0; i < 12; ++i) {
    std::span<uint8_t> buf = a->TxBufferTo(i, to);
    std::memset(buf.data(), i, 100);
    tx.push_back({to, buf.first(100)});
  }
  ASSERT_EQ(*a->Send(tx), 8u);
  EXPECT_EQ(a->counters().sent_in_place, 8u);
  EXPECT_EQ(a->counters().send_buffer_full, 1u);
  std::vector<RxDatagram> rx(16);
  ASSERT_EQ(*b->Receive(rx, milliseconds(0)), 8u);
  for (size_t i = 0; i < 8; ++i) ASSERT_EQ(rx[i].data[99], i);
  ASSERT_EQ(*b->Receive(rx, milliseconds(0)), 0u);    // returns the slots
  ASSERT_EQ(*a->Send(std::span(tx).subspan(8)), 4u);  // still the caller's: copied now
  ASSERT_EQ(*b->Receive(rx, milliseconds(0)), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::vector<uint8_t>(rx[i].data.begin(), rx[i].data.end()),
              std::vector<uint8_t>(100, static_cast<uint8_t>(8 + i)));
  }
  EXPECT_EQ(a->counters().sent_in_place, 8u);
}

// Given buffers lent in a receiver's ring and the receiver closing before Send, Expect the
// memory to stay writable until the next batch, the datagrams to be counted as errors, and the
// next batch to reach the receiver's successor.
TEST_F(ShmTest, ReceiverClosedWhileLentKeepsTheMemoryUntilTheNextBatch) {
  auto a = Open(Options()), b = Open(Options());
  ASSERT_TRUE(a && b);
  const Endpoint to = b->local_endpoint();
  std::span<uint8_t> buf0 = a->TxBufferTo(0, to), buf1 = a->TxBufferTo(1, to);
  b.reset();
  std::memset(buf0.data(), 1, buf0.size());
  std::memset(buf1.data(), 2, buf1.size());
  const TxDatagram tx[2] = {{to, buf0.first(10)}, {to, buf1.first(10)}};
  ASSERT_EQ(*a->Send(tx), 2u);
  EXPECT_EQ(a->counters().send_errors, 2u);
  std::memset(buf1.data(), 3, buf1.size());  // not yet the next batch: still mapped
  auto b2 = OpenShm(Options(to.port));
  ASSERT_TRUE(b2.ok());
  std::span<uint8_t> again = a->TxBufferTo(0, to);
  std::memset(again.data(), 4, 10);
  const TxDatagram one{to, again.first(10)};
  ASSERT_EQ(*a->Send({&one, 1}), 1u);
  RxDatagram rx;
  ASSERT_EQ(*(*b2)->Receive({&rx, 1}, milliseconds(1000)), 1u);
  EXPECT_EQ(rx.data[9], 4);
  EXPECT_EQ(a->counters().sent_in_place, 1u);
}

// Given a worker's authenticated transport over shm and another local process that can write
// the switch's inbox (shared memory is untrusted), When that process rewrites the datagram
// between the worker's write and Send, Expect the switch to receive the worker's bytes (or
// nothing), never the rewritten ones under a valid tag: the wrapper builds keyed datagrams in
// private memory (before, TxBufferTo lent a slot of the inbox and the tag, computed there at
// Send, vouched for the rewritten bytes).
TEST_F(ShmTest, AuthenticatedDatagramsAreNotBuiltInSharedMemory) {
  TransportOptions o = Options();
  o.shm.ring_slots = 8;
  o.shm.max_senders = 4;
  auto a = Open(o), b = Open(o);
  ASSERT_TRUE(a && b);
  const Endpoint from = a->local_endpoint(), to = b->local_endpoint();
  constexpr uint64_t kSession = 77;
  constexpr uint32_t kRank = 1;
  const AuthKey key = NewAuthKey();
  auto table = std::make_shared<AuthKeyTable>();
  table->Add(kSession, key, kRank, from.ipv4, from.port, 1);
  auto worker = MakeAuthenticated(std::move(a), kSession, kRank, key);
  auto sw = MakeAuthenticated(std::move(b), table);

  const char kHonest[] = "switchml-honest-payload-0123456";
  const char kForged[] = "switchml-FORGED-payload-0123456";
  static_assert(sizeof kHonest == sizeof kForged);
  std::span<uint8_t> buf = worker->TxBufferTo(0, to);
  ASSERT_GE(buf.size(), sizeof kHonest);
  std::memcpy(buf.data(), kHonest, sizeof kHonest);

  // The other process: maps the inbox and rewrites the payload wherever it finds it.
  const int fd = ::open(InboxPath(to.port).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  void* map = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED);
  uint8_t* p = static_cast<uint8_t*>(map);
  uint8_t* const end = p + st.st_size;
  size_t rewritten = 0;
  while (void* hit = ::memmem(p, end - p, kHonest, sizeof kHonest)) {
    p = static_cast<uint8_t*>(hit);
    std::memcpy(p, kForged, sizeof kForged);
    p += sizeof kForged;
    ++rewritten;
  }
  EXPECT_EQ(rewritten, 0u) << "the keyed datagram was built in the receiver's inbox";

  const TxDatagram tx{to, buf.first(sizeof kHonest)};
  ASSERT_EQ(*worker->Send({&tx, 1}), 1u);
  EXPECT_EQ(worker->counters().sent_in_place, 0u);
  RxDatagram rx;
  ASSERT_EQ(*sw->Receive({&rx, 1}, milliseconds(1000)), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(rx.data.data()), rx.data.size()),
            std::string(kHonest, sizeof kHonest));
  EXPECT_EQ(sw->counters().auth_dropped, 0u);
  ::munmap(map, st.st_size);
}

// ---- Groups (shm.h, "Groups"): the group file's layout as far as the tests that forge it need
// it: the producer index at 128, member entry e at 256 + 64 e (state, then cursor), the ring's
// slots from 12288 (a uint32_t length, then the data).
constexpr size_t kGroupHead = 128, kGroupMember0 = 256, kGroupRing = 12288;
const Endpoint kGroup{0xefc00102, 15000};  // 239.192.1.2:15000

class ShmGroupTest : public ShmTest {
 protected:
  std::string GroupFile() const { return dir_ + "/group-239.192.1.2-15000"; }
  // Sends `count` datagrams of 4 + i % 30 bytes numbered from *next to the group; returns how
  // many the producer wrote (counted in datagrams_sent) and advances *next by count.
  static void SendNumbered(Transport& p, uint32_t count, uint32_t* next) {
    std::vector<std::vector<uint8_t>> payloads;
    for (uint32_t i = 0; i < count; ++i, ++*next) {
      payloads.push_back(Bytes(4 + *next % 30, 7));
      std::memcpy(payloads.back().data(), next, 4);
    }
    std::vector<TxDatagram> tx;
    for (auto& x : payloads) tx.push_back({kGroup, x});
    ASSERT_EQ(*p.Send(tx), count);  // a group never stops the batch
  }
  // Receives what waits and checks it continues the numbering at *expect.
  static size_t ReceiveNumbered(Transport& t, uint32_t* expect, const Endpoint& from) {
    std::vector<RxDatagram> rx(64);
    auto n = t.Receive(rx, milliseconds(0));
    EXPECT_TRUE(n.ok());
    for (size_t i = 0; i < *n; ++i, ++*expect) {
      uint32_t seq;
      std::memcpy(&seq, rx[i].data.data(), 4);
      EXPECT_EQ(seq, *expect);
      EXPECT_EQ(rx[i].data.size(), 4 + *expect % 30);
      EXPECT_EQ(rx[i].source, from);
    }
    return *n;
  }
};

// Given three members of a group and a producer, Expect each datagram written once (sent
// once, in place when built in a lent slot) and read by every member, counted as received
// through the group; many rounds wrap the ring.
TEST_F(ShmGroupTest, EveryMemberReadsEachDatagramWrittenOnce) {
  TransportOptions o = Options();
  o.shm.ring_slots = 16;
  auto p = Open(Options());
  std::vector<std::unique_ptr<Transport>> m;
  for (int k = 0; k < 3; ++k) m.push_back(Open(o));
  ASSERT_TRUE(p && m[0] && m[1] && m[2]);
  for (auto& t : m) ASSERT_TRUE(t->JoinGroup(kGroup, 0).ok());
  uint32_t next = 0;
  uint32_t expect[3] = {0, 0, 0};
  for (int round = 0; round < 40; ++round) {
    if (round % 2) {
      SendNumbered(*p, 5, &next);
    } else {  // built in the group's ring
      std::vector<TxDatagram> tx;
      for (size_t i = 0; i < 5; ++i, ++next) {
        std::span<uint8_t> b = p->TxBufferTo(i, kGroup);
        ASSERT_GE(b.size(), p->max_datagram_bytes());
        std::memset(b.data(), 7, 4 + next % 30);
        std::memcpy(b.data(), &next, 4);
        tx.push_back({kGroup, b.first(4 + next % 30)});
      }
      ASSERT_EQ(*p->Send(tx), 5u);
    }
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(ReceiveNumbered(*m[k], &expect[k], p->local_endpoint()), 5u) << round;
    }
  }
  EXPECT_EQ(p->counters().datagrams_sent, 200u);
  EXPECT_EQ(p->counters().sent_in_place, 100u);
  for (auto& t : m) {
    EXPECT_EQ(t->counters().group_datagrams_received, 200u);
    EXPECT_EQ(t->counters().datagrams_received, 200u);
  }
}

// Given a ring of 8 slots and a live member that does not read, Expect the producer to write
// up to the ring's size, then to drop (and count) what does not fit rather than stop the batch
// or overwrite the slow member's slots; the other member reads everything written; once the
// slow member has read, the ring takes datagrams again.
TEST_F(ShmGroupTest, SlowLiveMemberHoldsTheRingAndTheRestIsDroppedNotOverwritten) {
  TransportOptions o = Options();
  o.shm.ring_slots = 8;
  auto p = Open(Options()), fast = Open(o), slow = Open(o), other = Open(o);
  ASSERT_TRUE(p && fast && slow && other);
  ASSERT_TRUE(fast->JoinGroup(kGroup, 0).ok());
  ASSERT_TRUE(slow->JoinGroup(kGroup, 0).ok());
  uint32_t next = 0, fast_expect = 0, slow_expect = 0;
  SendNumbered(*p, 6, &next);
  EXPECT_EQ(ReceiveNumbered(*fast, &fast_expect, p->local_endpoint()), 6u);
  // A unicast datagram in the same batch behind the full group still goes.
  std::vector<uint8_t> u(8, 1);
  std::vector<std::vector<uint8_t>> g(4, std::vector<uint8_t>(8, 2));
  std::vector<TxDatagram> tx;
  for (auto& x : g) tx.push_back({kGroup, x});
  tx.push_back({other->local_endpoint(), u});
  ASSERT_EQ(*p->Send(tx), 5u);
  EXPECT_EQ(p->counters().datagrams_sent, 6u + 2u + 1u);
  EXPECT_EQ(p->counters().send_errors, 2u);
  std::vector<RxDatagram> rx(16);
  EXPECT_EQ(*other->Receive(rx, milliseconds(0)), 1u);
  EXPECT_EQ(*fast->Receive(rx, milliseconds(0)), 2u);
  // The slow member reads its 8, intact, and returns them.
  ASSERT_EQ(*slow->Receive(rx, milliseconds(0)), 8u);
  for (uint32_t i = 0; i < 6; ++i) {
    uint32_t seq;
    std::memcpy(&seq, rx[i].data.data(), 4);
    EXPECT_EQ(seq, i);
  }
  EXPECT_EQ(rx[6].data[0], 2);
  EXPECT_EQ(rx[7].data[0], 2);
  ASSERT_EQ(*slow->Receive(rx, milliseconds(0)), 0u);
  ASSERT_EQ(*fast->Receive(rx, milliseconds(0)), 0u);
  next = fast_expect = slow_expect = 100;
  SendNumbered(*p, 8, &next);
  EXPECT_EQ(ReceiveNumbered(*fast, &fast_expect, p->local_endpoint()), 8u);
  EXPECT_EQ(ReceiveNumbered(*slow, &slow_expect, p->local_endpoint()), 8u);
  EXPECT_EQ(p->counters().send_errors, 2u);
}

// Given a member in another process that dies (SIGKILL) without reading, Expect the producer to
// find its lock released once the ring is full and drop it: no datagram of the live member is
// lost, and the group goes on.
TEST_F(ShmGroupTest, DeadMemberIsDroppedWithoutWedgingTheGroup) {
  TransportOptions o = Options();
  o.shm.ring_slots = 8;
  auto p = Open(Options()), live = Open(o);
  ASSERT_TRUE(p && live);
  ASSERT_TRUE(live->JoinGroup(kGroup, 0).ok());
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto t = OpenShmConsecutive(o, 1);
    if (!t.ok() || !(*t)[0]->JoinGroup(kGroup, 0).ok()) ::_exit(1);
    const char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(2);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  uint32_t next = 0, expect = 0;
  SendNumbered(*p, 8, &next);  // the child is taken in at the first send, and then holds all 8
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  for (int round = 0; round < 10; ++round) {
    EXPECT_EQ(ReceiveNumbered(*live, &expect, p->local_endpoint()), 8u) << round;
    ASSERT_EQ(ReceiveNumbered(*live, &expect, p->local_endpoint()), 0u);  // returns the 8
    SendNumbered(*p, 8, &next);
  }
  EXPECT_EQ(p->counters().send_errors, 0u);
  EXPECT_EQ(p->counters().datagrams_sent, 88u);
}

// Given a group under way, Expect a member that joins to start at the head: it reads what is
// written after it joined, not what the others have already been sent.
TEST_F(ShmGroupTest, MemberJoiningMidStreamStartsAtTheHead) {
  auto p = Open(Options()), a = Open(Options()), b = Open(Options());
  ASSERT_TRUE(p && a && b);
  ASSERT_TRUE(a->JoinGroup(kGroup, 0).ok());
  uint32_t next = 0, a_expect = 0;
  SendNumbered(*p, 5, &next);
  ASSERT_TRUE(b->JoinGroup(kGroup, 0).ok());
  uint32_t b_expect = next;
  std::vector<RxDatagram> rx(16);
  EXPECT_EQ(*b->Receive(rx, milliseconds(0)), 0u);  // nothing of the 5
  SendNumbered(*p, 3, &next);
  EXPECT_EQ(ReceiveNumbered(*a, &a_expect, p->local_endpoint()), 8u);
  EXPECT_EQ(ReceiveNumbered(*b, &b_expect, p->local_endpoint()), 3u);
  // Leaving and joining again: from the head again.
  b->LeaveGroup();
  SendNumbered(*p, 2, &next);
  ASSERT_TRUE(b->JoinGroup(kGroup, 0).ok());
  b_expect = next;
  SendNumbered(*p, 4, &next);
  EXPECT_EQ(ReceiveNumbered(*b, &b_expect, p->local_endpoint()), 4u);
  EXPECT_EQ(ReceiveNumbered(*a, &a_expect, p->local_endpoint()), 6u);
  EXPECT_EQ(b->counters().group_datagrams_received, 7u);
}

// Given values forged in the group file by another process of the user: a length word beyond
// any datagram, a member's cursor beyond the head, then a producer index far ahead, Expect each
// counted (malformed) and survived: the bad slot dropped, the member with the forged cursor
// dropped by the producer and joining again at the head, and the member that saw the forged
// head joining again; datagrams written afterwards arrive.
TEST_F(ShmGroupTest, ForgedGroupContentsAreCountedAndSurvived) {
  TransportOptions o = Options();
  o.shm.ring_slots = 16;
  auto p = Open(Options()), a = Open(o);
  ASSERT_TRUE(p && a);
  ASSERT_TRUE(a->JoinGroup(kGroup, 0).ok());
  uint32_t next = 0, expect = 0;
  SendNumbered(*p, 2, &next);
  const int fd = ::open(GroupFile().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  ASSERT_GE(static_cast<size_t>(st.st_size), kGroupRing + 16 * 2112);
  void* m = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  uint8_t* f = static_cast<uint8_t*>(m);
  const uint32_t huge = 0x7fffffff;
  std::memcpy(f + kGroupRing, &huge, sizeof huge);  // slot 0's length word
  std::vector<RxDatagram> rx(16);
  ASSERT_EQ(*a->Receive(rx, milliseconds(0)), 1u);
  EXPECT_EQ(a->counters().malformed, 1u);
  ASSERT_EQ(*a->Receive(rx, milliseconds(0)), 0u);
  // A cursor beyond the head: the producer drops the member once it looks (a full ring).
  const uint64_t ahead = 1000;
  std::memcpy(f + kGroupMember0 + 8, &ahead, sizeof ahead);
  next = expect = 50;
  SendNumbered(*p, 16, &next);  // fills the ring as the producer last saw it, then looks
  EXPECT_EQ(p->counters().malformed, 1u);
  ASSERT_EQ(*a->Receive(rx, milliseconds(0)), 0u);  // dropped: joins again
  expect = next;
  SendNumbered(*p, 3, &next);  // taken in at the head first
  EXPECT_EQ(ReceiveNumbered(*a, &expect, p->local_endpoint()), 3u);
  // A producer index far ahead of the member: the member joins again.
  const uint64_t bogus = 1'000'000'000;
  std::memcpy(f + kGroupHead, &bogus, sizeof bogus);
  const uint64_t malformed = a->counters().malformed;
  ASSERT_EQ(*a->Receive(rx, milliseconds(0)), 0u);
  EXPECT_EQ(a->counters().malformed, malformed + 1);
  ::munmap(m, st.st_size);
  ::close(fd);
  expect = next;
  SendNumbered(*p, 2, &next);  // takes the member in again (its publish repairs the head)
  EXPECT_EQ(ReceiveNumbered(*a, &expect, p->local_endpoint()), 2u);
}

// Given a member blocked in Receive in another process, Expect the producer's write to the
// group to ring the member's doorbell: the wait ends long before its timeout.
TEST_F(ShmGroupTest, GroupDatagramWakesASleepingMember) {
  auto a = Open(Options());
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->JoinGroup(kGroup, 0).ok());
  const pid_t child = ForkSenderThatExits(Options(), kGroup, {5}, milliseconds(200));
  ASSERT_GE(child, 0);
  std::vector<RxDatagram> rx(4);
  const auto start = std::chrono::steady_clock::now();
  auto n = a->Receive(rx, std::chrono::seconds(20));
  const auto took = std::chrono::steady_clock::now() - start;
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  EXPECT_LT(took, std::chrono::seconds(10));
  EXPECT_EQ(a->counters().group_datagrams_received, 1u);
}

// Given a member that leaves while another keeps the group, and a new transport of the same
// process (another inbox) that takes the freed entry before the producer sends again, Expect
// the producer to ring the new member's doorbell, not the old inbox's (the entry's state, kind
// and pid, is the same as before): the new member's wait ends long before its timeout. (Found
// in review: the producer kept the doorbell mapping of an entry whose state it had seen.)
TEST_F(ShmGroupTest, MemberOfTheSameProcessTakingAFreedEntryIsWoken) {
  auto p = Open(Options()), keep = Open(Options()), a = Open(Options());
  ASSERT_TRUE(p && keep && a);
  ASSERT_TRUE(keep->JoinGroup(kGroup, 0).ok());
  ASSERT_TRUE(a->JoinGroup(kGroup, 0).ok());
  uint32_t next = 0, expect = 0;
  SendNumbered(*p, 1, &next);  // takes both in (and maps a's doorbell)
  EXPECT_EQ(ReceiveNumbered(*a, &expect, p->local_endpoint()), 1u);
  a.reset();  // leaves: its entry is free, its inbox gone
  auto b = Open(Options());
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->JoinGroup(kGroup, 0).ok());  // the same entry, the same pid
  // Sends once b announced that it sleeps (its inbox's doorbell: the sleeping word at 68).
  const int fd = ::open(InboxPath(b->local_endpoint().port).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* page = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(page, MAP_FAILED);
  std::thread sender([&] {
    std::atomic_ref<uint32_t> sleeping(
        *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(page) + 68));
    for (int i = 0; i < 1000 && sleeping.load(std::memory_order_acquire) == 0; ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    uint32_t n = 100;
    SendNumbered(*p, 1, &n);
  });
  std::vector<RxDatagram> rx(4);
  const auto start = std::chrono::steady_clock::now();
  auto n = b->Receive(rx, std::chrono::seconds(20));
  const auto took = std::chrono::steady_clock::now() - start;
  sender.join();
  ::munmap(page, 4096);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  EXPECT_LT(took, std::chrono::seconds(10));
  EXPECT_EQ(p->counters().doorbells, 1u);
}

// Given a member that the producer takes in while it writes a batch to the group (its cursor
// set to the producer's next slot, ahead of the producer index published before the batch),
// Expect the member to wait for the publish, not to call the ring corrupt (malformed) and join
// again; it then reads what follows. The interleaving is written into the file as the producer
// writes it at that moment (a member's Receive between two datagrams of one Send). (Found in
// review: waiting = head - cursor wrapped around.)
TEST_F(ShmGroupTest, MemberTakenInDuringABatchWaitsForThePublish) {
  auto p = Open(Options()), a = Open(Options()), b = Open(Options());
  ASSERT_TRUE(p && a && b);
  ASSERT_TRUE(a->JoinGroup(kGroup, 0).ok());
  uint32_t next = 0, a_expect = 0;
  SendNumbered(*p, 4, &next);
  EXPECT_EQ(ReceiveNumbered(*a, &a_expect, p->local_endpoint()), 4u);
  ASSERT_TRUE(b->JoinGroup(kGroup, 0).ok());  // entry 1, joining
  const int fd = ::open(GroupFile().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void* m = ::mmap(nullptr, kGroupRing, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  uint8_t* f = static_cast<uint8_t*>(m);
  uint64_t head = 0;
  std::memcpy(&head, f + kGroupHead, sizeof head);
  ASSERT_EQ(head, 4u);
  // The producer wrote slot 3 of a batch and takes b in before the next: cursor 4, active; the
  // published index is still 3.
  const uint64_t published = 3, cursor = 4;
  const uint64_t active = uint64_t{3} << 32 | static_cast<uint32_t>(::getpid());
  std::memcpy(f + kGroupHead, &published, sizeof published);
  std::memcpy(f + kGroupMember0 + 64 + 8, &cursor, sizeof cursor);
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(f + kGroupMember0 + 64))
      .store(active, std::memory_order_release);
  std::vector<RxDatagram> rx(16);
  EXPECT_EQ(*b->Receive(rx, milliseconds(0)), 0u);
  EXPECT_EQ(b->counters().malformed, 0u);
  std::memcpy(f + kGroupHead, &head, sizeof head);  // the batch's publish
  ::munmap(m, kGroupRing);
  ::close(fd);
  uint32_t b_expect = next;
  SendNumbered(*p, 3, &next);
  EXPECT_EQ(ReceiveNumbered(*b, &b_expect, p->local_endpoint()), 3u);
  EXPECT_EQ(ReceiveNumbered(*a, &a_expect, p->local_endpoint()), 3u);
  EXPECT_EQ(b->counters().malformed, 0u);
  EXPECT_EQ(p->counters().malformed, 0u);
}

// Given the last member leaving, Expect its file removed, the producer's datagrams to the
// group then counted in send_errors, and, once a new member made a new file, delivered again.
TEST_F(ShmGroupTest, LastMemberRemovesTheFileAndTheProducerFindsTheNextOne) {
  auto p = Open(Options()), a = Open(Options());
  ASSERT_TRUE(p && a);
  ASSERT_TRUE(a->JoinGroup(kGroup, 0).ok());
  uint32_t next = 0, expect = 0;
  SendNumbered(*p, 2, &next);
  EXPECT_EQ(ReceiveNumbered(*a, &expect, p->local_endpoint()), 2u);
  a->LeaveGroup();
  struct stat st {};
  EXPECT_NE(::stat(GroupFile().c_str(), &st), 0);
  SendNumbered(*p, 1, &next);
  EXPECT_EQ(p->counters().send_errors, 1u);
  a.reset();
  auto b = Open(Options());
  ASSERT_TRUE(b->JoinGroup(kGroup, 0).ok());
  std::this_thread::sleep_for(milliseconds(30));  // the producer looks again after 20 ms
  expect = next;
  SendNumbered(*p, 2, &next);
  EXPECT_EQ(ReceiveNumbered(*b, &expect, p->local_endpoint()), 2u);
  b.reset();
  EXPECT_NE(::stat(GroupFile().c_str(), &st), 0);
}

// Given a group file left by members that died (no one holds it), Expect a new member to
// replace it (a fresh geometry), and bad requests refused: an interface other than loopback,
// an address that is not a group.
TEST_F(ShmGroupTest, StaleGroupFileIsReplacedAndBadJoinsAreRefused) {
  {
    std::string tmp = GroupFile();
    const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "junk", 4), 4);
    ::close(fd);
  }
  auto p = Open(Options()), a = Open(Options());
  ASSERT_TRUE(p && a);
  ASSERT_TRUE(a->JoinGroup(kGroup, 0).ok());
  uint32_t next = 0, expect = 0;
  SendNumbered(*p, 3, &next);
  EXPECT_EQ(ReceiveNumbered(*a, &expect, p->local_endpoint()), 3u);
  EXPECT_EQ(a->JoinGroup(kGroup, 2).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(a->JoinGroup(Endpoint{kLoopbackIpv4, 15000}, 0).code(), StatusCode::kInvalidArgument);
}

TEST_F(ShmTest, BadOptionsAreRefused) {
  TransportOptions o = Options(30001);
  o.shm.ring_slots = 1000;
  EXPECT_EQ(OpenShm(o).status().code(), StatusCode::kInvalidArgument);
  o = Options(30001);
  o.max_datagram_bytes = 70000;
  EXPECT_EQ(OpenShm(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenShm(Options(0)).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchml::transport
