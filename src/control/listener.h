// The control plane's own TCP listener (docs/security.md 2, "Connections").
//
// gRPC 1.51 (Debian 12) stops accepting for good once accept4 fails with anything but EAGAIN or
// ECONNABORTED: a flood of idle connections that ran the process out of file descriptors
// (EMFILE) left a switch that never answered again (issue 28, found 1). So the switch accepts
// its control connections itself and hands each to gRPC (grpc::experimental::
// ExternalConnectionAcceptor, with the server's credentials: TLS works as before), and:
//   - never stops accepting: out of descriptors, it sheds the connections at the head of the
//     queue (a spare descriptor, given up for the moment, lets it accept and close each), backs
//     off briefly on other errors, and goes on;
//   - bounds connections per client address and in total, the total within the descriptors
//     the process may open (each connection takes two: gRPC's and the one this listener keeps to
//     see it end), so that the process does not run out in the first place;
//   - when a bound is reached, makes room by closing the oldest connection that has not carried
//     a call yet (a flood of idle connections; a worker's makes its first call at once), of the
//     address for the address's bound, of any address for the total; with none, refuses the
//     newcomer (accepted and closed at once).
// gRPC closes connections idle before their first frame after its handshake timeout, and ones
// without calls after its idle limit (ControlServer sets both).
//
// ConnectionTable is the bookkeeping (no I/O, tested alone); Listener is the thread around it.
// Thread-safety: Listener's methods are thread-safe; ConnectionTable is not (Listener locks it).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "switchml/status.h"

struct sockaddr_storage;

namespace switchml::control {

// A connection's peer: its address (normalized text: "10.0.0.1", "::1") and TCP port.
struct PeerAddress {
  std::string host;
  uint16_t port = 0;
  bool operator==(const PeerAddress&) const = default;
};
// Parses a gRPC peer string ("ipv4:10.0.0.1:5555", "ipv6:[::ffff:10.0.0.1]:5555", also with the
// brackets percent-encoded); IPv4-mapped IPv6 addresses become IPv4.
std::optional<PeerAddress> ParsePeer(const std::string& grpc_peer);

struct ConnectionLimits {
  uint32_t per_address = 256;
  uint32_t total = 4096;
};

class ConnectionTable {
 public:
  explicit ConnectionTable(const ConnectionLimits& limits) : limits_(limits) {}

  struct Decision {
    bool admit = false;
    // A connection to close to make room (its id), when admit.
    std::optional<uint64_t> evict;
  };
  // A new connection `id` from `peer`: admitted (possibly at the expense of `evict`, which is
  // removed from the table at once) or refused (not added).
  Decision Add(uint64_t id, const PeerAddress& peer);
  // The connection of `peer` carried a call: it is never evicted.
  void MarkUsed(const PeerAddress& peer);
  // The connection ended (no effect for an unknown id).
  void Remove(uint64_t id);

  size_t size() const { return connections_.size(); }
  size_t size_of(const std::string& host) const;
  bool used(uint64_t id) const;

 private:
  struct Connection {
    PeerAddress peer;
    bool used = false;
    std::list<uint64_t>::iterator unused_pos;          // in unused_ (oldest first)
    std::list<uint64_t>::iterator unused_of_host_pos;  // in its host's unused list
  };
  struct Host {
    uint32_t count = 0;
    std::list<uint64_t> unused;  // oldest first
  };
  void Unlist(uint64_t id, Connection& c);
  const ConnectionLimits limits_;
  std::unordered_map<uint64_t, Connection> connections_;
  std::map<std::pair<std::string, uint16_t>, uint64_t> by_peer_;
  std::unordered_map<std::string, Host> hosts_;
  std::list<uint64_t> unused_;
};

struct ListenerOptions {
  std::string bind_address = "0.0.0.0";
  uint16_t port = 0;  // 0: picked by the kernel
  ConnectionLimits limits;
};

class Listener {
 public:
  // Takes an accepted, connected socket (the listener no longer owns that descriptor).
  using Handoff = std::function<void(int fd)>;

  // Binds and listens (a port in use, or an address that is not local, is an error naming it);
  // accepting starts with Start.
  static Result<std::unique_ptr<Listener>> Bind(const ListenerOptions& options);
  ~Listener();  // Stop()
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  uint16_t port() const { return port_; }
  // Starts the accepting thread, which passes each admitted connection to `handoff`.
  void Start(Handoff handoff);
  // Stops accepting and closes the listening socket and the descriptors it keeps (the
  // connections themselves stay with gRPC). Idempotent.
  void Stop();
  // A call arrived on the connection of `grpc_peer` (ServerContext::peer()).
  void MarkUsed(const std::string& grpc_peer);

  struct Stats {
    uint64_t accepted = 0;
    uint64_t refused = 0;
    uint64_t evicted = 0;
    uint64_t shed = 0;  // closed unread when out of descriptors
    uint64_t open = 0;
  };
  Stats stats() const;

 private:
  Listener(int listen_fd, uint16_t port, const ConnectionLimits& limits);
  void Run();
  void Admit(int fd, const ::sockaddr_storage& peer);
  // Out of descriptors: closes the connection at the head of the queue unread; false when there
  // was none (or it could not).
  bool Shed();
  void Ended(uint64_t id);

  const int listen_fd_;
  const uint16_t port_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;   // eventfd: Stop
  int spare_fd_ = -1;  // given up to accept when out of descriptors
  Handoff handoff_;
  std::thread thread_;
  mutable std::mutex mu_;
  ConnectionTable table_;
  std::unordered_map<uint64_t, int> watch_fds_;  // id -> our duplicate of its socket
  uint64_t next_id_ = 1;
  Stats stats_;
  bool stopped_ = false;
};

// Raises this process's soft limit on open files to its hard limit; returns the limit now in
// force.
uint64_t RaiseOpenFileLimit();

}  // namespace switchml::control
