#include "dataplane/stages.h"

#include <algorithm>

#include "base/check.h"

namespace switchml::dataplane {

WorkerBitmapStage::WorkerBitmapStage(uint32_t num_slots) : bitmaps_(size_t{num_slots} * 2, 0) {}

void WorkerBitmapStage::Apply(PacketMetadata& md) {
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
void WorkerBitmapStage::Restore(const PacketMetadata& md) {
  const size_t r = RegisterIndex(md.header.slot);
  if (!md.seen) bitmaps_[r].Clear(md.rank);
  if (md.other_had_bit) bitmaps_[r ^ 1].Set(md.rank);
}

WorkerCounterStage::WorkerCounterStage(uint32_t num_slots)
    : counts_(size_t{num_slots} * 2, 0), rounds_(size_t{num_slots} * 2) {}

void WorkerCounterStage::Apply(PacketMetadata& md) {
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

ExponentMaxStage::ExponentMaxStage(uint32_t num_slots)
    : e0_(size_t{num_slots} * 2, 0), e1_(size_t{num_slots} * 2, 0) {}

void ExponentMaxStage::Apply(PacketMetadata& md) {
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

AggregateStage::AggregateStage(uint32_t num_slots, size_t numel)
    : numel_(numel),
      values_(std::make_unique_for_overwrite<int32_t[]>(size_t{num_slots} * 2 * numel)) {
  CHECK(numel > 0 && numel <= proto::kMaxNumel) << "numel " << numel;
}

void AggregateStage::Apply(PacketMetadata& md) {
  const std::span<int32_t> sums(values_.get() + RegisterIndex(md.header.slot) * numel_, numel_);
  if (md.contribute) {
    // Straight from the wire bytes: byte order conversion and (for later contributions) the add
    // in one SIMD pass. Plain 32-bit wrap-around, as the switch's ALUs do. A contribution that
    // completes the set also writes the reply's payload in that pass (no second pass over the
    // sums in the deparser).
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
  md.result = sums;
}

std::span<const int32_t> AggregateStage::Store(proto::SlotId s, std::span<const uint8_t> payload) {
  const std::span<int32_t> sums(values_.get() + RegisterIndex(s) * numel_, numel_);
  proto::LoadPayload(payload, sums);
  return sums;
}

NextStepStage::NextStepStage(uint32_t num_slots) : stored_(size_t{num_slots} * 2) {}

void NextStepStage::Apply(PacketMetadata& md) {
  Stored& stored = stored_[RegisterIndex(md.header.slot)];
  if (md.contribute) {
    if (!md.complete) {
      md.next = NextStep::kConsume;
      return;
    }
    stored.job_number = md.header.job_number;
    stored.tsi = md.header.tsi;
    md.next = NextStep::kMulticast;
  } else if (md.seen && md.complete) {
    md.next = NextStep::kUnicast;
  } else {
    md.next = NextStep::kDropDuplicate;
    return;
  }
  md.reply_job_number = stored.job_number;
  md.reply_tsi = stored.tsi;
}

size_t EncodeReply(const PacketMetadata& md, std::span<uint8_t> out) {
  proto::Header h;
  h.msg_type = proto::kMsgTypeData;
  h.size = md.header.size;
  h.job_number = md.reply_job_number;
  h.tsi = md.reply_tsi;
  h.slot = md.header.slot;
  h.e0 = md.max_e0;
  h.e1 = md.max_e1;
  if (md.reply_payload_written) {
    CHECK(md.reply_payload.data() == out.data() + proto::kPrefixBytes &&
          md.reply_payload.size() == md.result.size() * 4)
        << "the reply's payload was written elsewhere";
    proto::EncodeHeader(h, out);
    return proto::kPrefixBytes + md.reply_payload.size();
  }
  return proto::Encode(h, md.result, out);
}

}  // namespace switchml::dataplane
