#include "proto/wire.h"

#include "base/check.h"

namespace switchml::proto {
namespace {

inline uint32_t LoadBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
inline void StoreBe32(uint32_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

}  // namespace

bool SizeCodeForNumel(size_t numel, SizeCode* out) {
  if (numel == 64) {
    *out = SizeCode::k256B;
    return true;
  }
  if (numel == 256) {
    *out = SizeCode::k1024B;
    return true;
  }
  return false;
}

const char* DecodeErrorName(DecodeError e) {
  switch (e) {
    case DecodeError::kOk:
      return "ok";
    case DecodeError::kTooShort:
      return "too_short";
    case DecodeError::kBadMsgType:
      return "bad_msg_type";
    case DecodeError::kUnsupportedSize:
      return "unsupported_size";
    case DecodeError::kLengthMismatch:
      return "length_mismatch";
    case DecodeError::kReservedBit:
      return "reserved_bit";
  }
  return "unknown";
}

DecodeError DecodeHeader(std::span<const uint8_t> d, Header* out) {
  if (d.size() < kPrefixBytes) return DecodeError::kTooShort;
  const uint8_t b0 = d[0];
  const uint8_t msg_type = b0 >> 4;
  if (msg_type != kMsgTypeData) return DecodeError::kBadMsgType;
  if (b0 & 0x08) return DecodeError::kReservedBit;
  const auto size = static_cast<SizeCode>(b0 & 0x07);
  if (!IsSupportedSize(size)) return DecodeError::kUnsupportedSize;
  if (d.size() != DatagramBytes(size)) return DecodeError::kLengthMismatch;
  const uint16_t pool = static_cast<uint16_t>((uint16_t{d[6]} << 8) | d[7]);
  if (pool & 0x4000) return DecodeError::kReservedBit;
  out->msg_type = msg_type;
  out->size = size;
  out->job_number = d[1];
  out->tsi = LoadBe32(&d[2]);
  out->slot =
      SlotId{static_cast<uint16_t>(pool & (kMaxSlots - 1)), static_cast<uint8_t>(pool >> 15)};
  out->e0 = static_cast<int8_t>(d[8]);
  out->e1 = static_cast<int8_t>(d[9]);
  return DecodeError::kOk;
}

void EncodeHeader(const Header& h, std::span<uint8_t> out) {
  CHECK(out.size() >= kPrefixBytes);
  CHECK(h.slot.index < kMaxSlots && h.slot.set <= 1)
      << "slot " << h.slot.index << " set " << int{h.slot.set};
  out[0] = static_cast<uint8_t>((h.msg_type << 4) | (static_cast<uint8_t>(h.size) & 0x07));
  out[1] = h.job_number;
  StoreBe32(h.tsi, &out[2]);
  const uint16_t pool = EncodePoolIndex(h.slot);
  out[6] = static_cast<uint8_t>(pool >> 8);
  out[7] = static_cast<uint8_t>(pool);
  out[8] = static_cast<uint8_t>(h.e0);
  out[9] = static_cast<uint8_t>(h.e1);
}

void LoadPayload(std::span<const uint8_t> wire, std::span<int32_t> values) {
  CHECK_EQ(wire.size(), values.size() * 4);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<int32_t>(LoadBe32(&wire[4 * i]));
  }
}

void StorePayload(std::span<const int32_t> values, std::span<uint8_t> wire) {
  CHECK_EQ(wire.size(), values.size() * 4);
  for (size_t i = 0; i < values.size(); ++i) {
    StoreBe32(static_cast<uint32_t>(values[i]), &wire[4 * i]);
  }
}

DecodeError Decode(std::span<const uint8_t> d, Packet* out) {
  DecodeError e = DecodeHeader(d, &out->header);
  if (e != DecodeError::kOk) return e;
  LoadPayload(d.subspan(kPrefixBytes), out->payload());
  return DecodeError::kOk;
}

size_t Encode(const Header& h, std::span<const int32_t> values, std::span<uint8_t> out) {
  const size_t n = NumelOf(h.size);
  CHECK_EQ(values.size(), n);
  CHECK(out.size() >= kPrefixBytes + 4 * n);
  EncodeHeader(h, out);
  StorePayload(values, out.subspan(kPrefixBytes, 4 * n));
  return kPrefixBytes + 4 * n;
}

size_t Encode(const Packet& p, std::span<uint8_t> out) {
  return Encode(p.header, p.payload(), out);
}

}  // namespace switchml::proto
