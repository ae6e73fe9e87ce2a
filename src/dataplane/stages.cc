#include "dataplane/stages.h"

#include "base/check.h"

namespace switchml::dataplane {

WorkerBitmapStage::WorkerBitmapStage(uint32_t num_slots) : bitmaps_(size_t{num_slots} * 2, 0) {}

WorkerCounterStage::WorkerCounterStage(uint32_t num_slots)
    : counts_(size_t{num_slots} * 2, 0), rounds_(size_t{num_slots} * 2) {}

ExponentMaxStage::ExponentMaxStage(uint32_t num_slots)
    : e0_(size_t{num_slots} * 2, 0), e1_(size_t{num_slots} * 2, 0) {}

AggregateStage::AggregateStage(uint32_t num_slots, size_t numel)
    : numel_(numel),
      values_(std::make_unique_for_overwrite<int32_t[]>(size_t{num_slots} * 2 * numel)) {
  CHECK(numel > 0 && numel <= proto::kMaxNumel) << "numel " << numel;
}

std::span<const int32_t> AggregateStage::Store(proto::SlotId s, std::span<const uint8_t> payload) {
  const std::span<int32_t> sums(values_.get() + RegisterIndex(s) * numel_, numel_);
  proto::LoadPayload(payload, sums);
  return sums;
}

NextStepStage::NextStepStage(uint32_t num_slots) : stored_(size_t{num_slots} * 2) {}

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
