#include "transport/auth.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "transport/memory.h"

namespace switchml::transport {
namespace {

using std::chrono::milliseconds;

constexpr Endpoint kSwitch{0x0a000001, 48864};
constexpr Endpoint kWorker{0x0a000002, 40000};
constexpr Endpoint kStranger{0x0a000003, 40000};
constexpr uint64_t kSession = 0x1234567890abcdefULL;
constexpr uint32_t kRank = 1;
constexpr size_t kMax = 1034 + kAuthRoomBytes;

std::vector<uint8_t> Payload(size_t n, uint8_t seed) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i * 7);
  return p;
}

// Sends one datagram through `t`, built in the buffer it lends (as the daemon and the worker
// threads do), or from caller memory.
void SendOne(Transport& t, Endpoint to, const std::vector<uint8_t>& p, bool lent = true) {
  TxDatagram tx;
  tx.destination = to;
  if (lent) {
    std::span<uint8_t> b = t.TxBuffer(0);
    ASSERT_LE(p.size(), b.size());
    std::memcpy(b.data(), p.data(), p.size());
    tx.data = b.first(p.size());
  } else {
    tx.data = p;
  }
  auto r = t.Send({&tx, 1});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(*r, 1u);
}

std::vector<std::vector<uint8_t>> ReceiveAll(Transport& t) {
  std::vector<std::vector<uint8_t>> out;
  std::vector<RxDatagram> rx(64);
  auto n = t.Receive(rx, milliseconds(0));
  EXPECT_TRUE(n.ok());
  for (size_t i = 0; n.ok() && i < *n; ++i) out.emplace_back(rx[i].data.begin(), rx[i].data.end());
  return out;
}

class AuthTest : public ::testing::Test {
 protected:
  AuthTest() : key_(NewAuthKey()) {
    table_ = std::make_shared<AuthKeyTable>();
    sw_ = MakeAuthenticated(net_.Attach(kSwitch, kMax), table_);
    worker_ = MakeAuthenticated(net_.Attach(kWorker, kMax), kSession, kRank, key_);
    raw_stranger_ = net_.Attach(kStranger, kMax);
    table_->Add(kSession, key_, kRank, kWorker.ipv4, kWorker.port, 1);
  }

  MemoryNetwork net_;
  AuthKey key_;
  std::shared_ptr<AuthKeyTable> table_;
  std::unique_ptr<Transport> sw_, worker_, raw_stranger_;
};

TEST_F(AuthTest, TagRoundTripsBothWays) {
  EXPECT_EQ(sw_->max_datagram_bytes(), kMax - kAuthRoomBytes);
  for (bool lent : {true, false}) {
    const auto p = Payload(1034, lent ? 1 : 2);
    SendOne(*worker_, kSwitch, p, lent);
    auto got = ReceiveAll(*sw_);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0], p);
    SendOne(*sw_, kWorker, p, lent);
    got = ReceiveAll(*worker_);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0], p);
  }
  EXPECT_EQ(sw_->counters().auth_dropped, 0u);
  EXPECT_EQ(worker_->counters().auth_dropped, 0u);
}

TEST_F(AuthTest, TheWireCarriesTheDatagramAndItsTag) {
  auto raw_switch = net_.Attach(Endpoint{kSwitch.ipv4, 1}, kMax);
  const auto p = Payload(100, 3);
  SendOne(*worker_, Endpoint{kSwitch.ipv4, 1}, p);
  auto got = ReceiveAll(*raw_switch);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].size(), p.size() + kAuthTagBytes);
  EXPECT_TRUE(std::equal(p.begin(), p.end(), got[0].begin()));
  uint64_t tag;
  std::memcpy(&tag, got[0].data() + p.size(), 8);
  EXPECT_EQ(tag, AuthTag(key_, kSession, kRank, p));
  EXPECT_NE(tag, AuthTag(key_, kSession + 1, kRank, p));  // the session id is covered
  EXPECT_NE(tag, AuthTag(key_, kSession, kRank + 1, p));  // and the sender
}

TEST_F(AuthTest, AFlippedBitAnywhereIsDroppedAndCounted) {
  // The stranger replays a genuine tagged datagram with one bit flipped, from the worker's own
  // endpoint (as a forger on the path would).
  const auto p = Payload(1034, 5);
  std::vector<uint8_t> wire = p;
  const uint64_t tag = AuthTag(key_, kSession, kRank, p);
  wire.resize(p.size() + 8);
  std::memcpy(wire.data() + p.size(), &tag, 8);
  // Detach the real worker so that a raw transport can send from its endpoint.
  worker_.reset();
  auto raw_worker = net_.Attach(kWorker, kMax);
  uint64_t expected_dropped = 0;
  for (size_t bit = 0; bit < wire.size() * 8; bit += 13) {
    std::vector<uint8_t> bad = wire;
    bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    SendOne(*raw_worker, kSwitch, bad, false);
    EXPECT_TRUE(ReceiveAll(*sw_).empty()) << "bit " << bit;
    ++expected_dropped;
  }
  // The last bit of the tag too.
  std::vector<uint8_t> bad = wire;
  bad.back() ^= 0x80;
  SendOne(*raw_worker, kSwitch, bad, false);
  EXPECT_TRUE(ReceiveAll(*sw_).empty());
  ++expected_dropped;
  EXPECT_EQ(sw_->counters().auth_dropped, expected_dropped);
  // The intact datagram still passes.
  SendOne(*raw_worker, kSwitch, wire, false);
  auto got = ReceiveAll(*sw_);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], p);
}

TEST_F(AuthTest, WrongKeyTruncatedAndUntaggedAreDropped) {
  worker_.reset();
  auto other = MakeAuthenticated(net_.Attach(kWorker, kMax), kSession, kRank, NewAuthKey());
  SendOne(*other, kSwitch, Payload(1034, 6));  // well tagged, with another key
  EXPECT_TRUE(ReceiveAll(*sw_).empty());
  other.reset();
  auto raw_worker = net_.Attach(kWorker, kMax);
  const auto p = Payload(1034, 7);
  SendOne(*raw_worker, kSwitch, p, false);  // untagged (the reference format)
  std::vector<uint8_t> cut(p.begin(), p.begin() + 5);
  SendOne(*raw_worker, kSwitch, cut, false);  // shorter than a tag
  SendOne(*raw_worker, kSwitch, {}, false);   // empty
  std::vector<uint8_t> huge(kMax + 100, 1);
  SendOne(*raw_worker, kSwitch, huge, false);  // longer than any tagged datagram (truncated)
  EXPECT_TRUE(ReceiveAll(*sw_).empty());
  EXPECT_EQ(sw_->counters().auth_dropped, 5u);
}

TEST_F(AuthTest, TheWorkerDropsResultsNotTaggedByTheSwitch) {
  const auto p = Payload(1034, 8);
  SendOne(*raw_stranger_, kWorker, p, false);
  EXPECT_TRUE(ReceiveAll(*worker_).empty());
  EXPECT_EQ(worker_->counters().auth_dropped, 1u);
}

TEST_F(AuthTest, UnkeyedPeersPassThroughUnchanged) {
  const auto p = Payload(1034, 9);
  SendOne(*raw_stranger_, kSwitch, p, false);
  auto got = ReceiveAll(*sw_);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], p);
  SendOne(*sw_, kStranger, p);
  got = ReceiveAll(*raw_stranger_);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], p);  // no tag
  // Oversized datagrams of unkeyed peers are cut and flagged as without the wrapper.
  std::vector<uint8_t> big(kMax, 2);
  SendOne(*raw_stranger_, kSwitch, big, false);
  std::vector<RxDatagram> rx(4);
  auto n = sw_->Receive(rx, milliseconds(0));
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 1u);
  EXPECT_TRUE(rx[0].truncated);
  EXPECT_EQ(rx[0].data.size(), kMax - kAuthRoomBytes);
  EXPECT_EQ(sw_->counters().auth_dropped, 0u);
}

// Given a switch whose table is empty (no authenticated job: the wrapper's pass-through), Expect
// datagrams both ways unchanged and oversized ones cut and flagged; and when the first key
// arrives after a transmit buffer was lent, Expect the datagram built in it tagged all the same
// (then untagged again once the job is gone, and tagged when a job comes back).
TEST(AuthEmptyTableTest, PassThroughThenTheFirstKeyThenNone) {
  MemoryNetwork net;
  const AuthKey key = NewAuthKey();
  auto table = std::make_shared<AuthKeyTable>();
  auto sw = MakeAuthenticated(net.Attach(kSwitch, kMax), table);
  auto raw_worker = net.Attach(kWorker, kMax);
  const auto p = Payload(1034, 14);
  SendOne(*raw_worker, kSwitch, p, false);
  std::vector<uint8_t> big(kMax, 3);
  SendOne(*raw_worker, kSwitch, big, false);
  std::vector<RxDatagram> rx(4);
  auto n = sw->Receive(rx, milliseconds(0));
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 2u);
  EXPECT_EQ(std::vector<uint8_t>(rx[0].data.begin(), rx[0].data.end()), p);
  EXPECT_FALSE(rx[0].truncated);
  EXPECT_TRUE(rx[1].truncated);
  EXPECT_EQ(rx[1].data.size(), kMax - kAuthRoomBytes);
  SendOne(*sw, kWorker, p);
  auto got = ReceiveAll(*raw_worker);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], p);  // no tag

  // A buffer lent while nothing is keyed; the key arrives before the Send.
  std::span<uint8_t> b = sw->TxBuffer(0);
  std::memcpy(b.data(), p.data(), p.size());
  table->Add(kSession, key, kRank, kWorker.ipv4, kWorker.port, 1);
  const TxDatagram tx{kWorker, b.first(p.size())};
  auto r = sw->Send({&tx, 1});
  ASSERT_TRUE(r.ok());
  got = ReceiveAll(*raw_worker);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].size(), p.size() + kAuthTagBytes);
  uint64_t tag;
  std::memcpy(&tag, got[0].data() + p.size(), 8);
  EXPECT_EQ(tag, AuthTag(key, kSession, kAuthSwitchSender, p));
  // Keyed now: built in place, and an untagged datagram from the worker's address is dropped.
  auto worker = MakeAuthenticated(std::move(raw_worker), kSession, kRank, key);
  SendOne(*sw, kWorker, p);
  got = ReceiveAll(*worker);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], p);
  SendOne(*worker, kSwitch, p);
  got = ReceiveAll(*sw);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], p);

  // The job goes: the worker's tagged datagrams pass as they came, replies go untagged.
  table->RemoveJob(kSession);
  const auto small = Payload(64, 15);
  SendOne(*worker, kSwitch, small);
  got = ReceiveAll(*sw);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].size(), small.size() + kAuthTagBytes);
  SendOne(*sw, kWorker, p);
  EXPECT_TRUE(ReceiveAll(*worker).empty());  // untagged: the worker drops it
  EXPECT_EQ(worker->counters().auth_dropped, 1u);
  // And back: tagged again.
  table->Add(kSession, key, kRank, kWorker.ipv4, kWorker.port, 1);
  EXPECT_TRUE(ReceiveAll(*sw).empty());  // (picks up the key)
  SendOne(*sw, kWorker, p);
  got = ReceiveAll(*worker);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], p);
  EXPECT_EQ(sw->counters().auth_dropped, 0u);
}

TEST_F(AuthTest, RemovedSessionsAreNoLongerKeyed) {
  table_->RemoveJob(kSession);
  const auto p = Payload(64, 10);
  SendOne(*worker_, kSwitch, p);  // tagged: the switch now passes it on as it came
  auto got = ReceiveAll(*sw_);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].size(), p.size() + kAuthTagBytes);
}

TEST_F(AuthTest, OneBufferToSeveralDestinationsOfOneJob) {
  constexpr Endpoint kWorker2{0x0a000004, 40000};
  auto worker2 = MakeAuthenticated(net_.Attach(kWorker2, kMax), kSession, 2, key_);
  table_->Add(kSession, key_, 2, kWorker2.ipv4, kWorker2.port, 1);
  // A stranger's keyed job on a third endpoint, sharing the same reply buffer: must be copied.
  const AuthKey other_key = NewAuthKey();
  auto other = MakeAuthenticated(net_.Attach(Endpoint{0x0a000005, 1}, kMax), 77, 0, other_key);
  table_->Add(77, other_key, 0, 0x0a000005, 1, 1);
  const auto p = Payload(1034, 11);
  std::span<uint8_t> b = sw_->TxBuffer(0);
  std::memcpy(b.data(), p.data(), p.size());
  std::vector<TxDatagram> tx = {{kWorker, b.first(p.size())},
                                {Endpoint{0x0a000005, 1}, b.first(p.size())},
                                {kWorker2, b.first(p.size())}};
  auto r = sw_->Send(tx);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 3u);
  for (Transport* t : {worker_.get(), worker2.get(), other.get()}) {
    auto got = ReceiveAll(*t);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0], p);
    EXPECT_EQ(t->counters().auth_dropped, 0u);
  }
}

// Given two workers of one job (one key), Expect a copy of rank 1's tagged datagram sent with
// rank 2's address to be dropped: the tag binds the sender (else it would count as rank 2's
// contribution).
TEST_F(AuthTest, AWorkersDatagramFromAnotherWorkersAddressIsDropped) {
  constexpr Endpoint kWorker2{0x0a000004, 40000};
  table_->Add(kSession, key_, 2, kWorker2.ipv4, kWorker2.port, 1);
  auto raw_switch = net_.Attach(Endpoint{kSwitch.ipv4, 1}, kMax);
  const auto p = Payload(1034, 12);
  SendOne(*worker_, Endpoint{kSwitch.ipv4, 1}, p);  // captured on the path
  auto wire = ReceiveAll(*raw_switch);
  ASSERT_EQ(wire.size(), 1u);
  auto raw_worker2 = net_.Attach(kWorker2, kMax);
  SendOne(*raw_worker2, kSwitch, wire[0], false);  // replayed as rank 2's
  EXPECT_TRUE(ReceiveAll(*sw_).empty());
  EXPECT_EQ(sw_->counters().auth_dropped, 1u);
  worker_.reset();
  auto raw_worker = net_.Attach(kWorker, kMax);
  SendOne(*raw_worker, kSwitch, wire[0], false);  // from rank 1's own address it is genuine
  EXPECT_EQ(ReceiveAll(*sw_).size(), 1u);
}

// Given a worker's tagged datagram reflected at a worker of the same job (as if the switch sent
// it), Expect it to be dropped: only the switch's datagrams pass for results.
TEST_F(AuthTest, AWorkersDatagramReflectedAsAResultIsDropped) {
  auto raw_switch = net_.Attach(Endpoint{kSwitch.ipv4, 1}, kMax);
  SendOne(*worker_, Endpoint{kSwitch.ipv4, 1}, Payload(1034, 13));
  auto wire = ReceiveAll(*raw_switch);
  ASSERT_EQ(wire.size(), 1u);
  SendOne(*raw_switch, kWorker, wire[0], false);
  EXPECT_TRUE(ReceiveAll(*worker_).empty());
  EXPECT_EQ(worker_->counters().auth_dropped, 1u);
}

TEST(AuthKeyTableTest, VersionMovesAndTakenOverEndpointsStay) {
  AuthKeyTable t;
  const uint64_t v0 = t.version();
  t.Add(1, NewAuthKey(), 0, 0x7f000001, 40000, 4);
  EXPECT_GT(t.version(), v0);
  EXPECT_EQ(t.size(), 4u);
  t.Add(2, NewAuthKey(), 0, 0x7f000001, 40002, 1);  // session 2 took over one port
  t.RemoveJob(1);
  uint64_t v;
  auto snap = t.Snapshot(&v);
  EXPECT_EQ(v, t.version());
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap.begin()->second.job_id, 2u);
  const uint64_t before = t.version();
  t.RemoveJob(3);  // nothing: no change
  EXPECT_EQ(t.version(), before);
}

TEST(AuthKeyTest, KeysAreRandomAndRoundTrip) {
  const AuthKey a = NewAuthKey(), b = NewAuthKey();
  EXPECT_NE(a, b);
  AuthKey c;
  EXPECT_TRUE(AuthKeyFromBytes(AuthKeyToBytes(a), &c));
  EXPECT_EQ(a, c);
  EXPECT_FALSE(AuthKeyFromBytes("short", &c));
}

}  // namespace
}  // namespace switchml::transport
