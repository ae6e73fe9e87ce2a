// The stages of the software switch's pipeline, in the order of the reference P4 program:
//
//   (lookup, in switch.cc) -> WorkerBitmapStage -> WorkerCounterStage -> ExponentMaxStage
//     -> AggregateStage -> NextStepStage -> EncodeReply (the deparser)
//
// One explicit metadata struct (PacketMetadata) flows through them; each stage reads what the
// earlier stages wrote and writes only its own outputs. Each stage owns its "register array":
// one entry per (slot, set), 2 * num_slots entries, indexed by RegisterIndex(). One instance of
// each stage exists per job, so jobs never share state.
//
// The stages trust their inputs: the caller (Switch::Process) has already checked that the slot
// index is inside the pool, the payload has the job's length, and rank < num_workers <=
// kMaxWorkerBitmapWidth (256).
//
// Thread-safety: none; each instance belongs to one job of one Switch. No stage allocates after
// construction.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "proto/wire.h"

namespace switchml::dataplane {

// One bit per rank of a job (bit r = rank r): 256 bits, four 64-bit words (a Tofino keeps such a
// bitmap in several register arrays), so one switch aggregates up to 256 workers per job.
class WorkerBitmap {
 public:
  static constexpr uint32_t kWords = 4;
  constexpr WorkerBitmap() = default;
  // Bits 0..63 from `low` (so 0 and 1 convert, as for an integer bitmap).
  constexpr WorkerBitmap(uint64_t low) : w_{low, 0, 0, 0} {}  // NOLINT: implicit on purpose
  // This bitmap shifted left by n < 256 bits.
  constexpr WorkerBitmap operator<<(uint32_t n) const {
    WorkerBitmap r;
    const uint32_t words = n / 64, bits = n % 64;
    for (uint32_t i = kWords; i-- > words;) {
      uint64_t v = w_[i - words] << bits;
      if (bits != 0 && i > words) v |= w_[i - words - 1] >> (64 - bits);
      r.w_[i] = v;
    }
    return r;
  }
  constexpr WorkerBitmap& operator|=(const WorkerBitmap& o) {
    for (uint32_t i = 0; i < kWords; ++i) w_[i] |= o.w_[i];
    return *this;
  }
  constexpr WorkerBitmap& operator&=(const WorkerBitmap& o) {
    for (uint32_t i = 0; i < kWords; ++i) w_[i] &= o.w_[i];
    return *this;
  }
  constexpr WorkerBitmap operator~() const {
    WorkerBitmap r;
    for (uint32_t i = 0; i < kWords; ++i) r.w_[i] = ~w_[i];
    return r;
  }
  friend constexpr WorkerBitmap operator&(WorkerBitmap a, const WorkerBitmap& b) { return a &= b; }
  friend constexpr WorkerBitmap operator|(WorkerBitmap a, const WorkerBitmap& b) { return a |= b; }
  friend constexpr bool operator==(const WorkerBitmap& a, const WorkerBitmap& b) = default;
  uint64_t word(uint32_t i) const { return w_[i]; }
  // Single-bit forms for the packet path (r < 256): one word each, no 256-bit shift.
  static constexpr WorkerBitmap Bit(uint32_t r) {
    WorkerBitmap b;
    b.Set(r);
    return b;
  }
  constexpr bool Test(uint32_t r) const { return ((w_[r / 64] >> (r % 64)) & 1) != 0; }
  constexpr void Set(uint32_t r) { w_[r / 64] |= uint64_t{1} << (r % 64); }
  constexpr void Clear(uint32_t r) { w_[r / 64] &= ~(uint64_t{1} << (r % 64)); }
  constexpr bool Empty() const { return (w_[0] | w_[1] | w_[2] | w_[3]) == 0; }

 private:
  uint64_t w_[kWords] = {};
};
inline constexpr uint32_t kMaxWorkerBitmapWidth = 64 * WorkerBitmap::kWords;

// The register entry of a (slot, set): slot * 2 + set.
constexpr size_t RegisterIndex(proto::SlotId s) { return size_t{s.index} * 2 + s.set; }

// What the switch does with a packet once the pipeline has run.
enum class NextStep : uint8_t {
  kConsume,        // aggregated into a slot that is not complete yet: nothing to send
  kDropDuplicate,  // retransmission into an incomplete set, or a stale copy (see
                   // WorkerCounterStage)
  kMulticast,      // this packet completed the set: send the result to every worker of the job
  kUnicast,        // retransmission into a complete set: send the stored result to the sender
};

// The pipeline's metadata (the P4 program's user metadata), one per packet, on the stack.
//
// The inputs (set before the first stage) have default values. The stages' outputs have none:
// each stage writes every one of its outputs on every path through its Apply, so a packet's
// metadata needs no zeroing (zeroing the whole struct was a `rep stos`, about a third of
// Process's own time in perf). `PacketMetadata md;` thus leaves the outputs indeterminate until
// the stages run; `PacketMetadata md{};` zeroes them (the tests' form, and the form for code that
// fills in outputs itself, such as the deparser's callers).
struct PacketMetadata {
  // Set by the parser and the job lookup before the first stage.
  proto::Header header;
  std::span<const uint8_t> payload;  // the header's numel int32 values, wire order
  uint32_t num_workers = 0;
  uint32_t rank = 0;         // the sender's rank: its bit in the worker bitmaps
  bool running_tsi = false;  // the job's JobSpec::running_tsi
  // Where the reply's payload goes, set by the caller: out[kPrefixBytes, ...) of the buffer the
  // deparser will write (a transmit buffer, or the packet's own payload: a reply built over the
  // datagram it answers); empty: the deparser writes it. A contribution that completes its set
  // adds and writes the reply's payload in one pass (AggregateStage) and sets
  // reply_payload_written.
  std::span<uint8_t> reply_payload;

  // WorkerBitmapStage.
  bool first;          // this set's bitmap was empty: the first contribution of a fresh round
  bool seen;           // the sender's bit was already set: a retransmission
  bool other_had_bit;  // the sender's bit was set in the other set (Restore puts it back)

  // WorkerCounterStage.
  bool contribute;  // the payload and exponents go into the slot
  bool stale;       // a late copy of an earlier round (see WorkerCounterStage)
  bool complete;    // no contribution is missing in this set after this packet

  // ExponentMaxStage: the set's exponents after this packet.
  int8_t max_e0;
  int8_t max_e1;

  // AggregateStage: the set's values after this packet; points into the stage's registers and
  // is valid until the stage's next Apply. reply_payload_written: see reply_payload.
  std::span<const int32_t> result;
  bool reply_payload_written;

  // NextStepStage. reply_job_number and reply_tsi: echoed in the reply (the completing packet's
  // fields); zero when there is no reply (next kConsume or kDropDuplicate).
  NextStep next;
  uint8_t reply_job_number;
  uint32_t reply_tsi;
};

// Stage 1: the per-(slot, set) worker bitmap. Records who contributed to each set and, on every
// packet, clears the sender's bit in the other set: that is how a slot resets itself with no
// control-plane help.
class WorkerBitmapStage {
 public:
  explicit WorkerBitmapStage(uint32_t num_slots);
  // Reads md.header.slot and md.rank; writes first, seen, other_had_bit.
  void Apply(PacketMetadata& md);
  // Puts both sets back as they were before Apply(md): used for stale packets (md.stale).
  void Restore(const PacketMetadata& md);
  WorkerBitmap bitmap(proto::SlotId s) const { return bitmaps_[RegisterIndex(s)]; }

 private:
  std::vector<WorkerBitmap> bitmaps_;
};

// Stage 2: the per-(slot, set) count of contributions still missing. A fresh round (md.first)
// starts at num_workers - 1; each further new contribution decrements it; 0 means complete.
//
// Late network duplicates (beyond the reference P4 program, which would corrupt the slot): every
// worker of a job sends the same (job_number, tsi) for the same round of a slot, and the stage
// keeps the (job_number, tsi) of each set's current or last round. A new contribution (sender's
// bit clear) is stale and dropped, with the bitmap stage restoring its registers, when
//   - the set is in progress or complete and the packet belongs to another round (a copy of an
//     earlier round that arrived after its sender moved on to the other set), or the set is
//     complete (its sender's bit can only have been cleared by moving on: a late copy); or
//   - the set is empty (everyone moved on) and the packet is of the round the set completed last:
//     without this check that copy would open a fresh round holding stale data.
// When the job's workers send a running tsi (md.running_tsi, this project's workers), the second
// check is stronger: a first contribution whose tsi is not after the set's last round in serial
// order (int32_t(tsi - last) <= 0) is stale, however many rounds late it is; with the weaker check
// a copy two or more rounds late would open a round that can never complete.
// A legitimate packet never meets these conditions: a worker sends round r + 2 on a set only after
// round r + 1 completed, and a running tsi grows with every round of a slot (docs/protocol.md).
class WorkerCounterStage {
 public:
  explicit WorkerCounterStage(uint32_t num_slots);
  // Reads header.slot, num_workers, first, seen; writes contribute, stale, complete.
  void Apply(PacketMetadata& md);
  uint32_t count(proto::SlotId s) const { return counts_[RegisterIndex(s)]; }
  // Whether set s holds a complete round identified by (job_number, tsi): how a top-of-rack
  // switch matches a result from its upstream switch with the round it sent up.
  bool IsCompleteRound(proto::SlotId s, uint8_t job_number, uint32_t tsi) const {
    const size_t r = RegisterIndex(s);
    const Round& round = rounds_[r];
    return counts_[r] == 0 && round.valid && round.job_number == job_number && round.tsi == tsi;
  }

 private:
  struct Round {
    bool valid = false;
    uint8_t job_number = 0;
    uint32_t tsi = 0;
  };
  std::vector<uint32_t> counts_;
  std::vector<Round> rounds_;  // the (job_number, tsi) of each set's current or last round
};

// Stage 3: the per-(slot, set) maxima of the two exponents, each kept independently: written by
// the first contribution of a round, max'ed by the others.
class ExponentMaxStage {
 public:
  explicit ExponentMaxStage(uint32_t num_slots);
  // Reads header (slot, e0, e1), contribute, first; writes max_e0, max_e1.
  void Apply(PacketMetadata& md);
  int8_t e0(proto::SlotId s) const { return e0_[RegisterIndex(s)]; }
  int8_t e1(proto::SlotId s) const { return e1_[RegisterIndex(s)]; }
  // Overwrites set s's exponents (a top-of-rack switch storing its upstream's result).
  void Store(proto::SlotId s, int8_t e0, int8_t e1) {
    e0_[RegisterIndex(s)] = e0;
    e1_[RegisterIndex(s)] = e1;
  }

 private:
  std::vector<int8_t> e0_;
  std::vector<int8_t> e1_;
};

// Stage 4: the per-(slot, set) sums of numel int32 values: written by the first contribution of
// a round, added with 32-bit wrap-around by the others.
class AggregateStage {
 public:
  AggregateStage(uint32_t num_slots, size_t numel);
  // Reads header.slot, payload, contribute, first, complete, reply_payload; writes result and,
  // for a contribution that completes the set, the reply's payload (reply_payload_written).
  void Apply(PacketMetadata& md);
  std::span<const int32_t> values(proto::SlotId s) const {
    return {values_.get() + RegisterIndex(s) * numel_, numel_};
  }
  size_t numel() const { return numel_; }
  // Overwrites set s's values with a payload of numel wire-order int32 values (a top-of-rack
  // switch storing its upstream's result) and returns them.
  std::span<const int32_t> Store(proto::SlotId s, std::span<const uint8_t> payload);

 private:
  size_t numel_;
  // Left uninitialized on purpose: a round's first contribution writes before anything reads,
  // and untouched slots of a large pool then cost no memory.
  std::unique_ptr<int32_t[]> values_;
};

// Stage 5: decides drop, multicast or unicast, and keeps each complete set's echoed header fields
// (job_number, tsi of the packet that completed it) so a retransmitted result carries them too.
class NextStepStage {
 public:
  explicit NextStepStage(uint32_t num_slots);
  // Reads header, seen, contribute, stale, complete; writes next, reply_job_number, reply_tsi.
  void Apply(PacketMetadata& md);

 private:
  struct Stored {
    uint8_t job_number = 0;
    uint32_t tsi = 0;
  };
  std::vector<Stored> stored_;
};

// ---- The stages' per-packet functions, inline: Switch::Process runs them back to back, and as
// calls into another translation unit each reloaded the register index and its arrays.

inline void WorkerBitmapStage::Apply(PacketMetadata& md) {
  const size_t r = RegisterIndex(md.header.slot);
  WorkerBitmap& mine = bitmaps_[r];
  WorkerBitmap& other = bitmaps_[r ^ 1];  // the same slot's other set
  md.first = mine.Empty();
  md.seen = mine.Test(md.rank);
  md.other_had_bit = other.Test(md.rank);
  mine.Set(md.rank);
  other.Clear(md.rank);
}

// Apply changed only the sender's bit, in both sets.
inline void WorkerBitmapStage::Restore(const PacketMetadata& md) {
  const size_t r = RegisterIndex(md.header.slot);
  if (!md.seen) bitmaps_[r].Clear(md.rank);
  if (md.other_had_bit) bitmaps_[r ^ 1].Set(md.rank);
}

inline void WorkerCounterStage::Apply(PacketMetadata& md) {
  const size_t r = RegisterIndex(md.header.slot);
  uint32_t& count = counts_[r];
  Round& round = rounds_[r];
  const bool same_round =
      round.valid && round.job_number == md.header.job_number && round.tsi == md.header.tsi;
  md.contribute = false;
  md.stale = false;
  if (md.seen) {
    // A retransmission: only report whether the set is complete.
  } else if (md.first) {
    const bool not_newer = md.running_tsi
                               ? round.valid && static_cast<int32_t>(md.header.tsi - round.tsi) <= 0
                               : same_round && count == 0;
    if (not_newer) {
      md.stale = true;  // a late copy of a round this set completed before
    } else {
      count = md.num_workers - 1;
      round = Round{true, md.header.job_number, md.header.tsi};
      md.contribute = true;
    }
  } else if (count == 0 || !same_round) {
    md.stale = true;  // a late copy of an earlier round, not part of this one
  } else {
    --count;
    md.contribute = true;
  }
  md.complete = count == 0;
}

inline void ExponentMaxStage::Apply(PacketMetadata& md) {
  const size_t r = RegisterIndex(md.header.slot);
  if (md.contribute) {
    if (md.first) {
      e0_[r] = md.header.e0;
      e1_[r] = md.header.e1;
    } else {
      e0_[r] = std::max(e0_[r], md.header.e0);
      e1_[r] = std::max(e1_[r], md.header.e1);
    }
  }
  md.max_e0 = e0_[r];
  md.max_e1 = e1_[r];
}

inline void AggregateStage::Apply(PacketMetadata& md) {
  const std::span<int32_t> sums(values_.get() + RegisterIndex(md.header.slot) * numel_, numel_);
  md.result = sums;
  md.reply_payload_written = false;
  if (!md.contribute) return;
  // Straight from the wire bytes: byte order conversion and (for later contributions) the add
  // in one SIMD pass. Plain 32-bit wrap-around, as the switch's ALUs do. A contribution that
  // completes the set also writes the reply's payload in that pass (no second pass over the sums
  // in the deparser).
  if (md.complete && !md.reply_payload.empty()) {
    if (md.first) {
      proto::LoadPayloadAndCopy(md.payload, sums, md.reply_payload);
    } else {
      proto::AddPayloadAndStore(md.payload, sums, md.reply_payload);
    }
    md.reply_payload_written = true;
  } else if (md.first) {
    proto::LoadPayload(md.payload, sums);
  } else {
    proto::AddPayload(md.payload, sums);
  }
}

inline void NextStepStage::Apply(PacketMetadata& md) {
  md.reply_job_number = 0;
  md.reply_tsi = 0;
  if (md.contribute) {
    if (!md.complete) {
      md.next = NextStep::kConsume;
      return;
    }
    Stored& stored = stored_[RegisterIndex(md.header.slot)];
    stored.job_number = md.header.job_number;
    stored.tsi = md.header.tsi;
    md.next = NextStep::kMulticast;
  } else if (md.seen && md.complete) {
    md.next = NextStep::kUnicast;
  } else {
    md.next = NextStep::kDropDuplicate;
    return;
  }
  const Stored& stored = stored_[RegisterIndex(md.header.slot)];
  md.reply_job_number = stored.job_number;
  md.reply_tsi = stored.tsi;
}

// The deparser: encodes the reply of a kMulticast or kUnicast packet (msg_type 1, the packet's
// size and pool index, md.reply_* header fields, the max exponents and the sums) into out, which
// must hold proto::DatagramBytes(md.header.size). With md.reply_payload_written the sums are in
// place already (md.reply_payload is out's payload, CHECKed) and only the header is written.
// Returns the bytes written.
size_t EncodeReply(const PacketMetadata& md, std::span<uint8_t> out);

}  // namespace switchml::dataplane
