#include "common/coding.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace nopfs::coding {
namespace {

std::vector<std::byte> B(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int x : v)
    out.push_back(static_cast<std::byte>(x));
  return out;
}

TEST(Coding, FixedWidthIsLittleEndian) {
  Writer w;
  w.U8(0x01);
  w.U16(0x0302);
  w.U32(0x07060504);
  w.U64(0x0f0e0d0c0b0a0908);
  EXPECT_EQ(w.bytes(), B({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));

  Reader r(w.bytes());
  uint8_t a = 0;
  uint16_t b = 0;
  uint32_t c = 0;
  uint64_t d = 0;
  ASSERT_TRUE(r.U8(&a) && r.U16(&b) && r.U32(&c) && r.U64(&d));
  EXPECT_EQ(a, 0x01);
  EXPECT_EQ(b, 0x0302);
  EXPECT_EQ(c, 0x07060504u);
  EXPECT_EQ(d, 0x0f0e0d0c0b0a0908u);
  EXPECT_TRUE(r.done());
  EXPECT_TRUE(r.ok());
}

TEST(Coding, StoreAndLoadAtAnOffset) {
  std::vector<std::byte> buf(12);
  StoreLe64(buf, 3, 0x8877665544332211u);
  EXPECT_EQ(buf, B({0, 0, 0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0}));
  EXPECT_EQ(LoadLe64(buf, 3), 0x8877665544332211u);
  EXPECT_EQ(LoadLe32(buf.data() + 3), 0x44332211u);
  EXPECT_EQ(LoadLe16(buf.data() + 3), 0x2211u);
}

TEST(Coding, BigEndian32SortsAsNumbers) {
  StringWriter a;
  StringWriter b;
  a.BigEndian32(255);
  b.BigEndian32(256);
  EXPECT_EQ(a.bytes(), std::string("\0\0\0\xff", 4));
  EXPECT_LT(a.bytes(), b.bytes());
  Reader r(b.bytes());
  uint32_t v = 0;
  ASSERT_TRUE(r.BigEndian32(&v));
  EXPECT_EQ(v, 256u);
}

TEST(Coding, VarintsRoundTripAtTheirBoundaries) {
  const std::vector<uint64_t> values = {
      0, 1, 127, 128, 16383, 16384, 0xFFFFFFFFu, 0x100000000u, UINT64_MAX / 2, UINT64_MAX};
  Writer w;
  for (uint64_t v : values)
    w.Varint(v);
  Reader r(w.bytes());
  for (uint64_t v : values) {
    uint64_t got = 0;
    ASSERT_TRUE(r.Varint64(&got)) << v << ": " << r.error();
    EXPECT_EQ(got, v);
  }
  EXPECT_TRUE(r.done());

  Writer one;
  one.Varint(300);
  EXPECT_EQ(one.bytes(), B({0xac, 0x02}));  // as protobuf writes 300
}

TEST(Coding, Varint32RejectsLongAndLargeValues) {
  uint32_t v = 0;
  {
    const std::vector<std::byte> in = B({0xff, 0xff, 0xff, 0xff, 0x0f});
    Reader r(in);
    ASSERT_TRUE(r.Varint32(&v));
    EXPECT_EQ(v, 0xFFFFFFFFu);
  }
  {
    const std::vector<std::byte> in = B({0xff, 0xff, 0xff, 0xff, 0x1f});
    Reader r(in);  // 2^33 - 1
    EXPECT_FALSE(r.Varint32(&v));
    EXPECT_STREQ(r.error(), "varint above 32 bits");
  }
  {
    const std::vector<std::byte> in = B({0x80, 0x80, 0x80, 0x80, 0x80, 0x01});
    Reader r(in);
    EXPECT_FALSE(r.Varint32(&v));
    EXPECT_STREQ(r.error(), "varint longer than 5 bytes");
  }
  {
    const std::vector<std::byte> in = B({0x80, 0x80});
    Reader r(in);
    EXPECT_FALSE(r.Varint32(&v));
    EXPECT_STREQ(r.error(), "truncated");
    EXPECT_EQ(r.pos(), 0u);
  }
  {
    uint64_t w = 0;
    const std::vector<std::byte> in =
        B({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02});
    Reader r(in);
    EXPECT_FALSE(r.Varint64(&w));
    EXPECT_STREQ(r.error(), "varint above 64 bits");
  }
}

TEST(Coding, LengthPrefixedStrings) {
  StringWriter w;
  w.Str("abc");
  w.Str("");
  EXPECT_EQ(w.bytes(), std::string("\3\0\0\0abc\0\0\0\0", 11));
  Reader r(w.bytes());
  std::string a = "x";
  std::string b = "x";
  ASSERT_TRUE(r.Str(&a) && r.Str(&b));
  EXPECT_EQ(a, "abc");
  EXPECT_EQ(b, "");
  EXPECT_TRUE(r.done());
}

TEST(Coding, AStringLongerThanItsBufferFailsWithoutConsuming) {
  const std::vector<std::byte> in = B({5, 0, 0, 0, 'a', 'b'});
  Reader r(in);
  std::string s;
  EXPECT_FALSE(r.Str(&s));
  EXPECT_STREQ(r.error(), "string length runs past the end");
  EXPECT_EQ(r.pos(), 0u);
  EXPECT_TRUE(s.empty());
}

TEST(Coding, AFailedReadConsumesNothingAndTheReaderStaysFailed) {
  const std::vector<std::byte> in = B({1, 2, 3});
  Reader r(in);
  uint32_t v = 7;
  EXPECT_FALSE(r.U32(&v));
  EXPECT_EQ(v, 7u);
  EXPECT_EQ(r.pos(), 0u);
  EXPECT_FALSE(r.ok());
  EXPECT_STREQ(r.error(), "truncated");
  uint8_t b = 0;
  EXPECT_FALSE(r.U8(&b));  // would fit, but the reader has failed
  EXPECT_EQ(r.pos(), 0u);
}

TEST(Coding, BytesArraysSkipAndRest) {
  Writer w;
  const std::array<uint8_t, 3> arr = {9, 8, 7};
  w.Bytes(arr);
  w.Bytes(B({1, 2}));
  w.Bytes(std::string_view("xy"));
  w.U32(0);
  w.PatchU32(w.size() - 4, 0xAABBCCDD);
  EXPECT_EQ(w.bytes(), B({9, 8, 7, 1, 2, 'x', 'y', 0xdd, 0xcc, 0xbb, 0xaa}));

  Reader r(w.bytes());
  std::array<uint8_t, 3> got{};
  ASSERT_TRUE(r.Array(&got));
  EXPECT_EQ(got, arr);
  std::span<const std::byte> two;
  ASSERT_TRUE(r.Bytes(2, &two));
  EXPECT_EQ(std::vector<std::byte>(two.begin(), two.end()), B({1, 2}));
  ASSERT_TRUE(r.Skip(2));
  EXPECT_EQ(r.remaining(), 4u);
  std::span<const std::byte> rest = r.Rest();
  EXPECT_EQ(rest.size(), 4u);
  EXPECT_TRUE(r.done());
  EXPECT_FALSE(r.Skip(1));
}

TEST(Coding, ReadsAStringView) {
  const std::string in("\x2a\0\0\0", 4);
  Reader r{std::string_view(in)};
  uint32_t v = 0;
  ASSERT_TRUE(r.U32(&v));
  EXPECT_EQ(v, 42u);
}

}  // namespace
}  // namespace nopfs::coding
