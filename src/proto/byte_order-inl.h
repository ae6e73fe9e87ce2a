// Big-endian int32 vectors for Highway kernels: load and store a vector of int32 lanes from and
// to wire bytes, reversing the bytes of each lane with one byte shuffle. A per-target header
// (Highway's "-inl.h" convention): include it after hwy/highway.h inside a file compiled once
// per target (foreach_target.h); it defines the functions for the current HWY_TARGET.

// The toggle guard lets foreach_target.h include this once per target.
#if defined(SWITCHML_PROTO_BYTE_ORDER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SWITCHML_PROTO_BYTE_ORDER_INL_H_
#undef SWITCHML_PROTO_BYTE_ORDER_INL_H_
#else
#define SWITCHML_PROTO_BYTE_ORDER_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"
#include "proto/byte_order.h"

HWY_BEFORE_NAMESPACE();
namespace switchml::proto::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_SCALAR
// One lane: the element-by-element form (no byte shuffles on this target).
template <class D>
HWY_INLINE hn::Vec<D> LoadBigEndian(D d, const uint8_t* HWY_RESTRICT p) {
  return hn::Set(d, static_cast<hn::TFromD<D>>(LoadBe32(p)));
}

template <class D>
HWY_INLINE void StoreBigEndian(hn::Vec<D> v, D /* d */, uint8_t* HWY_RESTRICT p) {
  StoreBe32(static_cast<uint32_t>(hn::GetLane(v)), p);
}
#else
// Byte indices {3, 2, 1, 0, 7, 6, 5, 4, ...} within each 128-bit block: reverses every 4 bytes.
template <class D8>
HWY_INLINE hn::Vec<D8> ReverseLaneBytesIndices(D8 d8) {
  return hn::Xor(hn::And(hn::Iota(d8, 0), hn::Set(d8, 15)), hn::Set(d8, 3));
}

// Lanes(d) big-endian 32-bit values from p (unaligned).
template <class D>
HWY_INLINE hn::Vec<D> LoadBigEndian(D d, const uint8_t* HWY_RESTRICT p) {
  const hn::Repartition<uint8_t, D> d8;
  const auto bytes = hn::LoadU(d8, p);
  return hn::BitCast(d, hn::TableLookupBytes(bytes, ReverseLaneBytesIndices(d8)));
}

// Stores v's 32-bit lanes big-endian to p (unaligned), 4 * Lanes(d) bytes.
template <class D>
HWY_INLINE void StoreBigEndian(hn::Vec<D> v, D d, uint8_t* HWY_RESTRICT p) {
  const hn::Repartition<uint8_t, D> d8;
  hn::StoreU(hn::TableLookupBytes(hn::BitCast(d8, v), ReverseLaneBytesIndices(d8)), d8, p);
}
#endif

}  // namespace switchml::proto::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SWITCHML_PROTO_BYTE_ORDER_INL_H_
