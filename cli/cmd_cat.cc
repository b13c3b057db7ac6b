#include "cli/cmd_cat.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "common/units.h"

namespace nopfs::cli {
namespace {

struct CatFlags {
  std::string socket;
  int64_t rank = -1;
  uint32_t start_epoch = 0;
  uint64_t start_step = 0;
  uint64_t count = 0;  // 0: the whole stream
  bool verify = false;
  bool print = false;
  uint64_t pause_us = 0;  // hold each sample this long before releasing it (a slow client)
};

int Fail(const char* cmd, const std::string& msg) {
  std::fprintf(stderr, "nopfs %s: %s\n", cmd, msg.c_str());
  return 2;
}

// Reads `length` bytes at `offset` of `path` into out; the message names the path.
Status ReadPfs(const std::string& path, uint64_t offset, uint64_t length,
               std::vector<std::byte>* out) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, path);
  out->resize(length);
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n =
        pread(fd, out->data() + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      close(fd);
      if (err != 0) return Status::FromErrno(err, path);
      return Status::IoError(path + ": file ends at byte " + std::to_string(offset + done) +
                             ", the sample needs " + std::to_string(offset + length));
    }
    done += static_cast<uint64_t>(n);
  }
  close(fd);
  return Status::Ok();
}

int RunCat(const CatFlags& f) {
  uint32_t rank = 0;
  if (f.rank >= 0) {
    rank = static_cast<uint32_t>(f.rank);
  } else if (const char* r = std::getenv("NOPFS_RANK"); r != nullptr && *r != '\0') {
    char* end = nullptr;
    const unsigned long v = std::strtoul(r, &end, 10);
    if (*end != '\0' || v > UINT32_MAX)
      return Fail("cat", "NOPFS_RANK=\"" + std::string(r) + "\" is not a rank");
    rank = static_cast<uint32_t>(v);
  } else {
    return Fail("cat", "no rank: pass --rank R or run under `nopfs run`/srun (NOPFS_RANK)");
  }
  // A line per sample as it is read, so that a reader of a pipe sees how far the stream is (and
  // a full pipe holds the stream back) rather than a 4 KiB block some hundreds of samples late.
  if (f.print) std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Result<std::unique_ptr<client::Client>> c = client::Client::Connect(f.socket);
  if (!c.ok()) return Fail("cat", c.status().message());
  Result<std::unique_ptr<client::Stream>> s = (*c)->Open(rank, f.start_epoch, f.start_step);
  if (!s.ok()) return Fail("cat", s.status().message());

  // unverified: delivered, but its file could not be read to compare (gone, shorter) or nopfsd,
  // which says where a sample lives, is gone: neither a wrong byte nor a right one.
  uint64_t samples = 0, bytes = 0, mismatches = 0, unverified = 0, errors = 0;
  std::vector<std::byte> expect;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    if (f.count != 0 && samples + errors >= f.count) break;
    Result<std::optional<client::Sample>> next = (*s)->Next();
    if (!next.ok()) {
      // An error names the sample and its path; the stream goes on with the next sample.
      std::fprintf(stderr, "nopfs cat: %s\n", next.status().message().c_str());
      ++errors;
      if (next.status().code() == StatusCode::kUnavailable ||
          next.status().code() == StatusCode::kTimedOut) {
        break;  // the service is gone
      }
      continue;
    }
    if (!next->has_value()) break;
    const client::Sample& smp = **next;
    if (f.print) {
      std::printf("%" PRIu32 " %" PRId64 " %" PRIu64 "\n", smp.sample_id, smp.label, smp.size);
    }
    if (f.verify) {
      Result<client::SampleInfo> info = (*c)->Describe(smp.sample_id);
      Status st =
          info.ok() ? ReadPfs(info->path, info->offset, info->length, &expect) : info.status();
      if (!st.ok()) {
        std::fprintf(stderr, "nopfs cat: sample %" PRIu32 ": cannot verify: %s\n", smp.sample_id,
                     st.message().c_str());
        ++unverified;
      } else if (expect.size() != smp.size || std::memcmp(expect.data(), smp.data, smp.size) != 0) {
        std::fprintf(stderr,
                     "nopfs cat: sample %" PRIu32 " (%s): %" PRIu64
                     " bytes delivered differ from the file's %zu bytes\n",
                     smp.sample_id, info->path.c_str(), smp.size, expect.size());
        ++mismatches;
      }
    }
    ++samples;
    bytes += smp.size;
    if (f.pause_us != 0) std::this_thread::sleep_for(std::chrono::microseconds(f.pause_us));
    if (Status r = (*s)->Release(smp); !r.ok()) return Fail("cat", r.message());
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const client::Stats st = (*s)->stats();
  std::fprintf(
      stderr,
      "nopfs cat: rank %u: read in %.3f s (%s/s%s); stall total %.3f s, median "
      "%.1f us, p99 %.1f us\n",
      rank, elapsed, FormatBytes(elapsed > 0 ? static_cast<double>(bytes) / elapsed : 0.0).c_str(),
      f.verify ? ", verifying" : "", static_cast<double>(st.stall_ns_total) / 1e9,
      static_cast<double>(st.stall_ns_median) / 1e3, static_cast<double>(st.stall_ns_p99) / 1e3);
  std::printf("%" PRIu64 " samples, %" PRIu64 " bytes, %" PRIu64 " mismatches", samples, bytes,
              mismatches);
  if (unverified != 0) std::printf(", %" PRIu64 " not verified", unverified);
  std::printf("\n");
  return (mismatches != 0 || unverified != 0 || errors != 0) ? 1 : 0;
}

}  // namespace

void RegisterCat(CLI::App* app, int* exit_code) {
  auto f = std::make_shared<CatFlags>();
  CLI::App* sub = app->add_subcommand(
      "cat",
      "Read a rank's whole stream through the local nopfsd (with --verify, check every "
      "sample against its file)");
  sub->add_option("--socket", f->socket, "nopfsd's socket (default: $NOPFS_SOCKET)");
  sub->add_option("--rank", f->rank, "The rank whose stream to read (default: $NOPFS_RANK)");
  sub->add_option("--start-epoch", f->start_epoch, "Resume at this epoch")->capture_default_str();
  sub->add_option("--start-step", f->start_step, "Resume at this step of the start epoch")
      ->capture_default_str();
  sub->add_option("--count", f->count, "Stop after this many samples (0: the whole stream)")
      ->capture_default_str();
  sub->add_flag("--verify", f->verify, "Compare every sample with its file on the PFS");
  sub->add_option("--pause-us", f->pause_us,
                  "Hold each sample this many microseconds before releasing it (a slow reader)");
  sub->add_flag("--print", f->print, "Print `sample label size` for every sample");
  sub->callback([f, exit_code] { *exit_code = RunCat(*f); });
}

}  // namespace nopfs::cli
