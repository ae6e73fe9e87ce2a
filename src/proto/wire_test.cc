#include "proto/wire.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "hwy/tests/hwy_gtest.h"
#include "proto/byte_order.h"

namespace switchml::proto {
namespace {

// A known 64-element packet: msg_type 1, size code 1, job 0x2a, tsi 0x01020304, slot 0x1234 in
// set 1, e0 = -3, e1 = 5, values 0, -1, 2, -3, ... written by hand below.
std::vector<uint8_t> GoldenSmall() {
  std::vector<uint8_t> d = {
      0x11,                    // msg_type 1 << 4 | size 1
      0x2a,                    // job_number
      0x01, 0x02, 0x03, 0x04,  // tsi, big-endian
      0x92, 0x34,              // pool_index: set bit 15 | 0x1234
      0xfd, 0x05,              // e0 = -3, e1 = 5
  };
  for (int i = 0; i < 64; ++i) {
    int32_t v = (i % 2 == 0) ? i : -i;
    uint32_t u = static_cast<uint32_t>(v);
    d.push_back(u >> 24);
    d.push_back((u >> 16) & 0xff);
    d.push_back((u >> 8) & 0xff);
    d.push_back(u & 0xff);
  }
  return d;
}

TEST(WireTest, DecodesGoldenBytes) {
  auto d = GoldenSmall();
  ASSERT_EQ(d.size(), 266u);
  Packet p;
  ASSERT_EQ(Decode(d, &p), DecodeError::kOk);
  EXPECT_EQ(p.header.msg_type, 1);
  EXPECT_EQ(p.header.size, SizeCode::k256B);
  EXPECT_EQ(p.header.job_number, 0x2a);
  EXPECT_EQ(p.header.tsi, 0x01020304u);
  EXPECT_EQ(p.header.slot, (SlotId{0x1234, 1}));
  EXPECT_EQ(p.header.e0, -3);
  EXPECT_EQ(p.header.e1, 5);
  ASSERT_EQ(p.numel(), 64u);
  EXPECT_EQ(p.values[0], 0);
  EXPECT_EQ(p.values[1], -1);
  EXPECT_EQ(p.values[2], 2);
  EXPECT_EQ(p.values[63], -63);
}

TEST(WireTest, EncodesGoldenBytes) {
  Packet p;
  p.header = Header{1, SizeCode::k256B, 0x2a, 0x01020304, SlotId{0x1234, 1}, -3, 5};
  for (int i = 0; i < 64; ++i) p.values[i] = (i % 2 == 0) ? i : -i;
  std::vector<uint8_t> out(DatagramBytes(SizeCode::k256B));
  ASSERT_EQ(Encode(p, out), 266u);
  EXPECT_EQ(out, GoldenSmall());
}

TEST(WireTest, LargePacketRoundTripsExtremeValues) {
  Packet p;
  p.header = Header{1, SizeCode::k1024B, 255, 0xffffffffu, SlotId{16383, 0}, -128, 127};
  for (int i = 0; i < 256; ++i)
    p.values[i] = (i % 3 == 0) ? INT32_MIN : (i % 3 == 1 ? INT32_MAX : i);
  std::vector<uint8_t> out(DatagramBytes(SizeCode::k1024B));
  ASSERT_EQ(Encode(p, out), 1034u);
  EXPECT_EQ(out[0], 0x13);
  EXPECT_EQ(out[6], 0x3f);  // set 0, slot 16383 = 0x3fff
  EXPECT_EQ(out[7], 0xff);
  EXPECT_EQ(out[10], 0x80);  // INT32_MIN big-endian
  EXPECT_EQ(out[11], 0x00);
  Packet q;
  ASSERT_EQ(Decode(out, &q), DecodeError::kOk);
  EXPECT_EQ(q.header, p.header);
  EXPECT_EQ(q.values, p.values);
}

TEST(WireTest, RejectsShortDatagram) {
  auto d = GoldenSmall();
  Header h;
  EXPECT_EQ(DecodeHeader(std::span(d).first(9), &h), DecodeError::kTooShort);
  EXPECT_EQ(DecodeHeader({}, &h), DecodeError::kTooShort);
}

TEST(WireTest, RejectsLengthThatDoesNotMatchSizeCode) {
  auto d = GoldenSmall();
  Header h;
  EXPECT_EQ(DecodeHeader(std::span(d).first(265), &h), DecodeError::kLengthMismatch);
  d.push_back(0);
  EXPECT_EQ(DecodeHeader(d, &h), DecodeError::kLengthMismatch);
  d.resize(1034);  // right length for size 3, but the header says size 1
  EXPECT_EQ(DecodeHeader(d, &h), DecodeError::kLengthMismatch);
}

TEST(WireTest, RejectsBadMsgTypeSizeAndReservedBits) {
  Header h;
  auto d = GoldenSmall();
  d[0] = 0x21;
  EXPECT_EQ(DecodeHeader(d, &h), DecodeError::kBadMsgType);
  d = GoldenSmall();
  d[0] = 0x10;  // size code 0 (128 B) is not supported
  EXPECT_EQ(DecodeHeader(d, &h), DecodeError::kUnsupportedSize);
  d[0] = 0x12;
  EXPECT_EQ(DecodeHeader(d, &h), DecodeError::kUnsupportedSize);
  d[0] = 0x17;
  EXPECT_EQ(DecodeHeader(d, &h), DecodeError::kUnsupportedSize);
  d = GoldenSmall();
  d[0] = 0x19;  // unused bit 3 set
  EXPECT_EQ(DecodeHeader(d, &h), DecodeError::kReservedBit);
  d = GoldenSmall();
  d[6] = 0x40;  // pool_index bit 14
  EXPECT_EQ(DecodeHeader(d, &h), DecodeError::kReservedBit);
}

TEST(WireTest, SizeCodes) {
  SizeCode c;
  ASSERT_TRUE(SizeCodeForNumel(64, &c));
  EXPECT_EQ(c, SizeCode::k256B);
  ASSERT_TRUE(SizeCodeForNumel(256, &c));
  EXPECT_EQ(c, SizeCode::k1024B);
  EXPECT_FALSE(SizeCodeForNumel(128, &c));
  EXPECT_FALSE(SizeCodeForNumel(0, &c));
  EXPECT_FALSE(SizeCodeForNumel(4096, &c));
  // Our jumbo sizes (docs/protocol.md 2.6): codes 4, 5, 6.
  const std::pair<size_t, SizeCode> jumbo[] = {
      {512, SizeCode::k2048B}, {1024, SizeCode::k4096B}, {2048, SizeCode::k8192B}};
  for (const auto& [numel, code] : jumbo) {
    ASSERT_TRUE(SizeCodeForNumel(numel, &c)) << numel;
    EXPECT_EQ(c, code);
    EXPECT_EQ(NumelOf(code), numel);
    EXPECT_TRUE(IsSupportedSize(code));
    EXPECT_TRUE(IsJumboSize(code));
    EXPECT_FALSE(IsReferenceSize(code));
  }
  EXPECT_EQ(EncodePoolIndex(SlotId{5, 1}), 0x8005);
}

// Each jumbo code round-trips a full packet with the exact length 10 + 4 * numel, and decoding
// refuses a length one short or one long, or the length of another code.
TEST(WireTest, JumboPacketsRoundTripWithExactLengths) {
  for (const SizeCode code : {SizeCode::k2048B, SizeCode::k4096B, SizeCode::k8192B}) {
    const size_t numel = NumelOf(code);
    Packet p;
    p.header = Header{1, code, 9, 0x0a0b0c0du, SlotId{1023, 1}, -7, 12};
    for (size_t i = 0; i < numel; ++i) {
      p.values[i] = static_cast<int32_t>(i * 2654435761u) ^ (i % 2 ? INT32_MIN : 0);
    }
    std::vector<uint8_t> out(kMaxDatagramBytes + 8);
    ASSERT_EQ(Encode(p, out), 10 + 4 * numel);
    EXPECT_EQ(out[0], 0x10 | static_cast<uint8_t>(code));
    const std::span<const uint8_t> d(out.data(), 10 + 4 * numel);
    // The last element, big-endian, at the end of the datagram.
    const uint32_t last = static_cast<uint32_t>(p.values[numel - 1]);
    EXPECT_EQ(d[d.size() - 1], static_cast<uint8_t>(last));
    EXPECT_EQ(d[d.size() - 4], static_cast<uint8_t>(last >> 24));
    Packet q;
    ASSERT_EQ(Decode(d, &q), DecodeError::kOk);
    EXPECT_EQ(q.header, p.header);
    EXPECT_TRUE(std::equal(q.payload().begin(), q.payload().end(), p.payload().begin()));
    Header h;
    EXPECT_EQ(DecodeHeader(d.first(d.size() - 1), &h), DecodeError::kLengthMismatch);
    EXPECT_EQ(DecodeHeader(std::span<const uint8_t>(out.data(), d.size() + 1), &h),
              DecodeError::kLengthMismatch);
    EXPECT_EQ(DecodeHeader(std::span<const uint8_t>(out.data(), kReferenceMaxDatagramBytes), &h),
              DecodeError::kLengthMismatch);
  }
  // A reference 1034-byte datagram relabelled with a jumbo code is a length mismatch.
  std::vector<uint8_t> d(kReferenceMaxDatagramBytes, 0);
  d[0] = 0x16;
  Header h;
  EXPECT_EQ(DecodeHeader(d, &h), DecodeError::kLengthMismatch);
}

// The payload kernels against the element-by-element definition, on every SIMD target compiled
// into the library that this CPU supports (the fixture forces Highway's dispatch to one target),
// for lengths that end on and between vector boundaries and at offsets that are not aligned.
class PayloadKernelTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(PayloadKernelTest);

std::vector<int32_t> RandomValues(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = static_cast<int32_t>(rng());
  const int32_t edges[] = {0, -1, 1, std::numeric_limits<int32_t>::max(),
                           std::numeric_limits<int32_t>::min()};
  for (size_t i = 0; i < n && i < 5; ++i) v[i] = edges[i];
  return v;
}

TEST_P(PayloadKernelTest, LoadStoreAndAddMatchTheDefinition) {
  for (size_t n : {0, 1, 3, 4, 7, 15, 16, 17, 33, 64, 100, 256}) {
    for (size_t offset : {0, 1, 3}) {  // misaligned wire bytes
      SCOPED_TRACE(testing::Message() << "n " << n << " offset " << offset);
      const std::vector<int32_t> values = RandomValues(n, static_cast<uint32_t>(n * 7 + offset));
      std::vector<uint8_t> buffer(offset + 4 * n + 8, 0xee);
      const std::span<uint8_t> wire(buffer.data() + offset, 4 * n);
      StorePayload(values, wire);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(LoadBe32(&wire[4 * i]), static_cast<uint32_t>(values[i])) << i;
      }
      for (size_t i = offset + 4 * n; i < buffer.size(); ++i) ASSERT_EQ(buffer[i], 0xee);

      std::vector<int32_t> loaded(n + 1, 42);
      LoadPayload(wire, std::span<int32_t>(loaded).first(n));
      EXPECT_EQ(std::vector<int32_t>(loaded.begin(), loaded.begin() + static_cast<long>(n)),
                values);
      EXPECT_EQ(loaded[n], 42);

      std::vector<int32_t> sums = RandomValues(n, static_cast<uint32_t>(n + 1000));
      std::vector<int32_t> expected(n);
      for (size_t i = 0; i < n; ++i) {  // 32-bit wrap-around
        expected[i] =
            static_cast<int32_t>(static_cast<uint32_t>(sums[i]) + static_cast<uint32_t>(values[i]));
      }
      AddPayload(wire, sums);
      EXPECT_EQ(sums, expected);
    }
  }
}

// The fused forms (the switch's completing contribution with its reply's payload), into another
// buffer and in place over the wire bytes.
TEST_P(PayloadKernelTest, FusedAddAndLoadWriteTheReplyPayload) {
  for (size_t n : {0, 1, 7, 8, 9, 16, 17, 64, 100, 256}) {
    for (size_t offset : {0, 1, 3}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << "n " << n << " offset " << offset << " in place " << in_place);
        const std::vector<int32_t> values = RandomValues(n, static_cast<uint32_t>(n * 3 + offset));
        std::vector<uint8_t> in_buffer(offset + 4 * n + 8, 0xee);
        const std::span<uint8_t> wire(in_buffer.data() + offset, 4 * n);
        std::vector<uint8_t> out_buffer(offset + 4 * n + 8, 0xdd);
        const std::span<uint8_t> out =
            in_place ? wire : std::span<uint8_t>(out_buffer.data() + offset, 4 * n);

        StorePayload(values, wire);
        std::vector<int32_t> sums = RandomValues(n, static_cast<uint32_t>(n + 2000));
        std::vector<int32_t> expected(n);
        for (size_t i = 0; i < n; ++i) {
          expected[i] = static_cast<int32_t>(static_cast<uint32_t>(sums[i]) +
                                             static_cast<uint32_t>(values[i]));
        }
        AddPayloadAndStore(wire, sums, out);
        EXPECT_EQ(sums, expected);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(LoadBe32(&out[4 * i]), static_cast<uint32_t>(expected[i])) << i;
        }

        StorePayload(values, wire);
        std::vector<int32_t> loaded(n + 1, 42);
        LoadPayloadAndCopy(wire, std::span<int32_t>(loaded).first(n), out);
        EXPECT_EQ(std::vector<int32_t>(loaded.begin(), loaded.begin() + static_cast<long>(n)),
                  values);
        EXPECT_EQ(loaded[n], 42);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(LoadBe32(&out[4 * i]), static_cast<uint32_t>(values[i])) << i;
        }
        // Nothing outside the payloads is touched.
        for (size_t i = offset + 4 * n; i < in_buffer.size(); ++i) ASSERT_EQ(in_buffer[i], 0xee);
        for (size_t i = 0; i < out_buffer.size(); ++i) {
          if (!in_place && i >= offset && i < offset + 4 * n) continue;
          ASSERT_EQ(out_buffer[i], 0xdd) << i;
        }
      }
    }
  }
}

TEST(WireDeathTest, FusedKernelsRefuseAnOverlapThatIsNotInPlace) {
  std::vector<uint8_t> buffer(1024 + 4);
  std::vector<int32_t> sums(256);
  const std::span<const uint8_t> wire(buffer.data(), 1024);
  const std::span<uint8_t> shifted(buffer.data() + 4, 1024);
  EXPECT_DEATH(AddPayloadAndStore(wire, sums, shifted), "overlaps");
  EXPECT_DEATH(LoadPayloadAndCopy(wire, sums, shifted), "overlaps");
}

}  // namespace
}  // namespace switchml::proto
