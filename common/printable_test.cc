#include "common/printable.h"

#include <gtest/gtest.h>

#include <string>

namespace nopfs {
namespace {

TEST(PrintableTest, PrintableAsciiStandsAsItIs) {
  EXPECT_EQ(Printable("/pfs/datasets/imagenet train-1.0_x"), "/pfs/datasets/imagenet train-1.0_x");
  EXPECT_EQ(Printable(""), "");
}

TEST(PrintableTest, EveryOtherByteIsEscapedAndNoLineIsAdded) {
  // What a user put into a kept MANIFEST to forge a line of root's log.
  const std::string forged =
      "/x\n[2026-11-28T22:00:00.000] nopfs: epilog: n1: INJECTED-BY-BOB\r\x1b[2K\x7f";
  const std::string shown = Printable(forged);
  EXPECT_EQ(shown,
            "/x\\x0a[2026-11-28T22:00:00.000] nopfs: epilog: n1: INJECTED-BY-BOB\\x0d\\x1b[2K"
            "\\x7f");
  EXPECT_EQ(shown.find('\n'), std::string::npos);
  EXPECT_EQ(Printable("caf\xc3\xa9 \xff"), "caf\\xc3\\xa9 \\xff");
  EXPECT_EQ(Printable(std::string("a\0b", 3)), "a\\x00b");
}

TEST(PrintableTest, ALongInputIsCutAndSaysSo) {
  EXPECT_EQ(Printable(std::string(500, 'x'), 10), std::string(10, 'x') + "...");
  EXPECT_EQ(Printable(std::string(10, 'x'), 10), std::string(10, 'x'));
  EXPECT_EQ(Printable("\n\n\n", 2), "\\x0a\\x0a...");
}

TEST(PrintableTest, ABackslashIsDoubledSoThatTheEscapesAreUnambiguous) {
  EXPECT_EQ(Printable("a\\x0ab"), "a\\\\x0ab");  // a name that spells an escape
  EXPECT_NE(Printable("a\\x0ab"), Printable("a\nb"));
}

}  // namespace
}  // namespace nopfs
