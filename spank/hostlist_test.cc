#include "spank/hostlist.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace nopfs::spank {
namespace {

using Names = std::vector<std::string>;

TEST(HostlistTest, ExpandsAsSlurmNumbersTheNodes) {
  Result<Names> h = ExpandHostlist("n[1-3,7],gpu[08-10],login");
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(*h, (Names{"n1", "n2", "n3", "n7", "gpu08", "gpu09", "gpu10", "login"}));
  h = ExpandHostlist("node[001-003],rack1-n[9-10]");
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(*h, (Names{"node001", "node002", "node003", "rack1-n9", "rack1-n10"}));
  h = ExpandHostlist("n[1-3,5],m07,x[01-02]");
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(*h, (Names{"n1", "n2", "n3", "n5", "m07", "x01", "x02"}));
  // A suffix after the brackets: libslurm 22.05 cannot parse it (and never writes one), so nopfs
  // refuses it too rather than numbering the nodes its own way.
  h = ExpandHostlist("n[1-3,5],m07,x[01-02]-ib");
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("Slurm cannot parse it"), std::string::npos)
      << h.status().message();
  h = ExpandHostlist("n1");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, Names{"n1"});
}

TEST(HostlistTest, NodeIndexIsThePositionInTheList) {
  Result<uint32_t> i = NodeIndex("n[1-3],m7", "n3");
  ASSERT_TRUE(i.ok()) << i.status().message();
  EXPECT_EQ(*i, 2u);
  i = NodeIndex("n[1-3],m7", "m7");
  ASSERT_TRUE(i.ok());
  EXPECT_EQ(*i, 3u);
  EXPECT_EQ(NodeIndex("n[1-3]", "n4").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(NodeIndex("n[3-1]", "n1").status().code(), StatusCode::kInvalidArgument);
}

TEST(HostlistTest, WhatSlurmCannotParseIsRefusedNamingTheList) {
  for (const char* bad : {"", "n[3-1]", "n[]", "n[a-b]", "n[1-99999999]", "n[[1]]"}) {
    Result<Names> h = ExpandHostlist(bad);
    ASSERT_FALSE(h.ok()) << bad;
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(h.status().message().find(std::string("host list '") + bad + "'"), std::string::npos)
        << h.status().message();
  }
}

TEST(HostlistTest, NamesThatAreNotHostNamesAreRefused) {
  // libslurm takes "n]1" as a name; nopfs puts names into paths and peer addresses.
  for (const char* bad : {"n]1", "n[1-2],x/y", "a,.hidden"}) {
    Result<Names> h = ExpandHostlist(bad);
    EXPECT_FALSE(h.ok()) << bad;
  }
}

TEST(HostlistTest, AtMost65536Names) {
  Result<Names> h = ExpandHostlist("n[0-65535]");
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->size(), kMaxHostlistNames);
  EXPECT_EQ(h->back(), "n65535");
  // Each range within Slurm's limit, the list over nopfs's.
  h = ExpandHostlist("n[0-65535],m1");
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("65537 names, more than 65536"), std::string::npos)
      << h.status().message();
}

}  // namespace
}  // namespace nopfs::spank
