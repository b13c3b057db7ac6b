#include "spank/options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace nopfs::spank {
namespace {

JobOptions Apply(const std::vector<std::pair<std::string, std::string>>& given) {
  JobOptions o;
  for (const auto& [name, value] : given) {
    Status s = ApplyOption(&o, name, value);
    EXPECT_TRUE(s.ok()) << name << "=" << value << ": " << s.message();
  }
  return o;
}

TEST(OptionsTest, ValidOptionsAreParsed) {
  JobOptions o = Apply({{"nopfs", "/pfs/datasets/imagenet"},
                        {"nopfs-seed", "18446744073709551615"},
                        {"nopfs-epochs", "90"},
                        {"nopfs-batch", "256"},
                        {"nopfs-scheme", "strided"},
                        {"nopfs-drop-last", ""},
                        {"nopfs-ranks-per-node", "4"},
                        {"nopfs-ram", "16G"},
                        {"nopfs-ssd", "1.5TiB"},
                        {"nopfs-keep", "no"}});
  EXPECT_FALSE(o.keep);
  EXPECT_EQ(o.dataset, "/pfs/datasets/imagenet");
  EXPECT_EQ(o.seed, 18446744073709551615ull);
  EXPECT_EQ(o.epochs, 90u);
  EXPECT_EQ(o.batch, 256u);
  EXPECT_EQ(o.scheme, "strided");
  EXPECT_TRUE(o.drop_last);
  EXPECT_EQ(o.ranks_per_node, 4u);
  EXPECT_EQ(o.ram, uint64_t{16} << 30);  // GB as in --mem=16GB: 2^30
  EXPECT_EQ(o.ssd, uint64_t{3} << 39);
  EXPECT_TRUE(ValidateJob(o).ok());
}

TEST(OptionsTest, DefaultsWhenOnlyTheDatasetIsGiven) {
  JobOptions o = Apply({{"nopfs", "/d"}});
  EXPECT_EQ(o.seed, 0u);
  EXPECT_EQ(o.epochs, 1u);
  EXPECT_EQ(o.batch, 1u);
  EXPECT_EQ(o.scheme, "strided");
  EXPECT_FALSE(o.drop_last);
  EXPECT_EQ(o.ranks_per_node, 1u);
  EXPECT_EQ(o.ram, 0u);
  EXPECT_TRUE(o.keep);  // as much as the site's policy lets the user keep
  EXPECT_TRUE(ValidateJob(o).ok());
}

TEST(OptionsTest, SizesFollowSlurmMem) {
  // A bare number is MiB, as --mem=300; K, M, G, T are powers of 1024 (GB too, as Slurm reads it).
  EXPECT_EQ(Apply({{"nopfs", "/d"}, {"nopfs-ram", "300"}}).ram, uint64_t{300} << 20);
  EXPECT_EQ(Apply({{"nopfs", "/d"}, {"nopfs-ram", "1300K"}}).ram, uint64_t{1300} << 10);
  EXPECT_EQ(Apply({{"nopfs", "/d"}, {"nopfs-ssd", "2t"}}).ssd, uint64_t{2} << 40);
  EXPECT_EQ(Apply({{"nopfs", "/d"}, {"nopfs-ram", "1M"}}).ram, uint64_t{1} << 20);  // the floor
  // 0 is no tier of that kind, and is passed on as given (not as "the policy's choice").
  JobOptions none = Apply({{"nopfs", "/d"}, {"nopfs-ram", "0"}});
  EXPECT_EQ(none.ram, 0u);
  EXPECT_TRUE(OptionGiven(none, "nopfs-ram"));
  EXPECT_TRUE(ValidateJob(none).ok());
  const std::vector<std::string> args = ToArgs(none);
  EXPECT_NE(std::find(args.begin(), args.end(), "--nopfs-ram=0"), args.end());
  JobOptions neither = Apply({{"nopfs", "/d"}, {"nopfs-ram", "0"}, {"nopfs-ssd", "0"}});
  Status s = ValidateJob(neither);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("leaves no cache"), std::string::npos) << s.message();
}

TEST(OptionsTest, SameValueTwiceIsAcceptedAConflictingOneIsNot) {
  JobOptions o;
  ASSERT_TRUE(ApplyOption(&o, "nopfs-seed", "7").ok());
  ASSERT_TRUE(ApplyOption(&o, "nopfs-seed", "7").ok());  // Slurm calls back twice
  Status s = ApplyOption(&o, "nopfs-seed", "8");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("already given"), std::string::npos) << s.message();
  EXPECT_EQ(o.seed, 7u);
}

TEST(OptionsTest, ArgsRoundTrip) {
  JobOptions o = Apply({{"nopfs", "/data/x y"},
                        {"nopfs-seed", "3"},
                        {"nopfs-drop-last", ""},
                        {"nopfs-ram", "1300K"}});
  JobOptions back;
  for (const std::string& a : ToArgs(o)) {
    const size_t eq = a.find('=');
    ASSERT_TRUE(ApplyOption(&back,
                            a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2),
                            eq == std::string::npos ? "" : a.substr(eq + 1))
                    .ok())
        << a;
  }
  EXPECT_EQ(back.dataset, o.dataset);
  EXPECT_EQ(back.seed, 3u);
  EXPECT_TRUE(back.drop_last);
  EXPECT_EQ(back.ram, uint64_t{1300} << 10);  // passed on exactly, as 1300K
  EXPECT_TRUE(ToArgs(JobOptions{}).empty());
  // --nopfs-ranks-per-node goes to nopfs-job only when the user gave it (else the job's layout
  // decides), and comes back as given.
  for (const std::string& a : ToArgs(o))
    EXPECT_EQ(a.find("--nopfs-ranks-per-node"), std::string::npos) << a;
  JobOptions with = Apply({{"nopfs", "/d"}, {"nopfs-ranks-per-node", "6"}});
  JobOptions again;
  for (const std::string& a : ToArgs(with)) {
    const size_t eq = a.find('=');
    ASSERT_TRUE(ApplyOption(&again, a.substr(2, eq - 2), a.substr(eq + 1)).ok()) << a;
  }
  EXPECT_TRUE(OptionGiven(again, "nopfs-ranks-per-node"));
  EXPECT_EQ(again.ranks_per_node, 6u);
  // --nopfs-keep likewise: absent stays absent (the default, yes), no comes back as no.
  for (const char* v : {"yes", "no"}) {
    JobOptions k = Apply({{"nopfs", "/d"}, {"nopfs-keep", v}});
    JobOptions kb;
    for (const std::string& a : ToArgs(k)) {
      const size_t eq = a.find('=');
      ASSERT_TRUE(ApplyOption(&kb, a.substr(2, eq - 2), a.substr(eq + 1)).ok()) << a;
    }
    EXPECT_TRUE(OptionGiven(kb, "nopfs-keep"));
    EXPECT_EQ(kb.keep, std::string(v) == "yes");
  }
  for (const std::string& a : ToArgs(o))
    EXPECT_EQ(a.find("--nopfs-keep"), std::string::npos) << a;
  // --nopfs-share-running likewise.
  for (const char* v : {"yes", "no"}) {
    JobOptions k = Apply({{"nopfs", "/d"}, {"nopfs-share-running", v}});
    JobOptions kb;
    for (const std::string& a : ToArgs(k)) {
      const size_t eq = a.find('=');
      ASSERT_TRUE(ApplyOption(&kb, a.substr(2, eq - 2), a.substr(eq + 1)).ok()) << a;
    }
    EXPECT_TRUE(OptionGiven(kb, "nopfs-share-running"));
    EXPECT_EQ(kb.share_running, std::string(v) == "yes");
  }
  EXPECT_TRUE(o.share_running);
  for (const std::string& a : ToArgs(o))
    EXPECT_EQ(a.find("--nopfs-share-running"), std::string::npos) << a;
  // --nopfs-placement: prefer by default, each value comes back as given.
  EXPECT_EQ(o.placement, "prefer");
  for (const char* v : {"prefer", "require", "off"}) {
    JobOptions k = Apply({{"nopfs", "/d"}, {"nopfs-placement", v}});
    JobOptions kb;
    for (const std::string& a : ToArgs(k)) {
      const size_t eq = a.find('=');
      ASSERT_TRUE(ApplyOption(&kb, a.substr(2, eq - 2), a.substr(eq + 1)).ok()) << a;
    }
    EXPECT_EQ(kb.placement, v);
  }
}

TEST(LayoutTest, RanksPerNodeComeFromTheJobsTasks) {
  const JobOptions o = Apply({{"nopfs", "/d"}});
  struct Case {
    TaskLayout layout;
    uint32_t want;
  };
  const Case cases[] = {
      {{1, 0, 0}, 1},  // sbatch -N1: srun starts one task
      {{3, 0, 0}, 1},  // sbatch -N3
      {{2, 2, 1}, 1},  // -N2 --ntasks-per-node=1
      {{2, 4, 2}, 2},  // -N2 --ntasks-per-node=2
      {{3, 6, 2}, 2},  // -N3 --ntasks-per-node=2
      {{2, 0, 2}, 2},  // --ntasks-per-node without a task count
      {{2, 4, 0}, 2},  // -n4 -N2
      {{1, 2, 0}, 2},  // -n2 on one node
  };
  for (const Case& c : cases) {
    Result<uint32_t> r = RanksPerNode(c.layout, o);
    ASSERT_TRUE(r.ok()) << c.layout.nodes << "x" << c.layout.tasks << ": " << r.status().message();
    EXPECT_EQ(*r, c.want) << c.layout.nodes << " nodes, " << c.layout.tasks << " tasks";
  }
}

TEST(LayoutTest, AGivenRanksPerNodeMustBeTheTasksPerNodeOrAMultiple) {
  const TaskLayout two_a_node{2, 4, 2};
  Result<uint32_t> same =
      RanksPerNode(two_a_node, Apply({{"nopfs", "/d"}, {"nopfs-ranks-per-node", "2"}}));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, 2u);
  // torchrun with 4 processes in each task: 8 ranks a node.
  Result<uint32_t> multiple =
      RanksPerNode(two_a_node, Apply({{"nopfs", "/d"}, {"nopfs-ranks-per-node", "8"}}));
  ASSERT_TRUE(multiple.ok());
  EXPECT_EQ(*multiple, 8u);
  for (const char* bad : {"1", "3", "5"}) {
    Result<uint32_t> r =
        RanksPerNode(two_a_node, Apply({{"nopfs", "/d"}, {"nopfs-ranks-per-node", bad}}));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string("--nopfs-ranks-per-node=") + bad +
                                        ": the job runs 2 tasks per node"),
              std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("a multiple of 2"), std::string::npos);
  }
}

TEST(LayoutTest, ANonUniformLayoutIsRefusedWithWhatToWrite) {
  const JobOptions o = Apply({{"nopfs", "/d"}});
  Result<uint32_t> r = RanksPerNode({2, 3, 0}, o);  // -n3 -N2
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the job's 3 tasks do not spread evenly over its 2 nodes"),
            std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("-N2 --ntasks-per-node=2"), std::string::npos);
  // -n3 -N2 --ntasks-per-node=2
  Result<uint32_t> r2 = RanksPerNode({2, 3, 2}, o);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("the job's 3 tasks are not 2 on each of its 2 nodes"),
            std::string::npos)
      << r2.status().message();
  EXPECT_FALSE(RanksPerNode({0, 0, 0}, o).ok());
}

struct Invalid {
  std::string name;
  std::string value;
  std::string says;  // a piece of the message that tells the user what to write
};

TEST(OptionsTest, InvalidValuesAreRefusedWithAHint) {
  const std::string long_path = "/" + std::string(5000, 'a');
  const std::vector<Invalid> table = {
      {"nopfs", "", "absolute path"},
      {"nopfs", "relative/dir", "absolute path"},
      {"nopfs", "~/data", "absolute path"},
      {"nopfs", "/pfs/../etc", "'..'"},
      {"nopfs", "/pfs/..", "'..'"},
      {"nopfs", long_path, "at most"},
      {"nopfs", std::string("/pfs/a\nb"), "control"},
      {"nopfs", std::string("/pfs/a\tb"), "control"},
      {"nopfs", std::string("/pfs/a\x1b[31m"), "control"},
      {"nopfs", std::string("/pfs/\xc3\xa9"), "ASCII"},
      {"nopfs", std::string("/pfs/a\0b", 8), "control"},
      {"nopfs-seed", "", "whole number"},
      {"nopfs-seed", "abc", "whole number"},
      {"nopfs-seed", "-1", "whole number"},
      {"nopfs-seed", "1.5", "whole number"},
      {"nopfs-seed", "0x10", "whole number"},
      {"nopfs-seed", " 1", "whole number"},
      {"nopfs-seed", "18446744073709551616", "out of range"},
      {"nopfs-epochs", "0", "from 1 to 1000000"},
      {"nopfs-epochs", "1000001", "out of range"},
      {"nopfs-epochs", "ten", "--nopfs-epochs=90"},
      {"nopfs-batch", "0", "out of range"},
      {"nopfs-batch", "1099511627777", "out of range"},
      {"nopfs-scheme", "random", "uniform"},
      {"nopfs-scheme", "UNIFORM", "strided"},
      {"nopfs-scheme", "", "uniform"},
      {"nopfs-ranks-per-node", "0", "out of range"},
      {"nopfs-ranks-per-node", "4097", "out of range"},
      {"nopfs-ranks-per-node", "4,", "whole number"},
      {"nopfs-ram", "lots", "size"},
      {"nopfs-ram", "16K", "--nopfs-ram=16K: is 16.0 KiB, too small for a cache"},
      {"nopfs-ram", "16K", "write --nopfs-ram=16G for 16 GiB, or --nopfs-ram=0 for no RAM"},
      {"nopfs-ssd", "400B", "is 400 B, too small for a cache"},
      {"nopfs-ram", "0.5", "is 512 KiB"},
      {"nopfs-ram", "-5GB", "size"},
      {"nopfs-ram", "1e400", "range"},
      {"nopfs-ram", std::string(100, '9'), "at most"},
      {"nopfs-ssd", "12 parsecs", "size"},
      {"nopfs-drop-last", "no", "takes no value"},
      {"nopfs-keep", "", "--nopfs-keep=no"},
      {"nopfs-keep", "NO", "--nopfs-keep=yes"},
      {"nopfs-keep", "0", "--nopfs-keep=no"},
      {"nopfs-keep", "yes\n", "control"},
      {"nopfs-keep", std::string(100, 'y'), "at most"},
      {"nopfs-share-running", "off", "--nopfs-share-running=no"},
      {"nopfs-placement", "soft", "--nopfs-placement=prefer"},
      {"nopfs-placement", "", "--nopfs-placement=require"},
      {"nopfs-cache", "1", "not a nopfs option"},
      {"", "x", "not a nopfs option"},
  };
  for (const Invalid& t : table) {
    JobOptions o;
    Status s = ApplyOption(&o, t.name, t.value);
    ASSERT_FALSE(s.ok()) << t.name << "=" << t.value;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(t.says), std::string::npos)
        << t.name << ": " << s.message() << " (expected '" << t.says << "')";
    for (char c : s.message()) {
      EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20) << "the message echoes a control char";
    }
    EXPECT_LT(s.message().size(), 600u) << "the message echoes a huge value";
    EXPECT_EQ(o.given, 0u) << "a refused value must not count as given";
  }
}

TEST(OptionsTest, SamplingOptionsNeedADataset) {
  JobOptions o = Apply({{"nopfs-seed", "1"}});
  Status s = ValidateJob(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--nopfs-seed: needs --nopfs=DATASET"), std::string::npos)
      << s.message();
  EXPECT_TRUE(ValidateJob(JobOptions{}).ok());
}

TEST(OptionsTest, UniformBatchesSmallerThanTheRanksOfANodeAreRefused) {
  JobOptions o = Apply({{"nopfs", "/data/ds"},
                        {"nopfs-scheme", "uniform"},
                        {"nopfs-batch", "2"},
                        {"nopfs-ranks-per-node", "4"}});
  Status s = ValidateJob(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("write --nopfs-scheme=strided"), std::string::npos) << s.message();
  // A batch that every rank of a node can share, the strided default, or ranks per node left to
  // the job's layout (checked at job start) pass here.
  EXPECT_TRUE(ValidateJob(Apply({{"nopfs", "/data/ds"},
                                 {"nopfs-scheme", "uniform"},
                                 {"nopfs-batch", "8"},
                                 {"nopfs-ranks-per-node", "4"}}))
                  .ok());
  EXPECT_TRUE(
      ValidateJob(
          Apply({{"nopfs", "/data/ds"}, {"nopfs-batch", "2"}, {"nopfs-ranks-per-node", "4"}}))
          .ok());
  EXPECT_TRUE(
      ValidateJob(Apply({{"nopfs", "/data/ds"}, {"nopfs-scheme", "uniform"}, {"nopfs-batch", "2"}}))
          .ok());
}

TEST(PluginArgsTest, ParsesEveryKey) {
  Result<PluginArgs> a = ParsePluginArgs(
      {"config=/etc/nopfs/nopfs.conf.lua", "policy=/etc/nopfs/policy.lua", "rundir=/run/nopfs/",
       "on_refusal=run", "launcher=/usr/libexec/nopfs-job", "nopfsd=/usr/sbin/nopfsd",
       "timeout=120", "grace=5", "peer_key=/etc/nopfs/peer.key", "peer_ports=700-799,900-949",
       "peer_host=127.0.0.1"});
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->config, "/etc/nopfs/nopfs.conf.lua");
  EXPECT_EQ(a->rundir, "/run/nopfs");
  EXPECT_EQ(a->on_refusal, OnRefusal::kRun);
  EXPECT_EQ(a->timeout, 120u);
  EXPECT_EQ(a->grace, 5u);
  Result<PluginArgs> back = ParsePluginArgs(ToArgs(*a));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->nopfsd, "/usr/sbin/nopfsd");
  EXPECT_EQ(back->launcher, a->launcher);
  EXPECT_EQ(back->peer_key, "/etc/nopfs/peer.key");
  EXPECT_EQ(back->peer_ports, (std::vector<PortRange>{{700, 799}, {900, 949}}));
  EXPECT_EQ(back->peer_host, "127.0.0.1");
  Result<PluginArgs> d = ParsePluginArgs({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->on_refusal, OnRefusal::kFail);
  EXPECT_TRUE(d->peer_key.empty());
  EXPECT_TRUE(d->peer_host.empty());
}

TEST(PluginArgsTest, PeerEndpointsAreDistinctPerNodeOfAJob) {
  PluginArgs a;
  EXPECT_EQ(a.peer_ports, (std::vector<PortRange>{{600, 987}}));
  const std::vector<std::string> nodes = {"n1", "n2", "n3"};
  EXPECT_EQ(PeerEndpoints(a, nodes, 48 + 388),
            (std::vector<std::string>{"n1:648", "n2:649", "n3:650"}));
  a.peer_host = "127.0.0.1";
  const std::vector<std::string> one = PeerEndpoints(a, nodes, 48);
  EXPECT_EQ(one[0], "127.0.0.1:648");
  EXPECT_EQ(one[2], "127.0.0.1:650");
  // The offset is taken modulo the number of ports, and the ports wrap around the ranges: the
  // nodes of a job never share a port on one host, up to the number of ports.
  const std::vector<PortRange> two = {{700, 709}, {900, 904}};
  EXPECT_EQ(PortCount(two), 15u);
  EXPECT_EQ(PeerPort(two, 9, 0), 709);
  EXPECT_EQ(PeerPort(two, 9, 1), 900);
  EXPECT_EQ(PeerPort(two, 9, 5), 904);
  EXPECT_EQ(PeerPort(two, 9, 6), 700);
  EXPECT_EQ(PeerPort(two, 15 * 1000 + 9, 0), 709);
  for (const std::vector<PortRange>& ranges :
       {std::vector<PortRange>{kDefaultPeerPorts}, two,
        std::vector<PortRange>{{1, 1}, {80, 80}, {65535, 65535}}}) {
    const uint32_t n = PortCount(ranges);
    for (uint32_t offset : {0u, 1u, 4000u, (1u << 24) - 1}) {
      std::vector<bool> used(65536);
      for (uint32_t i = 0; i < n; ++i) {
        const uint16_t p = PeerPort(ranges, offset, i);
        EXPECT_FALSE(used[p]) << offset << " " << i;
        used[p] = true;
        bool inside = false;
        for (const PortRange& r : ranges)
          inside |= p >= r.low && p <= r.high;
        EXPECT_TRUE(inside) << p;
      }
    }
  }
  // Every default port is privileged at Linux's default threshold (1024).
  EXPECT_LT(kDefaultPeerPorts.high, 1024);
}

TEST(PluginArgsTest, ParsesPeerPortRanges) {
  struct Case {
    const char* arg;
    std::vector<PortRange> want;
  };
  for (const Case& c :
       {Case{"peer_ports=600-987", {{600, 987}}}, Case{"peer_ports=700", {{700, 700}}},
        Case{"peer_ports=600-630,632-987", {{600, 630}, {632, 987}}},
        Case{"peer_ports=1-1,65535", {{1, 1}, {65535, 65535}}}}) {
    Result<PluginArgs> a = ParsePluginArgs({c.arg});
    ASSERT_TRUE(a.ok()) << c.arg << ": " << a.status().message();
    EXPECT_EQ(a->peer_ports, c.want) << c.arg;
    Result<PluginArgs> back = ParsePluginArgs(ToArgs(*a));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->peer_ports, c.want) << c.arg;
  }
  for (const char* bad :
       {"peer_ports=", "peer_ports=0-10", "peer_ports=900-800", "peer_ports=600-70000",
        "peer_ports=600-700,650-800", "peer_ports=800-900,600-700", "peer_ports=600-700,",
        "peer_ports=a-b", "peer_ports=600 - 700", "peer_ports=+600-700",
        "peer_ports=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"}) {
    Result<PluginArgs> a = ParsePluginArgs({bad});
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_NE(a.status().message().find("peer_ports=600-987"), std::string::npos)
        << a.status().message();
  }
  // The unprivileged base of earlier versions is refused with what to write instead.
  Result<PluginArgs> old = ParsePluginArgs({"peer_port=41000"});
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.status().message().find("write peer_ports=600-987"), std::string::npos)
      << old.status().message();
}

TEST(PluginArgsTest, RefusesBadArguments) {
  for (const char* bad :
       {"config", "=x", "colour=blue", "rundir=relative", "rundir=/", "rundir=", "on_refusal=maybe",
        "timeout=0", "timeout=-1", "timeout=1d", "grace=86401", "launcher=nopfs-job",
        "peer_key=relative.key", "peer_ports=80-", "peer_ports=70000",
        "peer_host=", "peer_host=a b", "peer_host=-x", "peer_host=host;rm"}) {
    Result<PluginArgs> a = ParsePluginArgs({bad});
    EXPECT_FALSE(a.ok()) << bad;
  }
}

TEST(PathsTest, RunDirAndComponents) {
  EXPECT_EQ(RunDir("/run/nopfs", "n2", 42), "/run/nopfs/n2/42");
  EXPECT_TRUE(CheckComponent("node", "n-1.b_c").ok());
  for (const char* bad : {"", ".", "..", ".hidden", "a/b", "a b", "a\nb"}) {
    EXPECT_FALSE(CheckComponent("node", bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace nopfs::spank
