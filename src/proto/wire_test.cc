#include "proto/wire.h"

#include <gtest/gtest.h>

#include <vector>

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
  std::vector<uint8_t> out(kMaxDatagramBytes);
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
  EXPECT_EQ(EncodePoolIndex(SlotId{5, 1}), 0x8005);
}

}  // namespace
}  // namespace switchml::proto
