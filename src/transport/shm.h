// The host-local shared-memory backend ("shm"): datagrams move between the transports of one
// host by a user-space copy into a ring in shared memory instead of two kernel copies and a
// system call each, and are received in place.
//
// Addressing is that of UDP on loopback: a transport has an endpoint (its bind address, or
// 127.0.0.1 when bound to 0.0.0.0, and a port) and sends to endpoints; only the port selects the
// destination (every shm transport is on this host). A transport "listens" by creating its inbox,
// a file `inbox-<port>` in a per-user directory (ShmOptions::directory, options.h: through the
// factory $SWITCHML_SHM_DIR, else /dev/shm/switchml-<uid>; made 0700 and refused unless it is ours
// and closed to others; files 0600). The inbox holds:
//   - a header page: geometry, the receiver's doorbell (a futex word and a "sleeping" flag), a
//     "closed" flag, and a registration table of max_senders entries (state and pid in one
//     64-bit word, the sender's endpoint);
//   - max_senders single-producer/single-consumer rings of ring_slots slots, one per sending
//     transport: a producer index, a consumer index (each on its own cache line), then slots of
//     a length word and max_datagram_bytes of data, 64-byte aligned.
// The file is sparse (ftruncate on tmpfs): only pages that traffic touches take memory. With
// the data plane's 512 slots (kShmDataPlaneRingSlots; the default is 1024) and the daemon's
// 1046-byte datagrams (1088-byte slots) a ring is 0.54 MiB, so a pair of transports that talk
// costs about 0.5 MiB on the receiver's side and the virtual size of an inbox is 256 rings,
// 137 MiB (1024 slots: twice that).
//
// Protocol, with what each side trusts:
//   - Open: the inbox is made under a temporary name, locked (flock LOCK_EX, held for the
//     transport's life), sized and initialised, then linked to `inbox-<port>`. A file of that
//     name that is locked belongs to a live transport: the port is in use (kUnavailable). One
//     that is not locked was left by a process that died: it is marked closed and replaced
//     (rename, while holding its lock and after checking the name still refers to it).
//   - A sender's first datagram to a port opens that inbox (O_NOFOLLOW, our own regular file;
//     geometry checked against the file size; unlocked = stale: counted in send_errors), claims
//     a free registration entry (compare-and-swap of the state word: claimed | pid), writes its
//     endpoint, and publishes it (active | pid, release) and bumps the table version. It maps
//     only the header and its own ring.
//   - Lending (TxBufferTo(i, destination)): slot head + i of our ring in the destination's
//     inbox, while the ring has room for it and its slots hold max_datagram_bytes(); else
//     TxBuffer(i)'s private memory. Nothing is published until Send takes the datagram; a
//     destination dropped while lent (closed, gone) stays mapped until the next batch (the next
//     TxBuffer or TxBufferTo call for index 0). (auth.h's wrapper does not lend while keyed:
//     a tag computed in shared memory would vouch for what another process wrote there.)
//   - Send copies each datagram into the destination ring's next slot, unless it was built
//     there (a lent slot: counted in sent_in_place), with memmove (a datagram left out before
//     others moves the later lent ones down); its length word holds the datagram's length; at
//     most max_datagram_bytes are copied. After the batch it publishes
//     each touched ring's producer index (release), then, after a full fence, rings the
//     receiver's doorbell once per destination if the receiver announced that it sleeps (a
//     futex wake, shared, not FUTEX_PRIVATE). A full ring stops the batch (fewer taken,
//     send_buffer_full), unless its receiver is gone (no lock on its inbox, or it is marked
//     closed): then the sender forgets it and counts the datagram in send_errors. A port without
//     an inbox: send_errors, skipped, like UDP's refused port.
//   - Receive first returns the slots lent by the previous call (the consumer index, release),
//     rescans the registration table when its version moved, then takes datagrams from its
//     rings round robin (acquire). Everything read from the shared memory is untrusted input:
//     the producer index is read once per ring and a ring whose count of waiting datagrams
//     exceeds its slots is dropped for good; a length word is read once, and one beyond 65535 is
//     counted in `malformed` and its slot skipped; one beyond max_datagram_bytes is cut and
//     flagged; slot indices are masked. A sender that dies mid-write published nothing of that
//     datagram and can never block the receiver or other senders (one ring each).
//   - Sleeping: the receiver sets "sleeping", fences, reads the futex word, polls its rings once
//     more, and waits on the word (FUTEX_WAIT with the remaining timeout); either the sender's
//     fence-then-load sees "sleeping" and rings, or the receiver's poll sees the datagram.
//     Wake() bumps the word and wakes the futex too. An optional bounded spin precedes sleeping
//     (ShmOptions::spin; off by default: the host's cores are shared).
//   - Close: a sender marks its entries closed (the receiver frees each once drained); a
//     receiver marks its inbox closed and unlinks it. Entries of senders whose pid is gone are
//     freed by the receiver (checked at most once a second, by Receive: also by one that never
//     sleeps). Processes that
//     share a directory must share a pid namespace (the default).
//
// Groups (multicast on this host; docs/architecture.md, "Multicast results"): a datagram sent
// to an address in 224.0.0.0/4 goes to the group file `group-<address>-<port>` in the same
// directory, written once however many members read it. JoinGroup(group, 0) makes a transport
// a member: its Receive then also takes the group's datagrams (from the producer's endpoint,
// counted in group_datagrams_received). The file holds:
//   - a header page: geometry, a "closed" flag, the member table's version, the producer index
//     (on a line of its own), the producer's endpoint, and a member table of 128 entries, one
//     cache line each: state and pid in one 64-bit word, the member's cursor (the next slot it
//     reads), the member's endpoint (its inbox, whose doorbell the producer rings);
//   - one ring of slots as an inbox ring's (a length word and the data, 64-byte aligned), of
//     the first member's ring_slots; datagrams up to the slot's size after the length word.
// Protocol, with what each side trusts:
//   - Members hold the file with flock LOCK_SH. The first member makes it (a temporary name,
//     then link). A file that no one holds (left by members that died, or not a group file) is
//     replaced (marked closed, rename) by the next member. A member claims a free entry
//     (compare-and-swap: claimed | pid), takes an OFD lock (fcntl F_OFD_SETLK) on byte 1 + entry
//     of the file, held while it is a member (the kernel releases it when the process dies),
//     writes its endpoint, marks it joining and bumps the table version. The last member to
//     leave (LOCK_EX then succeeds) marks the file closed and unlinks it. While no entry is
//     claimed, a leaving member's failed LOCK_EX is tried again for up to a second: a process
//     stopped by a signal gives its entries back first (RemoveOwnShmFiles) and holds LOCK_SH
//     until it exits.
//   - One producer per group: the first transport that sends to it takes an OFD lock on byte 0
//     (another transport that tries counts its datagrams in send_errors). It continues from the
//     published producer index. On each Send it compares the table version: when it moved, it
//     takes every joining member in (sets its cursor to the producer index, then marks it
//     active: a member starts at the head) and forgets members that left.
//   - Send writes a datagram into the group's next slot when every active member's cursor is
//     less than a ring behind, unless it was built there (TxBufferTo(i, group) lends slot
//     head + i while there is room: sent_in_place); publishes the producer index after the
//     batch (release), then, after the fence that unicast doorbells use, rings the doorbell of
//     each member's inbox that announced it sleeps. A live member never has unread slots
//     overwritten: while one holds the ring full, datagrams to the group are dropped and
//     counted in send_errors (they are recovered as lost results are: unicast retransmission)
//     and the batch goes on. A member whose OFD lock is released (it died) is dropped when the
//     ring is full (looked at at most every 10 ms: a system call per member); a cursor beyond
//     the producer index or more than a ring behind it is counted in `malformed` and its
//     member dropped (marked so: it joins again, at the head).
//   - Receive takes the group's slots, every other call before the inbox rings (as UDP's group
//     socket), and returns them as the inbox's: by storing its cursor on the next Receive. Read
//     from the file, untrusted: its own entry's state (not active: join again), the producer
//     index once per call (more than a ring ahead: `malformed`, join again; up to a ring behind
//     the cursor: a batch not yet published, nothing waits), each length word
//     once (beyond 65535: `malformed`, skipped; beyond the receiver's max_datagram_bytes: cut
//     and flagged), slot indices masked.
// Not here: other users (the directory is per user); groups on a LAN (interface_index must be
// 0).
//
// Implementation (internal headers): the ring protocol, pure, in shm_ring.h; the inbox (receiver)
// in shm_inbox.h; the inboxes a transport sends to in shm_peers.h; groups (producer, member) in
// shm_group.h; the removal of dead processes' files in shm_cleanup.cc; shm.cc composes them.
//
// Ownership: a Transport owns its inbox (file, lock, mapping), its mappings of the inboxes and
// groups it sends to (those whose receiver closed or died, or whose last member left, are let go
// when it opens a new one: a long-lived sender such as the switch meets new ones with every job),
// and of the group it joined. Thread-safety: as Transport (one thread uses it;
// Wake() and counters() from any thread). Blocking: Send never blocks; Receive blocks up to its
// timeout.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "switchml/status.h"
#include "transport/options.h"
#include "transport/transport.h"

namespace switchml::transport {

// The data plane's rings (the switch daemon's inbox; a worker's, unless its window needs more):
// twice a worker's automatic window on loopback (256), and half the memory that rings of 1024
// cycle through, which took less switch CPU per all-reduce in most loaded A/B rounds (noisy:
// docs/benchmarks.md, "Lending and smaller rings"). A
// sender with more in flight than a ring holds is held back by Send taking fewer.
inline constexpr uint32_t kShmDataPlaneRingSlots = 512;

// The directory of transports opened with `options`: options.directory, else
// /dev/shm/switchml-<uid> (environment.h's DefaultShmDirectory adds $SWITCHML_SHM_DIR).
std::string ShmDirectory(const ShmOptions& options);

// Whether a live shm transport listens on `port` in `dir`: its inbox is there, a file of ours,
// and locked by its holder (an unlocked one was left by a process that died). What a sender's
// first datagram would find (shm.h, "Open"); for the choice of transport "auto" (factory.h).
bool ShmPortHeld(const std::string& dir, uint16_t port);

// Removes the inboxes and group files in `dir` that no live transport holds and that only the
// processes `pids` used: an inbox one of them made, a group file whose members were all of them
// (a process that dies without closing its transports leaves its files behind; a supervisor
// such as `switchml run` calls this once its children have exited). Each is marked closed first
// (as a stale file being replaced is). Returns how many it removed; files it cannot open or
// lock, and files of other processes, are left alone.
size_t RemoveShmFilesLeftBy(const std::string& dir, const std::vector<uint32_t>& pids);

// The same for this process's own files, also those its live transports hold: the inboxes it
// made and the group files whose only members are its own transports, each marked closed and
// removed. For a process about to exit without closing its transports (`switchml worker`
// stopped by SIGINT/SIGTERM in the middle of a blocking call); those transports must not be
// used afterwards. Waits for files being made by other threads of this process, and makes later
// ones fail (UNAVAILABLE: the process is stopping), so that none is left behind
// (shm_files.h, ShmCreationLock). Returns how many it removed.
size_t RemoveOwnShmFiles(const std::string& dir);

// Opens one shm transport on options.port (which must not be 0), with options.shm (options.h:
// directory, ring geometry, spin); kind and loss are the factory's and ignored here. Errors: port
// in use (kUnavailable), a directory that is not ours or is open to others (kFailedPrecondition),
// bad options (kInvalidArgument).
Result<std::unique_ptr<Transport>> OpenShm(const TransportOptions& options);

// Opens `count` transports on consecutive ports base.port .. base.port + count - 1; with
// base.port == 0 a random base in [20000, 32000), retried while some port of it is in use.
Result<std::vector<std::unique_ptr<Transport>>> OpenShmConsecutive(const TransportOptions& base,
                                                                   size_t count);

}  // namespace switchml::transport
