// The shm transport's destinations (shm.h, "A sender's first datagram", "Lending", "Send"): the
// inboxes (shm_inbox.h) this transport sends to, each with the ring it registered there, as the
// sender sees them. Internal to src/transport.
//
// Ownership: owns a descriptor of each destination's inbox (its lock tells whether the receiver
// lives), a mapping of its header and of our ring; lets go of those whose receiver closed or died
// when it opens a new one, except while lent (kept until the next lending batch). Thread-safety:
// one thread. Blocking: never (a system call or two when a ring is full or a destination new).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/endpoint.h"
#include "transport/shm_files.h"
#include "transport/shm_inbox.h"
#include "transport/shm_ring.h"

namespace switchml::transport {

class ShmPeers {
 public:
  // A destination: its inbox's header and our ring in it.
  struct Peer {
    Fd fd;  // kept open: its lock tells whether the receiver lives
    Mapping header, ring_map;
    InboxGeometry g;
    ShmRingProducer ring;
    uint32_t entry = 0;
    uint32_t pid = 0;
    bool claimed = false;     // entry is ours: marked closed when this is destroyed
    bool touched = false;     // holds datagrams of the current Send
    uint64_t lent_batch = 0;  // the lending batch that last lent a slot of its ring (0: none)

    ~Peer();
    ShmDoorbell doorbell() const { return ShmDoorbell(header.get()); }
    bool Closed() const { return header.get() != nullptr && doorbell().Closed(); }
    // Whether the receiver still holds its inbox (a system call: only when its ring is full).
    bool Alive() const;
  };

  // source: this transport's endpoint as receivers see it; pid: this process's.
  ShmPeers(std::string dir, const Endpoint& source, uint32_t pid)
      : dir_(std::move(dir)), source_(source), pid_(pid) {}

  // The destination of port (opened and registered on first use), or nullptr (logged) when
  // there is no live inbox to use.
  Peer* Find(uint16_t port);
  // Forgets the destination of port (its receiver closed or died).
  void Drop(uint16_t port);

  // A slot of our ring at port's inbox for datagram `index` of this batch, `bytes` long, while
  // the ring has room for it and its slots hold `bytes`; else an empty span.
  std::span<uint8_t> Lend(uint16_t port, size_t index, size_t bytes);
  // Writes a datagram into p's ring (caller checked p.ring.HasRoom(1)): whether it was built in
  // place. Published by PublishRings.
  // (Inline: once per datagram.)
  bool Push(Peer& p, std::span<const uint8_t> data) {
    sends_.Touch(&p);
    return p.ring.Push(data);
  }

  // Publishes the rings Push filled: how many.
  size_t PublishRings();
  // After PublishRings and a full fence: rings the doorbells of those receivers that sleep, and
  // starts the next Send. Returns how many it rang.
  size_t RingDoorbells();

  // What Send touched and lending holds (shm_files.h).
  ShmSendSet<Peer>& sends() { return sends_; }

 private:
  std::unique_ptr<Peer> Open(uint16_t port);
  void ForgetGone();

  const std::string dir_;
  const Endpoint source_;
  const uint32_t pid_;
  std::unordered_map<uint16_t, std::unique_ptr<Peer>> peers_;
  ShmSendSet<Peer> sends_;
  Peer* last_peer_ = nullptr;  // Find's last answer, and its port
  uint16_t last_port_ = 0;
  std::unordered_set<uint16_t> missing_warned_;  // ports without an inbox already logged
};

}  // namespace switchml::transport
