// Fuzz target: the SPANK option parsers (spank/options.h). The user's --nopfs* options reach the
// plugin in sbatch, srun and slurmstepd, and nopfs-job as root; the admin's plugstack.conf
// arguments are parsed by the same pure functions. (A job's node list is Slurm's to parse:
// spank/hostlist.h hands it to libslurm.)
// The first input byte chooses the parser (even or odd); the rest is lines of text:
//   even: user options, one "name=value" (or a bare flag name) per line, then ValidateJob and
//         RanksPerNode for a layout taken from the input;
//   odd:  plugstack.conf arguments, one key=value per line.
// Properties: no read outside the input; every refusal has a message; what is accepted survives
// the trip through ToArgs (the arguments nopfs-job gets) with the same values, twice over (Slurm
// calls back twice); accepted values are in their documented ranges.
#include <string>

#include "fuzz/fuzz_check.h"
#include "spank/options.h"

namespace spank = nopfs::spank;

namespace {

// The lines of `text` (at most 64), as views into it.
std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos <= text.size() && out.size() < 64) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

// "--name=value" or "--name" (as ToArgs writes them) to ApplyOption.
nopfs::Status ApplyArg(spank::JobOptions* opts, std::string_view arg) {
  NOPFS_FUZZ_CHECK(arg.starts_with("--"));
  arg.remove_prefix(2);
  const size_t eq = arg.find('=');
  if (eq == std::string_view::npos) return spank::ApplyOption(opts, arg, "");
  return spank::ApplyOption(opts, arg.substr(0, eq), arg.substr(eq + 1));
}

bool SameJob(const spank::JobOptions& a, const spank::JobOptions& b) {
  return a.dataset == b.dataset && a.seed == b.seed && a.epochs == b.epochs && a.batch == b.batch &&
         a.scheme == b.scheme && a.drop_last == b.drop_last &&
         a.ranks_per_node == b.ranks_per_node && a.ram == b.ram && a.ssd == b.ssd;
}

void UserOptions(std::string_view text, uint8_t layout_byte) {
  spank::JobOptions opts;
  for (const std::string_view line : Lines(text)) {
    const size_t eq = line.find('=');
    const std::string_view name = line.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : line.substr(eq + 1);
    nopfs::Status st = spank::ApplyOption(&opts, name, value);
    if (!st.ok()) {
      NOPFS_FUZZ_CHECK(!st.message().empty());
      return;
    }
  }
  nopfs::Status valid = spank::ValidateJob(opts);
  if (!valid.ok()) {
    NOPFS_FUZZ_CHECK(!valid.message().empty());
    return;
  }
  NOPFS_FUZZ_CHECK(opts.epochs >= 1 && opts.epochs <= 1'000'000);
  NOPFS_FUZZ_CHECK(opts.batch >= 1 && opts.batch <= (uint64_t{1} << 40));
  NOPFS_FUZZ_CHECK(opts.scheme == "strided" || opts.scheme == "uniform");
  NOPFS_FUZZ_CHECK(opts.dataset.empty() || opts.dataset.front() == '/');
  spank::JobOptions back;
  const std::vector<std::string> args = spank::ToArgs(opts);
  for (int pass = 0; pass < 2; ++pass) {
    for (const std::string& a : args)
      NOPFS_FUZZ_CHECK(ApplyArg(&back, a).ok());
  }
  if (!opts.dataset.empty()) NOPFS_FUZZ_CHECK(SameJob(back, opts));
  NOPFS_FUZZ_CHECK(spank::ValidateJob(back).ok());

  const spank::TaskLayout layout{1u + (layout_byte & 7u), (layout_byte >> 3) & 7u,
                                 (layout_byte >> 6) & 3u};
  nopfs::Result<uint32_t> ranks = spank::RanksPerNode(layout, opts);
  if (ranks.ok()) {
    NOPFS_FUZZ_CHECK(*ranks >= 1 && *ranks <= 4096);
  } else {
    NOPFS_FUZZ_CHECK(!ranks.status().message().empty());
  }
}

bool SamePlugin(const spank::PluginArgs& a, const spank::PluginArgs& b) {
  return a.config == b.config && a.policy == b.policy && a.rundir == b.rundir &&
         a.on_refusal == b.on_refusal && a.launcher == b.launcher && a.nopfsd == b.nopfsd &&
         a.timeout == b.timeout && a.grace == b.grace && a.peer_key == b.peer_key &&
         a.peer_ports == b.peer_ports && a.peer_host == b.peer_host;
}

void PluginArgs(std::string_view text) {
  const std::vector<std::string_view> lines = Lines(text);
  nopfs::Result<spank::PluginArgs> args =
      spank::ParsePluginArgs(std::vector<std::string>(lines.begin(), lines.end()));
  if (!args.ok()) {
    NOPFS_FUZZ_CHECK(!args.status().message().empty());
    return;
  }
  NOPFS_FUZZ_CHECK(!args->rundir.empty() && args->rundir.front() == '/' && args->rundir != "/");
  NOPFS_FUZZ_CHECK(!args->peer_ports.empty() && spank::PortCount(args->peer_ports) <= 65535);
  NOPFS_FUZZ_CHECK(spank::PeerPort(args->peer_ports, UINT32_MAX, 7) >= args->peer_ports[0].low);
  nopfs::Result<spank::PluginArgs> back = spank::ParsePluginArgs(spank::ToArgs(*args));
  NOPFS_FUZZ_CHECK(back.ok() && SamePlugin(*back, *args));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // Views of libFuzzer's exactly sized buffer, so that ASan sees any read past the input.
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  if (data[0] % 2 == 0) {
    UserOptions(text, data[1]);
  } else {
    PluginArgs(text);
  }
  return 0;
}
