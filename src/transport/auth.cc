#include "transport/auth.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "base/check.h"
#include "base/status_macros.h"

namespace switchml::transport {
namespace {

static_assert(crypto_shorthash_BYTES == kAuthTagBytes);
static_assert(crypto_shorthash_KEYBYTES == kAuthKeyBytes);

void InitSodium() {
  static const int init = sodium_init();  // thread-safe once; 1 when already initialised
  CHECK(init >= 0) << "libsodium failed to initialise";
}

// The message's trailer behind the datagram: job id (8 bytes) and sender (4), little endian.
void PutTrailer(uint64_t job_id, uint32_t sender, uint8_t* out) {
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(job_id >> (8 * i));
  for (size_t i = 0; i < 4; ++i) out[8 + i] = static_cast<uint8_t>(sender >> (8 * i));
}
static_assert(kAuthRoomBytes == 12 && kAuthRoomBytes >= kAuthTagBytes);

// Tags the datagram at p[0, len) in place, as sent by `sender`: p[len, len + 12) must be
// writable; the tag ends up in p[len, len + 8).
void TagInPlace(const AuthPeer& peer, uint32_t sender, uint8_t* p, size_t len) {
  PutTrailer(peer.job_id, sender, p + len);
  uint8_t tag[kAuthTagBytes];
  crypto_shorthash(tag, p, len + kAuthRoomBytes, peer.key.data());
  std::memcpy(p + len, tag, kAuthTagBytes);
}

// The tag of d (without tag) under peer as sent by `sender`, computed in scratch (d's size + 12
// bytes).
void TagOf(const AuthPeer& peer, uint32_t sender, std::span<const uint8_t> d, uint8_t* scratch,
           uint8_t tag[kAuthTagBytes]) {
  if (!d.empty()) std::memcpy(scratch, d.data(), d.size());
  PutTrailer(peer.job_id, sender, scratch + d.size());
  crypto_shorthash(tag, scratch, d.size() + kAuthRoomBytes, peer.key.data());
}

class AuthTransport final : public Transport {
 public:
  AuthTransport(std::unique_ptr<Transport> inner, std::vector<AuthSwitch> switches, uint64_t job_id,
                uint32_t rank, std::shared_ptr<const AuthKeyTable> table)
      : inner_(std::move(inner)),
        worker_(!switches.empty()),
        rank_(rank),
        table_(std::move(table)),
        max_(inner_->max_datagram_bytes() - kAuthRoomBytes),
        lent_(kTxBuffers),
        tagged_(kTxBuffers),
        scratch_(inner_->max_datagram_bytes() + kAuthRoomBytes) {
    CHECK_LT(kAuthRoomBytes, inner_->max_datagram_bytes());
    InitSodium();
    for (const AuthSwitch& sw : switches) {
      switches_.push_back(SwitchPeer{sw, AuthPeer{job_id, sw.key, kAuthSwitchSender}});
    }
  }

  Endpoint local_endpoint() const override { return inner_->local_endpoint(); }
  size_t max_datagram_bytes() const override { return max_; }
  std::string name() const override { return "auth(" + inner_->name() + ")"; }
  void Wake() override { inner_->Wake(); }

  std::span<uint8_t> TxBuffer(size_t index) override {
    const std::span<uint8_t> b = inner_->TxBuffer(index);
    // The in-place tagging's book-keeping only while some peer is keyed: a switch without
    // authenticated jobs hands the buffer through and touches nothing of its own (Refresh
    // forgets the book-keeping when the first key arrives).
    if (keyed()) NoteLent(index, b);
    return b.first(b.size() - kAuthRoomBytes);
  }

  // While a peer is keyed, TxBuffer's memory: the inner transport may lend memory its receiver
  // and other local processes can write (shm), and the tag, computed over what is there at
  // Send, would then vouch for whatever was written there between the caller's write and Send.
  // The datagram is built and tagged in private memory, and copied once by the inner Send.
  std::span<uint8_t> TxBufferTo(size_t index, const Endpoint& destination) override {
    if (keyed()) return TxBuffer(index);
    const std::span<uint8_t> b = inner_->TxBufferTo(index, destination);
    return b.first(b.size() - kAuthRoomBytes);
  }

  Result<size_t> Send(std::span<const TxDatagram> batch) override {
    Refresh();
    if (!keyed()) return inner_->Send(batch);
    if (out_.size() < batch.size()) out_.resize(batch.size());
    if (copies_.size() < batch.size()) copies_.resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const TxDatagram& d = batch[i];
      const AuthPeer* peer = PeerFor(d.destination);
      if (peer == nullptr) {
        out_[i] = d;
        continue;
      }
      const size_t len = d.data.size();
      // In place when the datagram starts at a buffer lent by TxBuffer with room for the
      // trailer, and that buffer is not already tagged under another key.
      auto it = lent_at_.find(d.data.data());
      if (it != lent_at_.end() && lent_[it->second].data() == d.data.data() &&
          len + kAuthRoomBytes <= lent_[it->second].size()) {
        Tagged& t = tagged_[it->second];
        uint8_t* p = lent_[it->second].data();
        if (!t.valid) {
          TagInPlace(*peer, TxSender(), p, len);
          t = Tagged{true, len, *peer};
        }
        if (t.len == len && t.peer.job_id == peer->job_id && t.peer.key == peer->key) {
          out_[i] = TxDatagram{d.destination, std::span<const uint8_t>(p, len + kAuthTagBytes)};
          continue;
        }
      }
      std::vector<uint8_t>& copy = copies_[i];
      copy.resize(len + kAuthRoomBytes);
      if (len > 0) std::memcpy(copy.data(), d.data.data(), len);
      TagInPlace(*peer, TxSender(), copy.data(), len);
      out_[i] =
          TxDatagram{d.destination, std::span<const uint8_t>(copy.data(), len + kAuthTagBytes)};
    }
    return inner_->Send(std::span<const TxDatagram>(out_.data(), batch.size()));
  }

  Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) override {
    ASSIGN_OR_RETURN(size_t got, inner_->Receive(batch, timeout));
    Refresh();
    const size_t max = max_;
    if (!keyed()) {  // no keyed peer (a switch without authenticated jobs): as without the wrapper
      for (size_t i = 0; i < got; ++i) {
        if (batch[i].data.size() > max) {
          batch[i].data = batch[i].data.first(max);
          batch[i].truncated = true;
        }
        LendLess(batch[i]);
      }
      return got;
    }
    size_t kept = 0, bad = 0;
    for (size_t i = 0; i < got; ++i) {
      RxDatagram d = batch[i];
      const AuthPeer* peer = PeerFor(d.source);
      if (peer == nullptr) {  // an unkeyed peer: as without the wrapper
        if (d.data.size() > max) {
          d.data = d.data.first(max);
          d.truncated = true;
        }
        LendLess(d);
        batch[kept++] = d;
        continue;
      }
      // A keyed peer's reply is tagged in place in a TxBuffer; one over the received datagram
      // would be copied to be tagged, so that is not offered.
      d.reply_buffer = {};
      // (Longer than any tagged datagram of max_datagram_bytes(): never one of ours.)
      if (d.truncated || d.data.size() < kAuthTagBytes || d.data.size() > max + kAuthTagBytes) {
        ++bad;
        continue;
      }
      const std::span<const uint8_t> body = d.data.first(d.data.size() - kAuthTagBytes);
      uint8_t tag[kAuthTagBytes];
      // A worker's datagram must be its rank's; the switch's, the switch's.
      TagOf(*peer, peer->sender, body, scratch_.data(), tag);
      if (sodium_memcmp(tag, d.data.data() + body.size(), kAuthTagBytes) != 0) {
        ++bad;
        continue;
      }
      d.data = body;
      batch[kept++] = d;
    }
    if (bad > 0) dropped_.Add(bad);
    return kept;
  }

  TransportCounters counters() const override {
    TransportCounters c = inner_->counters();
    c.auth_dropped = dropped_.Get();
    return c;
  }

 private:
  struct Tagged {
    bool valid = false;
    size_t len = 0;
    AuthPeer peer;
  };

  // A received datagram's reply_buffer, as the inner transport's buffers are lent: less the room
  // of a tag.
  static void LendLess(RxDatagram& d) {
    d.reply_buffer = d.reply_buffer.size() > kAuthRoomBytes
                         ? d.reply_buffer.first(d.reply_buffer.size() - kAuthRoomBytes)
                         : std::span<uint8_t>();
  }

  // Who this side is: a worker's rank, or the switch.
  uint32_t TxSender() const { return worker_ ? rank_ : kAuthSwitchSender; }

  // Whether any peer is keyed (a worker's always is; the switch's, while some job is): kept
  // by Refresh, one flag for the per-datagram paths to read.
  bool keyed() const { return keyed_; }

  // A worker's peers are its job's switch hosts: the one whose data endpoints `e` is (a loopback
  // address stands for any: a switch bound to every address answers from the one the kernel
  // picks), else the first, so that every datagram a worker takes must verify as a switch's.
  const AuthPeer* PeerFor(const Endpoint& e) const {
    if (worker_) {
      constexpr uint32_t kLoopbackNet = 0x7f000000, kLoopbackMask = 0xff000000;
      for (const SwitchPeer& s : switches_) {
        const bool loopback =
            (s.at.ipv4 & kLoopbackMask) == kLoopbackNet && (e.ipv4 & kLoopbackMask) == kLoopbackNet;
        if ((e.ipv4 == s.at.ipv4 || loopback) && e.port >= s.at.port &&
            uint32_t{e.port} < uint32_t{s.at.port} + s.at.num_ports) {
          return &s.peer;
        }
      }
      return &switches_.front().peer;
    }
    auto it = peers_.find(e);
    return it == peers_.end() ? nullptr : &it->second;
  }

  // Out of line, so that TxBuffer's pass-through stays a call and a test.
  [[gnu::noinline]] void NoteLent(size_t index, std::span<uint8_t> b) {
    lent_[index] = b;
    tagged_[index].valid = false;  // the caller writes new contents
    lent_at_[b.data()] = static_cast<uint32_t>(index);
  }

  // Picks up the control plane's changes (only then takes the table's lock).
  void Refresh() {
    if (table_ == nullptr || table_->version() == seen_) return;
    const bool was_empty = peers_.empty();
    peers_ = table_->Snapshot(&seen_);
    keyed_ = !peers_.empty();
    // Buffers lent while nothing was keyed are not in the book-keeping: forget the index, so
    // that a stale entry cannot point at a buffer lent since (those datagrams are copied).
    if (was_empty) lent_at_.clear();
    for (Tagged& t : tagged_) t.valid = false;
  }

  struct SwitchPeer {
    AuthSwitch at;
    AuthPeer peer;  // (sender: the switch)
  };
  std::unique_ptr<Transport> inner_;
  const bool worker_;  // a worker's side (switches_), else the switch's (table_)
  const uint32_t rank_;
  std::vector<SwitchPeer> switches_;
  const std::shared_ptr<const AuthKeyTable> table_;
  const size_t max_;   // max_datagram_bytes(): the inner transport's less kAuthRoomBytes
  uint64_t seen_ = 0;  // the table's version peers_ reflects (the table starts at 0, empty)
  bool keyed_ = worker_;
  std::unordered_map<Endpoint, AuthPeer> peers_;
  // Transmit buffers lent by index, their index by address, and how each is tagged.
  std::vector<std::span<uint8_t>> lent_;
  std::unordered_map<const uint8_t*, uint32_t> lent_at_;
  std::vector<Tagged> tagged_;
  std::vector<TxDatagram> out_;
  std::vector<std::vector<uint8_t>> copies_;  // datagrams not in a lent buffer, with their tags
  std::vector<uint8_t> scratch_;
  SingleWriterCounter dropped_;
};

}  // namespace

AuthKey NewAuthKey() {
  InitSodium();
  AuthKey key;
  randombytes_buf(key.data(), key.size());
  return key;
}

bool AuthKeyFromBytes(const std::string& bytes, AuthKey* key) {
  if (bytes.size() != kAuthKeyBytes) return false;
  std::memcpy(key->data(), bytes.data(), kAuthKeyBytes);
  return true;
}

std::string AuthKeyToBytes(const AuthKey& key) {
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

uint64_t AuthTag(const AuthKey& key, uint64_t job_id, uint32_t sender,
                 std::span<const uint8_t> datagram) {
  InitSodium();
  std::vector<uint8_t> scratch(datagram.size() + kAuthRoomBytes);
  uint8_t tag[kAuthTagBytes];
  TagOf(AuthPeer{job_id, key, sender}, sender, datagram, scratch.data(), tag);
  uint64_t v;
  std::memcpy(&v, tag, sizeof v);
  return v;
}

void AuthKeyTable::Add(uint64_t job_id, const AuthKey& key, uint32_t rank, uint32_t ipv4,
                       uint16_t port, uint32_t num_ports) {
  std::lock_guard lock(mu_);
  for (uint32_t k = 0; k < num_ports && uint32_t{port} + k <= 65535; ++k) {
    peers_[Endpoint{ipv4, static_cast<uint16_t>(port + k)}] = AuthPeer{job_id, key, rank};
  }
  version_.fetch_add(1, std::memory_order_release);
}

void AuthKeyTable::RemoveJob(uint64_t job_id) {
  std::lock_guard lock(mu_);
  const size_t n = std::erase_if(peers_, [&](const auto& p) { return p.second.job_id == job_id; });
  if (n > 0) version_.fetch_add(1, std::memory_order_release);
}

std::unordered_map<Endpoint, AuthPeer> AuthKeyTable::Snapshot(uint64_t* version) const {
  std::lock_guard lock(mu_);
  *version = version_.load(std::memory_order_relaxed);
  return peers_;
}

size_t AuthKeyTable::size() const {
  std::lock_guard lock(mu_);
  return peers_.size();
}

std::unique_ptr<Transport> MakeAuthenticated(std::unique_ptr<Transport> inner, uint64_t job_id,
                                             uint32_t rank, const AuthKey& key) {
  return MakeAuthenticated(std::move(inner), job_id, rank,
                           std::vector<AuthSwitch>{AuthSwitch{0, 0, 65536, key}});
}

std::unique_ptr<Transport> MakeAuthenticated(std::unique_ptr<Transport> inner, uint64_t job_id,
                                             uint32_t rank, std::vector<AuthSwitch> switches) {
  CHECK(!switches.empty());
  return std::make_unique<AuthTransport>(std::move(inner), std::move(switches), job_id, rank,
                                         nullptr);
}

std::unique_ptr<Transport> MakeAuthenticated(std::unique_ptr<Transport> inner,
                                             std::shared_ptr<const AuthKeyTable> table) {
  CHECK(table != nullptr);
  return std::make_unique<AuthTransport>(std::move(inner), std::vector<AuthSwitch>{}, 0, 0,
                                         std::move(table));
}

}  // namespace switchml::transport
