// nopfs_directory_bench: the peer directory's cost per node at 1024 nodes x 14.2 M samples
// (ImageNet-22k), simulated on one machine, against the seeds' allgather of every cache list.
//
//   nopfs_directory_bench [--nodes 1024] [--samples 14197103] [--epochs 90] [--measure 4]
//                         [--seed 42] [--verify 1]
//
// The job: F samples, N nodes, E epochs. Epoch e reads pi_e, the policy's own shuffle
// (policy/sampler.h, EpochPermutation); node k reads positions [k*S, (k+1)*S) of it, S = floor(F/N)
// (drop_last; any fixed set of S positions of a uniformly random permutation is distributed
// alike, so the exact rank-to-position map of policy/partition.h does not change the figures).
// What a node holds (a model of its plan, stated, not the plan itself): the samples of its first
// two epochs' slices, in that order -- about 2 S = 27.7 k samples, which is what a RAM+SSD tier of
// ~2/N of the dataset holds, so that all caches together hold the dataset ~2x (each sample held
// by about two nodes, some by none). The first quarter of that fill order is class 1 (RAM), the
// rest class 2 (SSD); position = index within the class's fill order (a sample seen again in
// epoch 1 keeps its epoch-0 position). A node needs the distinct samples of its E-epoch stream
// that it does not hold (the real plan holds its most frequently read samples instead; at N=1024
// almost every sample is read once per node, so what is needed has the same size either way).
//
// What is measured: for `--measure` nodes m = 0, 1, ..., the real BuildDirectory runs for node m.
// The exchange it calls hands it, in each round, exactly what the other N-1 nodes would send
// node m -- their holdings owned by m, their queries owned by m, and the owners' answers to m's
// queries -- each produced on demand with the wire encoding of service/peers/directory_wire.h from
// one pass over the E permutations (two inverse permutations and the readers of m's shard are kept,
// never the other nodes' directories). Node time = BuildDirectory's wall time minus the time the
// exchange spends producing those buffers. Bytes sent/received and peak heap (an estimate) come
// from DirectoryStats; the directory's own size from PeerDirectory::memory_bytes. Every needed
// sample is checked to be found at a real holder. The baseline, the seeds' allgather: its bytes
// are derived (every node receives every other node's cache list as 4-byte sample ids, position
// implicit); its local work is measured in the same run (indexing all N cache lists, delivered
// grouped by node, by sample: a stable sort of every holding), the network time of neither is.
// --verify 1 (at most 64 nodes) also runs every node's BuildDirectory for real, in threads over an
// in-process all-to-all, and checks each simulated node saw the same bytes and built the same
// directory.
#include <sys/resource.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "policy/sampler.h"
#include "service/peers/directory.h"
#include "service/peers/directory_wire.h"

namespace {

using nopfs::Result;
using nopfs::Status;
using nopfs::service::dir::BuildDirectory;
using nopfs::service::dir::DirectoryStats;
using nopfs::service::dir::Holding;
using nopfs::service::dir::Location;
namespace wire = nopfs::service::dir::wire;
using Buffers = std::vector<std::vector<std::byte>>;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kNone = 0xFFFFFFFFu;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

struct Options {
  uint32_t nodes = 1024;
  uint32_t samples = 14197103;
  uint32_t epochs = 90;
  uint32_t measure = 4;
  uint64_t seed = 42;
  bool verify = false;
};

// The job's shape and the two inverse permutations that define who holds what.
class Job {
 public:
  explicit Job(const Options& o)
      : o_(o), slice_(o.samples / o.nodes), inv0_(o.samples), inv1_(o.samples) {}

  uint32_t slice() const { return slice_; }
  const Options& opt() const { return o_; }

  // The node that reads position p of an epoch, or kNone (dropped remainder).
  uint32_t ReaderAt(uint32_t p) const { return p < slice_ * o_.nodes ? p / slice_ : kNone; }

  void SetInverse(int which, const std::vector<uint32_t>& perm) {
    auto& inv = which == 0 ? inv0_ : inv1_;
    for (uint32_t p = 0; p < perm.size(); ++p)
      inv[perm[p]] = p;
  }

  // The holdings of sample s: at most two (node, class, position).
  int Holders(uint32_t s, Holding out[2], uint32_t nodes_out[2]) const {
    int n = 0;
    const uint32_t r0 = ReaderAt(inv0_[s]);
    const uint32_t r1 = ReaderAt(inv1_[s]);
    if (r0 != kNone) {
      nodes_out[n] = r0;
      out[n++] = Fill(s, inv0_[s] - r0 * slice_);
    }
    if (r1 != kNone && r1 != r0) {
      nodes_out[n] = r1;
      out[n++] = Fill(s, slice_ + inv1_[s] - r1 * slice_);
    }
    return n;
  }

  bool Holds(uint32_t node, uint32_t s) const {
    return ReaderAt(inv0_[s]) == node || ReaderAt(inv1_[s]) == node;
  }

 private:
  Holding Fill(uint32_t s, uint32_t index) const {
    const uint32_t ram = (2 * slice_) / 4;
    if (index < ram) return {s, 1, index};
    return {s, 2, index - ram};
  }

  Options o_;
  uint32_t slice_;
  std::vector<uint32_t> inv0_;
  std::vector<uint32_t> inv1_;
};

// Everything one pass over the epochs collects for the measured nodes.
struct Collected {
  std::vector<std::vector<uint32_t>> stream;  // per measured node: its samples, all epochs
  // per measured owner m: (sample, reader) for every read of a sample of m's shard
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> shard_reads;
  // (sample, reader) for every read by nodes 0 .. measure-2 (for the answers' ranks)
  std::vector<std::pair<uint32_t, uint32_t>> low_reads;
};

Collected Pass(Job& job) {
  const Options& o = job.opt();
  Collected c;
  c.stream.resize(o.measure);
  c.shard_reads.resize(o.measure);
  std::vector<uint32_t> inv(o.samples);
  for (uint32_t e = 0; e < o.epochs; ++e) {
    auto perm = nopfs::policy::EpochPermutation(o.seed, e, o.samples);
    if (e < 2) job.SetInverse(static_cast<int>(e), perm);
    for (uint32_t m = 0; m < o.measure; ++m) {
      const uint32_t* first = perm.data() + static_cast<size_t>(m) * job.slice();
      c.stream[m].insert(c.stream[m].end(), first, first + job.slice());
      if (m + 1 < o.measure) {
        for (uint32_t i = 0; i < job.slice(); ++i)
          c.low_reads.push_back({first[i], m});
      }
    }
    for (uint32_t p = 0; p < perm.size(); ++p)
      inv[perm[p]] = p;
    for (uint32_t m = 0; m < o.measure; ++m) {
      for (uint64_t s = m; s < o.samples; s += o.nodes) {
        const uint32_t r = job.ReaderAt(inv[s]);
        if (r != kNone) c.shard_reads[m].push_back({static_cast<uint32_t>(s), r});
      }
    }
  }
  std::sort(c.low_reads.begin(), c.low_reads.end());
  c.low_reads.erase(std::unique(c.low_reads.begin(), c.low_reads.end()), c.low_reads.end());
  return c;
}

// Of a sample's holders, the one that fills it from the PFS (OwnerTable's rule), if it has two.
std::optional<Location> Filler(const Job& job, uint32_t s) {
  Holding h[2];
  uint32_t hn[2];
  if (job.Holders(s, h, hn) != 2) return std::nullopt;
  const bool second =
      h[1].position < h[0].position || (h[1].position == h[0].position && hn[1] < hn[0]);
  const int f = second ? 1 : 0;
  return Location{s, hn[f], h[f].cls, h[f].position};
}

struct NodeResult {
  nopfs::service::dir::PeerDirectory dir;
  double node_s = 0;
  double simulate_s = 0;
  DirectoryStats stats;
  uint64_t held = 0;
  uint64_t needs = 0;
  uint64_t found = 0;
  uint64_t copies = 0;
  uint64_t dir_bytes = 0;
  uint64_t wrong = 0;
  uint64_t round_received[3] = {0, 0, 0};  // publish, query, answer
};

// Node m's holdings (by sample) and needs (ascending, distinct).
void Inputs(const Job& job, const Collected& c, uint32_t m, std::vector<Holding>* held,
            std::vector<uint32_t>* needs) {
  for (uint32_t s : c.stream[m]) {
    if (!job.Holds(m, s)) needs->push_back(s);
  }
  std::sort(needs->begin(), needs->end());
  needs->erase(std::unique(needs->begin(), needs->end()), needs->end());
  for (size_t i = 0; i < 2 * static_cast<size_t>(job.slice()); ++i) {
    const uint32_t s = c.stream[m][i];
    Holding h[2];
    uint32_t hn[2];
    const int k = job.Holders(s, h, hn);
    for (int j = 0; j < k; ++j) {
      if (hn[j] == m) held->push_back(h[j]);
    }
  }
  std::sort(held->begin(), held->end(),
            [](const Holding& a, const Holding& b) { return a.sample < b.sample; });
  held->erase(std::unique(held->begin(), held->end(),
                          [](const Holding& a, const Holding& b) { return a.sample == b.sample; }),
              held->end());
}

Result<NodeResult> MeasureNode(const Job& job, const Collected& c, uint32_t m) {
  const Options& o = job.opt();
  const uint32_t n = o.nodes;
  NodeResult res;
  std::vector<Holding> held;
  std::vector<uint32_t> needs;
  Inputs(job, c, m, &held, &needs);
  res.held = held.size();
  res.needs = needs.size();

  Clock::duration simulate{};
  int round = 0;
  Buffers my_queries;
  auto exchange = [&](Buffers out) -> Result<Buffers> {
    const auto t0 = Clock::now();
    ++round;
    Buffers in(n);
    if (round == 1) {
      // What every node k publishes to owner m.
      std::vector<std::vector<Holding>> per(n);
      for (uint64_t s = m; s < o.samples; s += n) {
        Holding h[2];
        uint32_t hn[2];
        const int k = job.Holders(static_cast<uint32_t>(s), h, hn);
        for (int j = 0; j < k; ++j)
          per[hn[j]].push_back(h[j]);
      }
      for (uint32_t k = 0; k < n; ++k) {
        if (k != m) in[k] = wire::EncodePublish(per[k], m, n);
      }
    } else if (round == 2) {
      // What every node k asks owner m: the samples of m's shard it reads and does not hold.
      std::vector<std::vector<uint32_t>> per(n);
      auto reads = c.shard_reads[m];
      std::sort(reads.begin(), reads.end());
      for (const auto& [s, r] : reads) {
        if (job.Holds(r, s)) continue;
        if (per[r].empty() || per[r].back() != s) per[r].push_back(s);
      }
      for (uint32_t k = 0; k < n; ++k) {
        if (k != m) in[k] = wire::EncodeQuery(per[k], m, n);
      }
      my_queries = out;
    } else {
      // Owner k's answer to m: for each queried sample, the holder for m's rank among the
      // sample's requesters (those of nodes 0 .. m-1 that read it and do not hold it).
      for (uint32_t k = 0; k < n; ++k) {
        if (k == m) continue;
        std::vector<uint32_t> ids;
        auto st = wire::DecodeQuery(my_queries[k], k, n, &ids);
        if (!st.ok()) return st;
        std::vector<Location> answers(ids.size());
        for (size_t i = 0; i < ids.size(); ++i) {
          const uint32_t s = ids[i];
          Holding h[2];
          uint32_t hn[2];
          const int c_holders = job.Holders(s, h, hn);
          answers[i].sample = s;
          if (c_holders == 0) {
            answers[i].node = wire::kNoHolder;
            continue;
          }
          int order[2] = {0, 1};
          if (c_holders == 2 && hn[1] < hn[0]) std::swap(order[0], order[1]);
          uint64_t rank = 0;
          auto it = std::lower_bound(c.low_reads.begin(), c.low_reads.end(),
                                     std::pair<uint32_t, uint32_t>{s, 0});
          for (; it != c.low_reads.end() && it->first == s && it->second < m; ++it) {
            if (!job.Holds(it->second, s)) ++rank;
          }
          const int pick = order[wire::ChooseHolder(rank, s, n, static_cast<size_t>(c_holders))];
          answers[i].node = hn[pick];
          answers[i].cls = h[pick].cls;
          answers[i].position = h[pick].position;
        }
        // And the samples m holds that owner k names a filler for (another node reaches them
        // first in its fill order: smaller position, then smaller node).
        std::vector<Location> copies;
        for (const Holding& mine : held) {
          if (mine.sample % n != k) continue;
          const auto f = Filler(job, mine.sample);
          if (f && f->node != m) copies.push_back(*f);
        }
        in[k] = wire::EncodeAnswer(answers, copies, k, n);
      }
    }
    for (uint32_t k = 0; k < n; ++k) {
      if (k != m) res.round_received[round - 1] += in[k].size();
    }
    in[m] = std::move(out[m]);
    simulate += Clock::now() - t0;
    return in;
  };
  const auto t0 = Clock::now();
  auto dir = BuildDirectory(m, n, held, needs, exchange, &res.stats);
  const auto total = Clock::now() - t0;
  if (!dir.ok()) return dir.status();
  res.simulate_s = Seconds(simulate);
  res.node_s = Seconds(total - simulate);
  res.dir_bytes = dir->memory_bytes();
  res.found = dir->size();
  res.copies = dir->copy_count();
  for (const Holding& h : held) {
    const auto f = Filler(job, h.sample);
    const auto got = dir->FindCopy(h.sample);
    if ((f && f->node != m) ? got != f : got.has_value()) ++res.wrong;
  }
  res.dir = dir.value();
  for (uint32_t s : needs) {
    Holding h[2];
    uint32_t hn[2];
    const int k = job.Holders(s, h, hn);
    auto loc = dir->Find(s);
    const bool ok = k == 0
                        ? !loc.has_value()
                        : loc.has_value() && (loc->node == hn[0] || (k == 2 && loc->node == hn[1]));
    if (!ok) ++res.wrong;
  }
  return res;
}

// --verify: every node's real BuildDirectory in its own thread over an in-process all-to-all;
// the simulated run of each node must have seen the same bytes and built the same directory.
int Verify(const Job& job, const Collected& c) {
  const uint32_t n = job.opt().nodes;
  std::vector<std::vector<Holding>> held(n);
  std::vector<std::vector<uint32_t>> needs(n);
  for (uint32_t k = 0; k < n; ++k)
    Inputs(job, c, k, &held[k], &needs[k]);
  std::barrier<> barrier(n);
  std::vector<Buffers> mail(n);
  std::vector<DirectoryStats> stats(n);
  std::vector<nopfs::service::dir::PeerDirectory> dirs(n);
  std::vector<Status> status(n);
  std::vector<std::thread> threads;
  for (uint32_t k = 0; k < n; ++k) {
    threads.emplace_back([&, k] {
      auto ex = [&](Buffers out) -> Result<Buffers> {
        mail[k] = std::move(out);
        barrier.arrive_and_wait();
        Buffers in(n);
        for (uint32_t j = 0; j < n; ++j)
          in[j] = mail[j][k];
        barrier.arrive_and_wait();
        return in;
      };
      auto r = BuildDirectory(k, n, held[k], needs[k], ex, &stats[k]);
      if (r.ok()) {
        dirs[k] = std::move(r).value();
      } else {
        status[k] = r.status();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  uint64_t mismatches = 0;
  for (uint32_t k = 0; k < n; ++k) {
    if (!status[k].ok()) {
      std::fprintf(stderr, "verify: node %u: %s\n", k, status[k].ToString().c_str());
      return 1;
    }
    auto sim = MeasureNode(job, c, k);
    if (!sim.ok()) {
      std::fprintf(stderr, "verify: node %u: %s\n", k, sim.status().ToString().c_str());
      return 1;
    }
    if (sim->stats.bytes_sent != stats[k].bytes_sent ||
        sim->stats.bytes_received != stats[k].bytes_received ||
        sim->stats.owned_entries != stats[k].owned_entries || sim->dir.size() != dirs[k].size()) {
      ++mismatches;
    }
    for (uint32_t s : needs[k]) {
      if (sim->dir.Find(s) != dirs[k].Find(s)) ++mismatches;
    }
    for (const Holding& h : held[k]) {
      if (sim->dir.FindCopy(h.sample) != dirs[k].FindCopy(h.sample)) ++mismatches;
    }
  }
  std::printf("verify: %u nodes run for real against their simulation: %lu mismatches\n", n,
              static_cast<unsigned long>(mismatches));
  return mismatches == 0 ? 0 : 1;
}

bool ParseU64(const char* s, uint64_t* v) {
  char* end = nullptr;
  *v = std::strtoull(s, &end, 10);
  return end != s && *end == '\0';
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    uint64_t v = 0;
    if (!ParseU64(argv[i + 1], &v)) {
      std::fprintf(stderr, "nopfs_directory_bench: %s: not a number: %s\n", argv[i], argv[i + 1]);
      return 2;
    }
    if (std::strcmp(argv[i], "--nodes") == 0) {
      o.nodes = static_cast<uint32_t>(v);
    } else if (std::strcmp(argv[i], "--samples") == 0) {
      o.samples = static_cast<uint32_t>(v);
    } else if (std::strcmp(argv[i], "--epochs") == 0) {
      o.epochs = static_cast<uint32_t>(v);
    } else if (std::strcmp(argv[i], "--measure") == 0) {
      o.measure = static_cast<uint32_t>(v);
    } else if (std::strcmp(argv[i], "--seed") == 0) {
      o.seed = v;
    } else if (std::strcmp(argv[i], "--verify") == 0) {
      o.verify = v != 0;
    } else {
      std::fprintf(stderr, "nopfs_directory_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (o.verify) {
    if (o.nodes > 64) {
      std::fprintf(stderr, "nopfs_directory_bench: --verify runs a thread per node: at most 64\n");
      return 2;
    }
    o.measure = o.nodes;
  }
  if (o.nodes == 0 || o.epochs < 2 || o.measure == 0 || o.measure > o.nodes ||
      o.samples / o.nodes == 0) {
    std::fprintf(stderr,
                 "nopfs_directory_bench: need nodes >= 1, epochs >= 2, 1 <= measure <= "
                 "nodes, samples >= nodes\n");
    return 2;
  }
  std::printf("directory: %u nodes x %u samples, %u epochs, slice %u samples/node/epoch\n", o.nodes,
              o.samples, o.epochs, o.samples / o.nodes);
  Job job(o);
  const auto t0 = Clock::now();
  Collected c = Pass(job);
  std::printf("simulation pass over %u permutations: %.1f s\n", o.epochs,
              Seconds(Clock::now() - t0));

  // Every node's cache list size, for the allgather figure.
  uint64_t total_held = 0;
  for (uint32_t s = 0; s < o.samples; ++s) {
    Holding h[2];
    uint32_t hn[2];
    total_held += static_cast<uint64_t>(job.Holders(s, h, hn));
  }
  if (o.verify) return Verify(job, c);
  const double mean_held = static_cast<double>(total_held) / o.nodes;
  const double allgather_bytes = 4.0 * (static_cast<double>(total_held) - mean_held);
  std::printf("holdings over all nodes: %lu (%.2f x the dataset), %.0f per node\n",
              static_cast<unsigned long>(total_held), static_cast<double>(total_held) / o.samples,
              mean_held);

  double sum_time = 0;
  double sum_bytes = 0;
  for (uint32_t m = 0; m < o.measure; ++m) {
    auto r = MeasureNode(job, c, m);
    if (!r.ok()) {
      std::fprintf(stderr, "node %u: %s\n", m, r.status().ToString().c_str());
      return 1;
    }
    const NodeResult& x = r.value();
    std::printf(
        "node %u: held %lu (%lu to copy from their filler), needs %lu, found %lu (wrong %lu); "
        "build %.3f s (simulating the others "
        "%.3f s); sent %.2f MB, received %.2f MB; owned entries %lu; peak heap %.1f MB; "
        "directory %.1f MB; received per round %.2f / %.2f / %.2f MB\n",
        m, static_cast<unsigned long>(x.held), static_cast<unsigned long>(x.copies),
        static_cast<unsigned long>(x.needs), static_cast<unsigned long>(x.found),
        static_cast<unsigned long>(x.wrong), x.node_s, x.simulate_s,
        static_cast<double>(x.stats.bytes_sent) / 1e6,
        static_cast<double>(x.stats.bytes_received) / 1e6,
        static_cast<unsigned long>(x.stats.owned_entries),
        static_cast<double>(x.stats.peak_bytes) / 1e6, static_cast<double>(x.dir_bytes) / 1e6,
        static_cast<double>(x.round_received[0]) / 1e6,
        static_cast<double>(x.round_received[1]) / 1e6,
        static_cast<double>(x.round_received[2]) / 1e6);
    if (x.wrong != 0) {
      std::fprintf(stderr, "node %u: %lu samples without their real holder or filler\n", m,
                   static_cast<unsigned long>(x.wrong));
      return 1;
    }
    sum_time += x.node_s;
    sum_bytes += static_cast<double>(x.stats.bytes_received);
  }
  const double mean_recv = sum_bytes / o.measure;
  std::printf("mean over %u measured nodes: build %.3f s, received %.2f MB\n", o.measure,
              sum_time / o.measure, mean_recv / 1e6);
  // The allgather's local work, measured: a node that received every cache list (grouped by
  // node, as an allgather delivers them) indexes them by sample to answer lookups.
  std::vector<Location> all;
  all.reserve(total_held);
  for (uint32_t s = 0; s < o.samples; ++s) {
    Holding h[2];
    uint32_t hn[2];
    const int k = job.Holders(s, h, hn);
    for (int j = 0; j < k; ++j)
      all.push_back({s, hn[j], h[j].cls, h[j].position});
  }
  std::sort(all.begin(), all.end(), [](const Location& a, const Location& b) {
    return a.node != b.node ? a.node < b.node : a.position < b.position;
  });
  const auto t1 = Clock::now();
  std::stable_sort(all.begin(), all.end(),
                   [](const Location& a, const Location& b) { return a.sample < b.sample; });
  const double index_s = Seconds(Clock::now() - t1);
  const double index_bytes = static_cast<double>(all.capacity() * sizeof(Location));
  std::printf(
      "allgather: received %.1f MB per node (derived: 4-byte ids); indexing every list by "
      "sample %.3f s (measured), %.1f MB kept\n",
      allgather_bytes / 1e6, index_s, index_bytes / 1e6);
  std::printf(
      "directory / allgather: bytes received %.4f (%.0fx less), build time %.3f of the "
      "allgather's local indexing alone\n",
      mean_recv / allgather_bytes, allgather_bytes / mean_recv, (sum_time / o.measure) / index_s);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("benchmark process peak RSS (all simulation state): %.0f MB\n",
              static_cast<double>(ru.ru_maxrss) / 1024.0);
  return 0;
}
