// Fuzzes the wire codec (proto/wire.h) and the quantizer's wire kernels (quant/quantizer.h).
//
// Codec: any bytes either fail DecodeHeader with one of its errors, or decode, and then
// re-encoding the header and payload gives the same bytes back (nothing is accepted that the
// codec would not write), Decode agrees with DecodeHeader, and the datagram has exactly the
// size code's length. Quantizer: for a block of floats taken from the input (any bit patterns:
// NaN, inf, denormals), the SIMD kernels (QuantizeToWire, DequantizeFromWire) give bit for bit
// the scalar reference's results (Quantize, Dequantize), and finite inputs quantize within the
// documented range |q| <= INT32_MAX / n.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "proto/wire.h"
#include "quant/quantizer.h"

namespace {

using namespace switchml;

void FuzzCodec(std::span<const uint8_t> d) {
  proto::Header h;
  const proto::DecodeError e = proto::DecodeHeader(d, &h);
  FUZZ_CHECK(static_cast<int>(e) < proto::kNumDecodeErrors);
  proto::Packet p;
  FUZZ_CHECK(proto::Decode(d, &p) == e);
  if (e != proto::DecodeError::kOk) return;
  FUZZ_CHECK(p.header == h);
  FUZZ_CHECK(proto::IsSupportedSize(h.size));
  FUZZ_CHECK(d.size() == proto::DatagramBytes(h.size));
  std::vector<uint8_t> again(proto::kMaxDatagramBytes);
  const size_t n = proto::Encode(p, again);
  FUZZ_CHECK(n == d.size());
  FUZZ_CHECK(std::memcmp(again.data(), d.data(), n) == 0);
}

void FuzzQuantizer(FuzzedDataProvider& in) {
  const uint32_t n = in.ConsumeIntegralInRange<uint32_t>(1, 64);
  const int8_t extra = in.ConsumeIntegralInRange<int8_t>(0, 3);
  const size_t count = in.ConsumeIntegralInRange<size_t>(0, proto::kMaxNumel);
  std::vector<float> block(count);
  for (float& f : block) {
    const uint32_t bits = in.ConsumeIntegral<uint32_t>();
    std::memcpy(&f, &bits, sizeof f);
  }
  const quant::BlockInfo info = quant::AnalyzeBlock(block);
  // The max over workers is at least this block's exponent (another worker's may be higher).
  int e = info.exponent;
  if (e != quant::kZeroBlockExponent) e = std::min<int>(quant::kMaxExponent, e + extra);
  const auto max_e = static_cast<int8_t>(e);
  std::vector<int32_t> ref(count);
  quant::Quantize(block, max_e, n, ref);
  std::vector<uint8_t> wire(4 * count);
  quant::QuantizeToWire(block, max_e, n, wire);
  std::vector<int32_t> loaded(count);
  proto::LoadPayload(wire, loaded);
  FUZZ_CHECK(loaded == ref);
  for (size_t i = 0; i < count; ++i) {
    if (std::isfinite(block[i])) FUZZ_CHECK(std::abs(int64_t{ref[i]}) <= INT32_MAX / n);
  }
  // Dequantize arbitrary sums (from the input) both ways.
  std::vector<int32_t> sums(count);
  for (int32_t& s : sums) s = in.ConsumeIntegral<int32_t>();
  proto::StorePayload(sums, wire);
  std::vector<float> a(count), b(count);
  quant::Dequantize(sums, max_e, n, a);
  quant::DequantizeFromWire(wire, max_e, n, b);
  FUZZ_CHECK(count == 0 || std::memcmp(a.data(), b.data(), 4 * count) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Both on every input: the codec sees the bytes as a datagram, the quantizer as its choices.
  FuzzCodec(std::span<const uint8_t>(data, size));
  FuzzedDataProvider in(data, size);
  FuzzQuantizer(in);
  return 0;
}
