// The authenticated data plane (docs/security.md, 4.4): a transport wrapper that appends an
// 8-byte tag to every datagram it sends to a keyed peer, and verifies and strips the tag of every
// datagram it receives from one. A datagram from a keyed peer whose tag does not verify (forged,
// altered, cut short, or tagged with another key) is dropped and counted
// (TransportCounters::auth_dropped) before the caller sees it.
//
// Tag: SipHash-2-4 (libsodium's crypto_shorthash) keyed with the job's 128-bit key, over the
// datagram followed by the job id (8 bytes, little endian) and the sender (4 bytes,
// little endian: the worker's rank, or kAuthSwitchSender for the switch). The sender binds a
// datagram to who sent it: all workers of a job share its key, so without it a copy of one
// worker's packet sent with another worker's address would count as the other's contribution,
// and a worker's packet reflected at a worker would pass for a result. The wire gains 8 bytes per
// datagram; everything else is the reference format.
//
// Two sides:
//   - a worker knows one peer (the switch) and one key: MakeAuthenticated(inner, job_id,
//     rank, key) tags everything it sends as its rank's and accepts only datagrams that verify
//     as the switch's. A job striped over several switch hosts has one key per host:
//     MakeAuthenticated(inner, job_id, rank, switches) takes an AuthSwitch per host (its
//     data endpoints and key) and picks the key by the peer's endpoint;
//   - the switch keys each registered worker endpoint with its job's key in an AuthKeyTable,
//     which the control plane changes when jobs come and go; each data-plane thread's wrapper
//     keeps a copy that it refreshes when the table's version moves (the table's mutex is taken
//     only then, never per datagram). Endpoints without a key (unauthenticated jobs, strangers)
//     pass through unchanged in both directions.
//
// Transmit memory: the wrapper lends the inner transport's buffers less 8 bytes, and writes the
// tag in place behind a datagram that starts at a buffer it lent (the daemon and the worker
// threads always build datagrams there); other datagrams are copied. A buffer sent to several
// destinations with one key is tagged once.
//
// Ownership: owns the inner transport; shares the key table. Thread-safety: as Transport; the
// key table's methods are thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/endpoint.h"
#include "transport/transport.h"

namespace switchml::transport {

inline constexpr size_t kAuthTagBytes = 8;
// Room the wrapper keeps behind each datagram in its transmit buffers (the tagged message's
// trailer: job id and sender; the tag then overwrites its first 8 bytes). The wrapper lends
// and receives max_datagram_bytes() = the inner transport's less this.
inline constexpr size_t kAuthRoomBytes = 12;
inline constexpr size_t kAuthKeyBytes = 16;
// The sender of the switch's datagrams (workers are their rank, below 2^31).
inline constexpr uint32_t kAuthSwitchSender = 0xffffffffu;
using AuthKey = std::array<uint8_t, kAuthKeyBytes>;

// A fresh random key (libsodium's randombytes_buf: the kernel's CSPRNG).
AuthKey NewAuthKey();
// The key from its wire form (exactly kAuthKeyBytes bytes); false otherwise.
bool AuthKeyFromBytes(const std::string& bytes, AuthKey* key);
std::string AuthKeyToBytes(const AuthKey& key);

// The tag of `datagram` under (key, job_id, sender), as the wrapper computes it.
uint64_t AuthTag(const AuthKey& key, uint64_t job_id, uint32_t sender,
                 std::span<const uint8_t> datagram);

// Who a keyed peer is: its job id and key, and its rank in the job (a worker) or
// kAuthSwitchSender (the switch).
struct AuthPeer {
  uint64_t job_id = 0;
  AuthKey key{};
  uint32_t sender = 0;
};

// The switch's table of keyed worker endpoints. Written by the control plane, read by the
// data-plane threads through Snapshot() when version() moved.
class AuthKeyTable {
 public:
  // The endpoints (ipv4, port .. port + num_ports - 1) are now rank `rank` of job_id, keyed
  // with key.
  void Add(uint64_t job_id, const AuthKey& key, uint32_t rank, uint32_t ipv4, uint16_t port,
           uint32_t num_ports);
  // Forgets the endpoints of job_id (those another job took over since stay).
  void RemoveJob(uint64_t job_id);
  // Moves on every change (acquire/release: a reader that sees a new version sees the change).
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  // A copy of the table and the version it reflects.
  std::unordered_map<Endpoint, AuthPeer> Snapshot(uint64_t* version) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::atomic<uint64_t> version_{0};
  std::unordered_map<Endpoint, AuthPeer> peers_;
};

// The worker's side (rank `rank` of job_id): every datagram sent is tagged as the rank's,
// every datagram received must verify as the switch's.
std::unique_ptr<Transport> MakeAuthenticated(std::unique_ptr<Transport> inner, uint64_t job_id,
                                             uint32_t rank, const AuthKey& key);
// One switch host of a striped job (docs/architecture.md, "Striping over several switches"), as
// a worker's wrapper keys it: its data endpoints (ipv4, ports [port, port + num_ports); a
// loopback ipv4 stands for every loopback address) and its key for the job.
struct AuthSwitch {
  uint32_t ipv4 = 0;
  uint16_t port = 0;
  uint32_t num_ports = 1;
  AuthKey key{};
};
// The same with a key per switch host: a datagram to or from a host's data endpoints is tagged
// or verified with its key; one from anywhere else must verify under the first host's (so it is
// dropped and counted as every unverified datagram is).
std::unique_ptr<Transport> MakeAuthenticated(std::unique_ptr<Transport> inner, uint64_t job_id,
                                             uint32_t rank, std::vector<AuthSwitch> switches);
// The switch's side: keys by endpoint from `table` (shared; read by this transport's thread);
// datagrams from an endpoint must verify as its rank's, datagrams to it are tagged as the
// switch's.
std::unique_ptr<Transport> MakeAuthenticated(std::unique_ptr<Transport> inner,
                                             std::shared_ptr<const AuthKeyTable> table);

}  // namespace switchml::transport
