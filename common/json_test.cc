#include "common/json.h"

#include <gtest/gtest.h>

#include <string>

namespace nopfs {
namespace {

// The text of one string value, without its quotes.
std::string Body(std::string_view bytes) {
  const std::string text = DumpJson(JsonBytes(bytes));
  EXPECT_GE(text.size(), 2u);
  EXPECT_EQ(text.front(), '"');
  EXPECT_EQ(text.back(), '"');
  return text.substr(1, text.size() - 2);
}

TEST(JsonTest, WellFormedUtf8IsWrittenAsItIs) {
  EXPECT_EQ(Body("plain/path"), "plain/path");
  EXPECT_EQ(Body("caf\xc3\xa9"), "caf\xc3\xa9");            // 2 bytes
  EXPECT_EQ(Body("\xe2\x82\xac"), "\xe2\x82\xac");          // 3 bytes: the euro sign
  EXPECT_EQ(Body("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");  // 4 bytes: U+1F600
  EXPECT_EQ(Body("\xf4\x8f\xbf\xbf"), "\xf4\x8f\xbf\xbf");  // U+10FFFF, the last
  EXPECT_EQ(Body("\xed\x9f\xbf"), "\xed\x9f\xbf");          // U+D7FF, before surrogates
  EXPECT_TRUE(IsUtf8("\xf0\x9f\x98\x80 and \xc3\xa9"));
}

TEST(JsonTest, QuotesBackslashesAndControlCharactersAreEscaped) {
  EXPECT_EQ(Body("a\"b\\c"), "a\\\"b\\\\c");
  EXPECT_EQ(Body("tab\tnl\ncr\r\x01\x1f\x7f"), "tab\\tnl\\ncr\\r\\u0001\\u001f\x7f");
  // The same escapes whether the string goes through the library or through the byte rule.
  EXPECT_EQ(Body("\xff\"\\\t\x01"), "\\udcff\\\"\\\\\\t\\u0001");
}

TEST(JsonTest, EveryByteThatIsNotUtf8IsEscapedAsASurrogate) {
  EXPECT_EQ(Body("bad\xffname"), "bad\\udcffname");
  EXPECT_EQ(Body("\x80"), "\\udc80");                        // a lone continuation byte
  EXPECT_EQ(Body("\xc3"), "\\udcc3");                        // a sequence cut short at the end
  EXPECT_EQ(Body("\xc3x"), "\\udcc3x");                      // ... or by another byte
  EXPECT_EQ(Body("\xc0\xaf"), "\\udcc0\\udcaf");             // an overlong '/'
  EXPECT_EQ(Body("\xe0\x80\xaf"), "\\udce0\\udc80\\udcaf");  // overlong, 3 bytes
  EXPECT_EQ(Body("\xed\xa0\x80"), "\\udced\\udca0\\udc80");  // a surrogate, U+D800
  EXPECT_EQ(Body("\xf4\x90\x80\x80"), "\\udcf4\\udc90\\udc80\\udc80");  // above U+10FFFF
  EXPECT_EQ(Body("\xf8"), "\\udcf8");
  // Well-formed sequences around stray bytes stay as they are.
  EXPECT_EQ(Body("\xc3\xa9\xff\xc3\xa9"), "\xc3\xa9\\udcff\xc3\xa9");
  EXPECT_FALSE(IsUtf8("bad\xffname"));
}

TEST(JsonTest, ANulByteIsWrittenNotDropped) {
  EXPECT_EQ(Body(std::string_view("a\0b", 3)), "a\\u0000b");
}

TEST(JsonTest, AStringThatLooksLikeTheInternalMarkerIsWrittenAsItIs) {
  // The marker's text, written by a user into a well-formed name: never mistaken for one.
  const std::string fake = std::string("\\u0000\x01nopfs-bytes\x01") + "ff\\u0000";
  const std::string text = DumpJson(JsonBytes(fake));
  EXPECT_EQ(Json::parse(text).get<std::string>(), fake);
}

TEST(JsonTest, ADocumentMixingBothKindsParsesBack) {
  Json doc;
  doc["ok"] = JsonBytes("caf\xc3\xa9");
  doc["bad"] = JsonBytes("bad\xffname");
  doc["list"] = Json::array({JsonBytes("\xfe"), 1, nullptr, true});
  doc["n"] = uint64_t{18446744073709551615u};
  const std::string compact = DumpJson(doc);
  EXPECT_EQ(compact,
            "{\"ok\":\"caf\xc3\xa9\",\"bad\":\"bad\\udcffname\",\"list\":[\"\\udcfe\",1,null,true],"
            "\"n\":18446744073709551615}");
  // Python's json reads the \udcXX escapes (tests/cli/cli_test.py and cache_test.py check the
  // round trip through os.fsencode); nlohmann/json refuses an unpaired surrogate, so it reads back
  // only the rest.
  doc.erase("bad");
  doc["list"].erase(0);
  const Json back = Json::parse(DumpJson(doc));
  EXPECT_EQ(back["ok"], "caf\xc3\xa9");
  EXPECT_EQ(back["n"].get<uint64_t>(), 18446744073709551615u);
  EXPECT_EQ(DumpJson(doc, 2).find("\n  \"ok\": \"caf"), 1u);  // indented
}

}  // namespace
}  // namespace nopfs
