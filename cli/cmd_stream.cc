#include "cli/cmd_stream.h"

#include <cstdio>
#include <memory>

#include "launch/job_flags.h"
#include "policy/partition.h"

namespace nopfs::cli {

using launch::AddJobFlags;
using launch::FinishJobFlags;
using launch::JobFlags;

namespace {

struct StreamFlags {
  JobFlags job;
  uint32_t rank = 0;
  uint32_t start_epoch = 0;
  uint64_t start_step = 0;
  uint64_t count = 0;  // 0: the whole stream
  bool verbose = false;
};

int RunStream(const StreamFlags& f) {
  if (f.rank >= f.job.job.ranks) {
    std::fprintf(stderr, "nopfs stream: --rank %u is out of range: write a rank in [0, %u)\n",
                 f.rank, f.job.job.ranks);
    return 2;
  }
  const policy::StreamPoint start{f.start_epoch, f.start_step};
  if (Status s = policy::ValidateStreamPoint(f.job.job, start); !s.ok()) {
    std::fprintf(stderr, "nopfs stream: %s\n", s.message().c_str());
    return 2;
  }
  policy::RankStream stream(f.job.job, f.rank, start);
  policy::Access a;
  // A large stdio buffer: this prints up to E*F/N lines.
  static char buf[1 << 16];
  std::setvbuf(stdout, buf, _IOFBF, sizeof(buf));
  uint64_t printed = 0;
  while ((f.count == 0 || printed < f.count) && stream.Next(&a)) {
    ++printed;
    if (f.verbose) {
      std::printf("%u %llu %llu %u\n", a.epoch, static_cast<unsigned long long>(a.step),
                  static_cast<unsigned long long>(a.index), a.sample);
    } else {
      std::printf("%u\n", a.sample);
    }
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) return 1;
  return 0;
}

}  // namespace

void RegisterStream(CLI::App* app, int* exit_code) {
  auto flags = std::make_shared<StreamFlags>();
  CLI::App* sub = app->add_subcommand(
      "stream", "Print rank R's access stream, one sample id per line, epoch after epoch");
  AddJobFlags(sub, &flags->job, /*samples_required=*/true);
  sub->add_option("--rank", flags->rank, "R, the rank whose stream to print")->required();
  sub->add_option("--start-epoch", flags->start_epoch, "Resume: first epoch to print")
      ->capture_default_str();
  sub->add_option("--start-step", flags->start_step, "Resume: first step of --start-epoch to print")
      ->capture_default_str();
  sub->add_option("--count", flags->count, "Print at most this many entries (0: all)")
      ->capture_default_str();
  sub->add_flag("--verbose,-v", flags->verbose,
                "Print 'epoch step index sample' per line instead of the sample id alone");
  sub->callback([flags, exit_code] {
    if (Status s = FinishJobFlags(&flags->job); !s.ok()) {
      std::fprintf(stderr, "nopfs stream: %s\n", s.message().c_str());
      *exit_code = 2;
      return;
    }
    *exit_code = RunStream(*flags);
  });
}

}  // namespace nopfs::cli
