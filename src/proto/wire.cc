// The codec. Header fields are scalar code; the payload conversions (big-endian int32 <-> host
// int32, and the switch's add) are Highway kernels compiled once per SIMD target and dispatched at
// run time to the best one the CPU supports (docs/architecture.md, "SIMD kernels").
#include "proto/wire.h"

#include "base/check.h"
#include "proto/byte_order.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "proto/wire.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "proto/byte_order-inl.h"

HWY_BEFORE_NAMESPACE();
namespace switchml::proto::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Each kernel runs whole vectors, then the last n mod Lanes elements one at a time.
void LoadPayloadKernel(const uint8_t* HWY_RESTRICT wire, int32_t* HWY_RESTRICT values, size_t n) {
  const hn::ScalableTag<int32_t> d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(LoadBigEndian(d, wire + 4 * i), d, values + i);
  for (; i < n; ++i) values[i] = static_cast<int32_t>(LoadBe32(wire + 4 * i));
}

void StorePayloadKernel(const int32_t* HWY_RESTRICT values, uint8_t* HWY_RESTRICT wire, size_t n) {
  const hn::ScalableTag<int32_t> d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) StoreBigEndian(hn::LoadU(d, values + i), d, wire + 4 * i);
  for (; i < n; ++i) StoreBe32(static_cast<uint32_t>(values[i]), wire + 4 * i);
}

void AddPayloadKernel(const uint8_t* HWY_RESTRICT wire, int32_t* HWY_RESTRICT sums, size_t n) {
  const hn::ScalableTag<int32_t> d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(d, sums + i), LoadBigEndian(d, wire + 4 * i)), d, sums + i);
  }
  for (; i < n; ++i) {
    sums[i] = static_cast<int32_t>(static_cast<uint32_t>(sums[i]) + LoadBe32(wire + 4 * i));
  }
}

// sums += wire, then out = sums in wire order, in one pass. out may be wire itself (each vector
// is loaded before it is stored over), so neither is HWY_RESTRICT.
void AddPayloadAndStoreKernel(const uint8_t* wire, int32_t* HWY_RESTRICT sums, uint8_t* out,
                              size_t n) {
  const hn::ScalableTag<int32_t> d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto s = hn::Add(hn::LoadU(d, sums + i), LoadBigEndian(d, wire + 4 * i));
    hn::StoreU(s, d, sums + i);
    StoreBigEndian(s, d, out + 4 * i);
  }
  for (; i < n; ++i) {
    sums[i] = static_cast<int32_t>(static_cast<uint32_t>(sums[i]) + LoadBe32(wire + 4 * i));
    StoreBe32(static_cast<uint32_t>(sums[i]), out + 4 * i);
  }
}

// values = wire in host order; out = the wire bytes unchanged (nothing to write when out is wire).
void LoadPayloadAndCopyKernel(const uint8_t* wire, int32_t* HWY_RESTRICT values, uint8_t* out,
                              size_t n) {
  if (out == wire) {
    LoadPayloadKernel(wire, values, n);
    return;
  }
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR  // (one int32 lane has no byte vector of its own)
  const hn::ScalableTag<int32_t> d;
  const hn::Repartition<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  for (; i + lanes <= n; i += lanes) {
    const auto bytes = hn::LoadU(d8, wire + 4 * i);
    hn::StoreU(hn::BitCast(d, hn::TableLookupBytes(bytes, ReverseLaneBytesIndices(d8))), d,
               values + i);
    hn::StoreU(bytes, d8, out + 4 * i);
  }
#endif
  for (; i < n; ++i) {
    values[i] = static_cast<int32_t>(LoadBe32(wire + 4 * i));
    StoreBe32(LoadBe32(wire + 4 * i), out + 4 * i);
  }
}

}  // namespace switchml::proto::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace switchml::proto {

HWY_EXPORT(LoadPayloadKernel);
HWY_EXPORT(StorePayloadKernel);
HWY_EXPORT(AddPayloadKernel);
HWY_EXPORT(AddPayloadAndStoreKernel);
HWY_EXPORT(LoadPayloadAndCopyKernel);

bool SizeCodeForNumel(size_t numel, SizeCode* out) {
  for (const SizeCode code :
       {SizeCode::k256B, SizeCode::k1024B, SizeCode::k2048B, SizeCode::k4096B, SizeCode::k8192B}) {
    if (NumelOf(code) == numel) {
      *out = code;
      return true;
    }
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
  HWY_DYNAMIC_DISPATCH(LoadPayloadKernel)(wire.data(), values.data(), values.size());
}

void StorePayload(std::span<const int32_t> values, std::span<uint8_t> wire) {
  CHECK_EQ(wire.size(), values.size() * 4);
  HWY_DYNAMIC_DISPATCH(StorePayloadKernel)(values.data(), wire.data(), values.size());
}

void AddPayload(std::span<const uint8_t> wire, std::span<int32_t> sums) {
  CHECK_EQ(wire.size(), sums.size() * 4);
  HWY_DYNAMIC_DISPATCH(AddPayloadKernel)(wire.data(), sums.data(), sums.size());
}

namespace {
// out is wire, or does not overlap it.
bool SameOrDisjoint(std::span<const uint8_t> wire, std::span<const uint8_t> out) {
  return out.data() == wire.data() || out.data() + out.size() <= wire.data() ||
         wire.data() + wire.size() <= out.data();
}
}  // namespace

void AddPayloadAndStore(std::span<const uint8_t> wire, std::span<int32_t> sums,
                        std::span<uint8_t> out) {
  CHECK_EQ(wire.size(), sums.size() * 4);
  CHECK_EQ(out.size(), wire.size());
  CHECK(SameOrDisjoint(wire, out)) << "out overlaps wire";
  HWY_DYNAMIC_DISPATCH(AddPayloadAndStoreKernel)(wire.data(), sums.data(), out.data(), sums.size());
}

void LoadPayloadAndCopy(std::span<const uint8_t> wire, std::span<int32_t> values,
                        std::span<uint8_t> out) {
  CHECK_EQ(wire.size(), values.size() * 4);
  CHECK_EQ(out.size(), wire.size());
  CHECK(SameOrDisjoint(wire, out)) << "out overlaps wire";
  HWY_DYNAMIC_DISPATCH(LoadPayloadAndCopyKernel)
  (wire.data(), values.data(), out.data(), values.size());
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
#endif  // HWY_ONCE
