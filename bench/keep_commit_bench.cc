// nopfs_keep_commit_bench: what committing the keep record (service/reader/kept.h,
// KeepCommitter) costs the SSD tier's fill.
//
//   nopfs_keep_commit_bench [--dir /var/tmp] [--files 20000] [--kib 16] [--rounds 3]
//
// Writes --files files of --kib KiB under --dir, opens their catalog, and fills an SsdTier of all
// of them with a 2-thread Prefetcher reading the files (from the page cache after the first
// round, so the fill is as fast as this machine's disk and cores allow: the worst case for the
// committer's share), best of --rounds:
//  - without a committer;
//  - with one as nopfsd runs it (a look every second, batches of 256 new samples and a quarter of
//    those written, woken when the prefetch is done);
//  - with one that looks every 10 ms (commits as often as the batch rule allows).
// For each: the fill's samples/s and MB/s, and for the committers the records written, their
// bytes, the time spent in commits and the time from the fill's end to a record holding every
// sample. A benchmark prints figures; it never fails.
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kept/area.h"
#include "service/catalog/catalog.h"
#include "service/env/env.h"
#include "service/reader/kept.h"
#include "service/tiers/prefetcher.h"
#include "service/tiers/ssd_tier.h"

namespace {

namespace fs = std::filesystem;
using namespace nopfs;
using namespace nopfs::service;

void Die(const Status& s) {
  std::fprintf(stderr, "nopfs_keep_commit_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Run {
  double fill_s = 1e9;
  uint64_t commits = 0, written = 0;
  double commit_s = 0, tail_s = 0;
};

// One fill of a fresh tier; `mode` 0: no committer, 1: nopfsd's, 2: a look every 10 ms.
Run FillOnce(const std::string& scratch, const Catalog& catalog, int mode, int round) {
  const std::vector<uint64_t> sizes(catalog.sizes().begin(), catalog.sizes().end());
  policy::TierPlan plan;
  for (uint64_t k = 0; k < sizes.size(); ++k) {
    plan.prefetch_order.push_back(k);
    plan.bytes += sizes[k];
  }
  Result<TierLayout> layout = TierLayout::Ssd(plan, sizes);
  if (!layout.ok()) Die(layout.status());
  Result<std::unique_ptr<SsdTier>> tier = SsdTier::Create(
      SsdTierOptions{scratch, "bench" + std::to_string(mode) + "r" + std::to_string(round), "0",
                     true},
      std::move(*layout));
  if (!tier.ok()) Die(tier.status());
  SsdTier& t = **tier;
  t.WaitPreallocated();
  std::unique_ptr<KeepCommitter> c;
  if (mode != 0) {
    KeepCommitOptions o;
    o.place.key = kept::KeptKey(catalog.root(), "bench");
    o.place.dataset = catalog.root();
    o.unchanged_before_ns = INT64_MAX;
    if (mode == 2) o.interval = std::chrono::milliseconds(10);
    c = std::make_unique<KeepCommitter>(std::move(o), t, catalog, Env::Default());
    c->Start();
  }
  Run r;
  const double t0 = Now();
  {
    Prefetcher pf(
        t,
        [&catalog](policy::SampleId id, std::span<std::byte> dst) -> Result<uint64_t> {
          NOPFS_RETURN_IF_ERROR(catalog.Read(id, dst));
          return XXH3_64bits(dst.data(), dst.size());
        },
        2);
    KeepCommitter* cp = c.get();
    pf.SetOnDone([cp] {
      if (cp != nullptr) cp->Wake();
    });
    if (Status s = pf.Start(); !s.ok()) Die(s);
    pf.Wait();
  }
  const double t1 = Now();
  r.fill_s = t1 - t0;
  if (c) {
    while (c->committed_samples() < sizes.size() && Now() - t1 < 60)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    r.tail_s = Now() - t1;
    c->Stop();
    r.commits = c->commits();
    r.written = c->committed_bytes();
    r.commit_s = static_cast<double>(c->commit_ns()) / 1e9;
    c->Discard();
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp";
  uint64_t files = 20000, kib = 16;
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") {
      dir = argv[i + 1];
    } else if (a == "--files") {
      files = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (a == "--kib") {
      kib = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (a == "--rounds") {
      rounds = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s [--dir D] [--files N] [--kib K] [--rounds R]\n", argv[0]);
      return 2;
    }
  }
  char tmpl[4096];
  std::snprintf(tmpl, sizeof tmpl, "%s/nopfs-keep-commit-bench.XXXXXX", dir.c_str());
  if (::mkdtemp(tmpl) == nullptr) Die(Status::FromErrno(errno, "mkdtemp in " + dir));
  const std::string root = tmpl;
  const std::string data = root + "/data";
  fs::create_directories(data + "/c");
  const std::string bytes(kib << 10, 'x');
  for (uint64_t k = 0; k < files; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "/c/%08llu.bin", static_cast<unsigned long long>(k));
    std::ofstream(data + name, std::ios::binary) << bytes;
  }
  CatalogOptions co;
  co.dataset = data;
  co.work_dir = root + "/work";
  co.scan_threads = 2;
  Result<std::unique_ptr<Catalog>> catalog = Catalog::Open(co, Env::Default());
  if (!catalog.ok()) Die(catalog.status());
  const std::string scratch = root + "/ssd";
  fs::create_directories(scratch);
  const double mb = static_cast<double>(files * (kib << 10)) / 1e6;
  std::printf("%llu files of %llu KiB (%.0f MB), best fill of %d rounds each, under %s\n",
              static_cast<unsigned long long>(files), static_cast<unsigned long long>(kib), mb,
              rounds, dir.c_str());
  std::printf("%-26s %10s %8s %8s %12s %10s %10s\n", "committer", "samples/s", "MB/s", "records",
              "record MB", "commit s", "tail ms");
  const char* names[] = {"none", "nopfsd's (1 s looks)", "a look every 10 ms"};
  double base = 0;
  for (int mode = 0; mode < 3; ++mode) {
    Run best;
    for (int r = 0; r < rounds; ++r) {
      const Run run = FillOnce(scratch, **catalog, mode, r);
      if (run.fill_s < best.fill_s) best = run;
    }
    if (mode == 0) base = best.fill_s;
    std::printf("%-26s %10.0f %8.0f %8llu %12.2f %10.3f %10.1f   fill %.3f s (%+.1f %%)\n",
                names[mode], static_cast<double>(files) / best.fill_s, mb / best.fill_s,
                static_cast<unsigned long long>(best.commits),
                static_cast<double>(best.written) / 1e6, best.commit_s, best.tail_s * 1e3,
                best.fill_s, (best.fill_s / base - 1) * 100);
  }
  catalog->reset();
  fs::remove_all(root);
  return 0;
}
