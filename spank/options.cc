#include "spank/options.h"

#include <charconv>
#include <limits>

#include "common/units.h"

// Declares `decl` from a Result, or returns its Status.
#define SPANK_CONCAT2(a, b) a##b
#define SPANK_CONCAT(a, b) SPANK_CONCAT2(a, b)
#define SPANK_ASSIGN_OR_RETURN(decl, expr)           \
  auto SPANK_CONCAT(result_, __LINE__) = (expr);     \
  if (!SPANK_CONCAT(result_, __LINE__).ok()) {       \
    return SPANK_CONCAT(result_, __LINE__).status(); \
  }                                                  \
  decl = std::move(*SPANK_CONCAT(result_, __LINE__))

namespace nopfs::spank {
namespace {

constexpr size_t kMaxPath = 4000;  // below PATH_MAX, with room for what nopfsd appends
constexpr size_t kMaxPortRanges = 16;
constexpr size_t kMaxValue = 64;
constexpr uint64_t kMinTierBytes = kMiB;

enum Opt : uint32_t {
  kDataset,
  kSeed,
  kEpochs,
  kBatch,
  kScheme,
  kDropLast,
  kRanksPerNode,
  kRam,
  kSsd,
  kKeep,
  kShareRunning,
  kPlacement,
};

std::string Quote(std::string_view name, std::string_view value, bool flag) {
  return flag ? "--" + std::string(name) : "--" + std::string(name) + "=" + std::string(value);
}

// Control characters, and bytes >= 0x80 (no encoding is promised), are refused everywhere.
Status CheckText(std::string_view shown, std::string_view value, size_t max) {
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      return Status::InvalidArgument(
          "--" + std::string(shown.substr(2, shown.find('=') - 2)) +
          ": contains a control or non-ASCII character; write plain printable ASCII");
    }
  }
  if (value.size() > max) {
    return Status::InvalidArgument(std::string(shown.substr(0, 80)) + "...: is " +
                                   std::to_string(value.size()) + " characters long; at most " +
                                   std::to_string(max) + " are accepted");
  }
  return Status::Ok();
}

Result<uint64_t> ParseNumber(std::string_view shown, std::string_view value, uint64_t lo,
                             uint64_t hi, std::string_view example) {
  uint64_t v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec == std::errc::invalid_argument || p != end) {
    return Status::InvalidArgument(std::string(shown) + ": is not a whole number; write e.g. " +
                                   std::string(example));
  }
  if (ec == std::errc::result_out_of_range || v < lo || v > hi) {
    return Status::InvalidArgument(std::string(shown) + ": is out of range; write a number from " +
                                   std::to_string(lo) + " to " + std::to_string(hi));
  }
  return v;
}

// Stores `v` in *field unless the option was already given with a different value.
template <typename T>
Status Store(JobOptions* opts, Opt opt, std::string_view shown, T* field, T v) {
  const uint32_t bit = 1u << opt;
  if ((opts->given & bit) != 0 && *field != v) {
    return Status::InvalidArgument(std::string(shown) +
                                   ": the option was already given with another value; give it "
                                   "once");
  }
  *field = std::move(v);
  opts->given |= bit;
  return Status::Ok();
}

bool IsComponentChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

const std::vector<OptionInfo>& UserOptions() {
  static const std::vector<OptionInfo> kOptions = {
      {"nopfs", "DATASET",
       "Cache the dataset directory DATASET (absolute path) on the job's nodes with nopfs"},
      {"nopfs-seed", "N", "nopfs: shuffle seed shared by all ranks (default 0)"},
      {"nopfs-epochs", "N", "nopfs: epochs the job reads (default 1)"},
      {"nopfs-batch", "N", "nopfs: global batch size, all ranks together (default 1)"},
      {"nopfs-scheme", "uniform|strided", "nopfs: how a batch is split across ranks"},
      {"nopfs-drop-last", nullptr, "nopfs: drop each epoch's last incomplete batch"},
      {"nopfs-ranks-per-node", "N",
       "nopfs: training processes per node (default: the job's tasks per node)"},
      {"nopfs-ram", "SIZE",
       "nopfs: RAM cache per node in --mem's units, e.g. 16G; 0: none (default: site policy)"},
      {"nopfs-ssd", "SIZE",
       "nopfs: SSD cache per node in --mem's units, e.g. 400G; 0: none (default: site policy)"},
      {"nopfs-keep", "yes|no",
       "nopfs: keep the SSD cache on the nodes for your next job on the dataset (default yes, "
       "as the site policy allows)"},
      {"nopfs-share-running", "yes|no",
       "nopfs: read through your other running jobs on the same node and dataset, so that the "
       "PFS is read once (default yes)"},
      {"nopfs-placement", "prefer|require|off",
       "nopfs: run on the nodes that hold your kept copy of the dataset: prefer them (default), "
       "require them, or off"},
  };
  return kOptions;
}

Status ApplyOption(JobOptions* opts, std::string_view name, std::string_view value) {
  const auto& options = UserOptions();
  uint32_t opt = 0;
  while (opt < options.size() && name != options[opt].name)
    ++opt;
  if (opt == options.size()) {
    return Status::InvalidArgument("--" + std::string(name).substr(0, 64) +
                                   ": is not a nopfs option; see sbatch --help");
  }
  const bool flag = options[opt].arginfo == nullptr;
  const std::string shown = Quote(name, value.substr(0, 200), flag);
  if (flag) {
    // Slurm passes flags without a value; accept the spellings it may use for "given".
    if (!value.empty() && value != "(null)" && value != "1" && value != "yes") {
      return Status::InvalidArgument(Quote(name, value.substr(0, 200), false) +
                                     ": takes no value; write --" + std::string(name));
    }
    return Store(opts, kDropLast, shown, &opts->drop_last, true);
  }
  NOPFS_RETURN_IF_ERROR(CheckText(shown, value, opt == kDataset ? kMaxPath : kMaxValue));
  switch (static_cast<Opt>(opt)) {
    case kDataset: {
      if (value.empty() || value.front() != '/') {
        return Status::InvalidArgument(shown +
                                       ": the dataset must be an absolute path; write e.g. "
                                       "--nopfs=/pfs/datasets/imagenet");
      }
      for (size_t pos = 0; pos < value.size();) {
        size_t next = value.find('/', pos + 1);
        if (next == std::string_view::npos) next = value.size();
        const std::string_view part = value.substr(pos + 1, next - pos - 1);
        if (part == "..") {
          return Status::InvalidArgument(shown +
                                         ": '..' is not allowed in the dataset path; write the "
                                         "path without it");
        }
        pos = next;
      }
      return Store(opts, kDataset, shown, &opts->dataset, std::string(value));
    }
    case kSeed: {
      SPANK_ASSIGN_OR_RETURN(
          uint64_t v,
          ParseNumber(shown, value, 0, std::numeric_limits<uint64_t>::max(), "--nopfs-seed=42"));
      return Store(opts, kSeed, shown, &opts->seed, v);
    }
    case kEpochs: {
      SPANK_ASSIGN_OR_RETURN(uint64_t v,
                             ParseNumber(shown, value, 1, 1'000'000, "--nopfs-epochs=90"));
      return Store(opts, kEpochs, shown, &opts->epochs, static_cast<uint32_t>(v));
    }
    case kBatch: {
      SPANK_ASSIGN_OR_RETURN(uint64_t v,
                             ParseNumber(shown, value, 1, uint64_t{1} << 40, "--nopfs-batch=256"));
      return Store(opts, kBatch, shown, &opts->batch, v);
    }
    case kScheme:
      if (value != "uniform" && value != "strided") {
        return Status::InvalidArgument(shown +
                                       ": unknown scheme; write --nopfs-scheme=uniform or "
                                       "--nopfs-scheme=strided");
      }
      return Store(opts, kScheme, shown, &opts->scheme, std::string(value));
    case kRanksPerNode: {
      SPANK_ASSIGN_OR_RETURN(uint64_t v,
                             ParseNumber(shown, value, 1, 4096, "--nopfs-ranks-per-node=4"));
      return Store(opts, kRanksPerNode, shown, &opts->ranks_per_node, static_cast<uint32_t>(v));
    }
    case kRam:
    case kSsd: {
      const char* tier = opt == kRam ? "RAM" : "SSD";
      Result<uint64_t> v = ParseSize(value);
      if (!v.ok()) {
        return Status::InvalidArgument(shown + ": " + v.status().message());
      }
      // 0 asks for no tier of this kind; anything else below 1M (--mem's smallest unit) holds
      // no dataset worth caching and is a slip of the unit: say what it reads as.
      if (*v != 0 && *v < kMinTierBytes) {
        std::string number(value);
        while (!number.empty() && !(number.back() >= '0' && number.back() <= '9'))
          number.pop_back();
        if (number.empty()) number = "16";
        return Status::InvalidArgument(shown + ": is " + FormatBytes(static_cast<double>(*v)) +
                                       ", too small for a cache (the least is 1M); sizes follow "
                                       "--mem (a bare number is MiB; K, M, G, T are "
                                       "powers of 1024): write --" +
                                       std::string(name) + "=" + number + "G for " + number +
                                       " GiB, or --" + std::string(name) + "=0 for no " + tier +
                                       " cache");
      }
      return opt == kRam ? Store(opts, kRam, shown, &opts->ram, *v)
                         : Store(opts, kSsd, shown, &opts->ssd, *v);
    }
    case kKeep:
      if (value != "yes" && value != "no") {
        return Status::InvalidArgument(shown +
                                       ": write --nopfs-keep=yes (keep the SSD cache for the "
                                       "next job, as the site allows) or --nopfs-keep=no");
      }
      return Store(opts, kKeep, shown, &opts->keep, value == "yes");
    case kShareRunning:
      if (value != "yes" && value != "no") {
        return Status::InvalidArgument(
            shown +
            ": write --nopfs-share-running=yes (read through your other running jobs on the "
            "dataset) or --nopfs-share-running=no (read alone)");
      }
      return Store(opts, kShareRunning, shown, &opts->share_running, value == "yes");
    case kPlacement:
      if (value != "prefer" && value != "require" && value != "off") {
        return Status::InvalidArgument(
            shown +
            ": write --nopfs-placement=prefer (run on the nodes that hold your kept copy when "
            "they are free), --nopfs-placement=require (wait for them) or "
            "--nopfs-placement=off");
      }
      return Store(opts, kPlacement, shown, &opts->placement, std::string(value));
    case kDropLast:
      break;
  }
  return Status::Internal("--" + std::string(name) + ": unhandled option");
}

Status ValidateJob(const JobOptions& opts) {
  if (opts.dataset.empty() && (opts.given & ~(1u << kDataset)) != 0) {
    for (uint32_t i = 0; i < UserOptions().size(); ++i) {
      if ((opts.given & (1u << i)) != 0 && i != kDataset) {
        return Status::InvalidArgument(std::string("--") + UserOptions()[i].name +
                                       ": needs --nopfs=DATASET as well; add e.g. "
                                       "--nopfs=/pfs/datasets/imagenet");
      }
    }
  }
  if (OptionGiven(opts, "nopfs-ram") && OptionGiven(opts, "nopfs-ssd") && opts.ram == 0 &&
      opts.ssd == 0) {
    return Status::InvalidArgument(
        "--nopfs-ram=0 with --nopfs-ssd=0 leaves no cache; leave out --nopfs to run without "
        "nopfs, or give one of them a size such as 16G");
  }
  // What can be told before the job has nodes: under uniform, a global batch smaller than the
  // ranks leaves the last ranks of every step empty, and the job has at least the ranks of one
  // node. The rest (the ranks from the job's layout, more ranks than samples) is checked at job
  // start, where nopfsd knows both.
  if (!opts.dataset.empty() && opts.scheme == "uniform" &&
      OptionGiven(opts, "nopfs-ranks-per-node") && opts.batch < opts.ranks_per_node) {
    return Status::InvalidArgument(
        "--nopfs-scheme=uniform with --nopfs-batch=" + std::to_string(opts.batch) + " and " +
        "--nopfs-ranks-per-node=" + std::to_string(opts.ranks_per_node) +
        " leaves ranks without a sample in every step (each batch is cut into one slice per "
        "rank); write --nopfs-scheme=strided (the default), or a --nopfs-batch that is a "
        "multiple of the job's ranks");
  }
  return Status::Ok();
}

bool OptionGiven(const JobOptions& opts, std::string_view name) {
  const auto& options = UserOptions();
  for (uint32_t i = 0; i < options.size(); ++i) {
    if (name == options[i].name) return (opts.given & (1u << i)) != 0;
  }
  return false;
}

Result<uint32_t> RanksPerNode(const TaskLayout& layout, const JobOptions& opts) {
  if (layout.nodes == 0) return Status::InvalidArgument("the job has no nodes");
  const std::string nodes = std::to_string(layout.nodes) + (layout.nodes == 1 ? " node" : " nodes");
  uint32_t per_node = layout.tasks_per_node;
  if (per_node != 0) {
    if (layout.tasks != 0 && layout.tasks != uint64_t{per_node} * layout.nodes) {
      return Status::InvalidArgument(
          "the job's " + std::to_string(layout.tasks) + " tasks are not " +
          std::to_string(per_node) + " on each of its " + nodes +
          "; nopfs needs the same number of tasks on every node: write -N and "
          "--ntasks-per-node, and leave out -n or make it their product");
    }
  } else if (layout.tasks == 0) {
    per_node = 1;  // srun starts one task a node
  } else if (layout.tasks % layout.nodes != 0) {
    return Status::InvalidArgument(
        "the job's " + std::to_string(layout.tasks) + " tasks do not spread evenly over its " +
        nodes +
        "; nopfs needs the same number of tasks on every node: write -N and "
        "--ntasks-per-node (e.g. -N" +
        std::to_string(layout.nodes) +
        " --ntasks-per-node=" + std::to_string((layout.tasks + layout.nodes - 1) / layout.nodes) +
        "), or an -n that is a multiple of -N");
  } else {
    per_node = layout.tasks / layout.nodes;
  }
  if (!OptionGiven(opts, "nopfs-ranks-per-node")) return per_node;
  const uint32_t given = opts.ranks_per_node;
  if (given % per_node != 0) {
    const std::string t = std::to_string(per_node);
    return Status::InvalidArgument(
        "--nopfs-ranks-per-node=" + std::to_string(given) + ": the job runs " + t +
        (per_node == 1 ? " task" : " tasks") +
        " per node; leave the option out (one training "
        "process a task), or write a multiple of " +
        t + " when a launcher such as torchrun starts several processes in each task");
  }
  return given;
}

std::vector<std::string> ToArgs(const JobOptions& opts) {
  std::vector<std::string> out;
  if (opts.dataset.empty()) return out;
  out.push_back("--nopfs=" + opts.dataset);
  out.push_back("--nopfs-seed=" + std::to_string(opts.seed));
  out.push_back("--nopfs-epochs=" + std::to_string(opts.epochs));
  out.push_back("--nopfs-batch=" + std::to_string(opts.batch));
  out.push_back("--nopfs-scheme=" + opts.scheme);
  if (opts.drop_last) out.push_back("--nopfs-drop-last");
  if (OptionGiven(opts, "nopfs-ranks-per-node")) {
    out.push_back("--nopfs-ranks-per-node=" + std::to_string(opts.ranks_per_node));
  }
  if (OptionGiven(opts, "nopfs-ram")) out.push_back("--nopfs-ram=" + SizeArg(opts.ram));
  if (OptionGiven(opts, "nopfs-ssd")) out.push_back("--nopfs-ssd=" + SizeArg(opts.ssd));
  if (OptionGiven(opts, "nopfs-keep"))
    out.push_back(opts.keep ? "--nopfs-keep=yes" : "--nopfs-keep=no");
  if (OptionGiven(opts, "nopfs-share-running")) {
    out.push_back(opts.share_running ? "--nopfs-share-running=yes" : "--nopfs-share-running=no");
  }
  if (OptionGiven(opts, "nopfs-placement")) out.push_back("--nopfs-placement=" + opts.placement);
  return out;
}

namespace {

// peer_ports=LOW-HIGH[,LOW-HIGH...]: ascending, disjoint ranges of ports 1..65535 (a single
// port is LOW-LOW or LOW).
Result<std::vector<PortRange>> ParsePortRanges(const std::string& shown, std::string_view value) {
  const std::string write =
      "; write ascending, disjoint ranges of privileged ports, e.g. peer_ports=600-987 or "
      "peer_ports=600-630,640-987";
  std::vector<PortRange> out;
  size_t pos = 0;
  while (pos <= value.size()) {
    const size_t comma = std::min(value.find(',', pos), value.size());
    const std::string_view item = value.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    const std::string_view lo = item.substr(0, dash);
    const std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    uint32_t low = 0;
    uint32_t high = 0;
    const auto number = [](std::string_view t, uint32_t* v) {
      const auto r = std::from_chars(t.data(), t.data() + t.size(), *v);
      return !t.empty() && r.ec == std::errc() && r.ptr == t.data() + t.size() && *v >= 1 &&
             *v <= 65535;
    };
    if (!number(lo, &low) || !number(hi, &high) || low > high) {
      return Status::InvalidArgument(shown + ": '" + std::string(item) +
                                     "' is not a range LOW-HIGH of ports 1..65535" + write);
    }
    if (!out.empty() && low <= out.back().high) {
      return Status::InvalidArgument(shown + ": ranges overlap or are not ascending" + write);
    }
    if (out.size() == kMaxPortRanges) {
      return Status::InvalidArgument(shown + ": more than " + std::to_string(kMaxPortRanges) +
                                     " ranges" + write);
    }
    out.push_back({static_cast<uint16_t>(low), static_cast<uint16_t>(high)});
    pos = comma + 1;
  }
  return out;
}

}  // namespace

Result<PluginArgs> ParsePluginArgs(const std::vector<std::string>& args) {
  PluginArgs out;
  for (const std::string& arg : args) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Status::InvalidArgument(
          "plugstack.conf: '" + arg +
          "': write key=value (config, policy, rundir, on_refusal, "
          "launcher, nopfsd, timeout, grace, peer_key, peer_ports, peer_host, "
          "placement_key)");
    }
    const std::string key = arg.substr(0, eq);
    const std::string value = arg.substr(eq + 1);
    const std::string shown = "plugstack.conf: " + arg;
    NOPFS_RETURN_IF_ERROR(CheckText("--" + key + "=" + value, value, kMaxPath));
    auto path = [&](std::string* field, bool may_be_empty) -> Status {
      if (value.empty() ? !may_be_empty : value.front() != '/') {
        return Status::InvalidArgument(shown + ": write an absolute path");
      }
      *field = value;
      return Status::Ok();
    };
    if (key == "config") {
      NOPFS_RETURN_IF_ERROR(path(&out.config, true));
    } else if (key == "policy") {
      NOPFS_RETURN_IF_ERROR(path(&out.policy, true));
    } else if (key == "rundir") {
      NOPFS_RETURN_IF_ERROR(path(&out.rundir, false));
      while (out.rundir.size() > 1 && out.rundir.back() == '/')
        out.rundir.pop_back();
      if (out.rundir == "/") return Status::InvalidArgument(shown + ": not the root directory");
    } else if (key == "launcher") {
      NOPFS_RETURN_IF_ERROR(path(&out.launcher, false));
    } else if (key == "nopfsd") {
      NOPFS_RETURN_IF_ERROR(path(&out.nopfsd, false));
    } else if (key == "on_refusal") {
      if (value == "fail") {
        out.on_refusal = OnRefusal::kFail;
      } else if (value == "run") {
        out.on_refusal = OnRefusal::kRun;
      } else {
        return Status::InvalidArgument(shown + ": write on_refusal=fail or on_refusal=run");
      }
    } else if (key == "timeout" || key == "grace") {
      SPANK_ASSIGN_OR_RETURN(uint64_t v, ParseNumber(shown, value, 1, 86400, key + "=60"));
      (key == "timeout" ? out.timeout : out.grace) = static_cast<uint32_t>(v);
    } else if (key == "peer_key") {
      NOPFS_RETURN_IF_ERROR(path(&out.peer_key, true));
    } else if (key == "placement_key") {
      NOPFS_RETURN_IF_ERROR(path(&out.placement_key, true));
    } else if (key == "peer_ports") {
      SPANK_ASSIGN_OR_RETURN(out.peer_ports, ParsePortRanges(shown, value));
    } else if (key == "peer_port") {
      return Status::InvalidArgument(
          shown +
          ": peer_port= is gone: the peer ports are a range of privileged ports that only "
          "nopfsd can bind; write peer_ports=" +
          FormatPortRanges({kDefaultPeerPorts}) + " (docs/admin.md, \"Peers\")");
    } else if (key == "peer_host") {
      if (value.empty() || value.size() > 253 ||
          value.find_first_not_of(
              "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") !=
              std::string::npos ||
          value.front() == '-' || value.front() == '.') {
        return Status::InvalidArgument(shown +
                                       ": write a host name or IPv4 address, e.g. "
                                       "peer_host=127.0.0.1");
      }
      out.peer_host = value;
    } else {
      return Status::InvalidArgument(shown +
                                     ": unknown key; the keys are config, policy, rundir, "
                                     "on_refusal, launcher, nopfsd, timeout, grace, peer_key, "
                                     "peer_ports, peer_host, placement_key");
    }
  }
  return out;
}

std::vector<std::string> ToArgs(const PluginArgs& args) {
  std::vector<std::string> out;
  if (!args.config.empty()) out.push_back("config=" + args.config);
  if (!args.policy.empty()) out.push_back("policy=" + args.policy);
  out.push_back("rundir=" + args.rundir);
  out.push_back(std::string("on_refusal=") +
                (args.on_refusal == OnRefusal::kFail ? "fail" : "run"));
  if (!args.launcher.empty()) out.push_back("launcher=" + args.launcher);
  if (!args.nopfsd.empty()) out.push_back("nopfsd=" + args.nopfsd);
  out.push_back("timeout=" + std::to_string(args.timeout));
  out.push_back("grace=" + std::to_string(args.grace));
  if (!args.peer_key.empty()) out.push_back("peer_key=" + args.peer_key);
  out.push_back("peer_ports=" + FormatPortRanges(args.peer_ports));
  if (!args.peer_host.empty()) out.push_back("peer_host=" + args.peer_host);
  if (!args.placement_key.empty()) out.push_back("placement_key=" + args.placement_key);
  return out;
}

uint32_t PortCount(const std::vector<PortRange>& ranges) {
  uint32_t n = 0;
  for (const PortRange& r : ranges)
    n += uint32_t{r.high} - r.low + 1;
  return n;
}

uint16_t PeerPort(const std::vector<PortRange>& ranges, uint32_t offset, uint32_t node_index) {
  const uint32_t n = PortCount(ranges);
  if (n == 0) return 0;
  uint32_t k = static_cast<uint32_t>((uint64_t{offset} + node_index) % n);
  for (const PortRange& r : ranges) {
    const uint32_t size = uint32_t{r.high} - r.low + 1;
    if (k < size) return static_cast<uint16_t>(r.low + k);
    k -= size;
  }
  return 0;
}

std::string FormatPortRanges(const std::vector<PortRange>& ranges) {
  std::string out;
  for (const PortRange& r : ranges) {
    if (!out.empty()) out += ",";
    out += std::to_string(r.low);
    if (r.high != r.low) {
      out += '-';
      out += std::to_string(r.high);
    }
  }
  return out;
}

std::vector<std::string> PeerEndpoints(const PluginArgs& args,
                                       const std::vector<std::string>& nodes, uint32_t offset) {
  std::vector<std::string> out;
  out.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string& host = args.peer_host.empty() ? nodes[i] : args.peer_host;
    out.push_back(host + ":" +
                  std::to_string(PeerPort(args.peer_ports, offset, static_cast<uint32_t>(i))));
  }
  return out;
}

std::string RunDir(const std::string& rundir, std::string_view node, uint64_t job_id) {
  return rundir + "/" + std::string(node) + "/" + std::to_string(job_id);
}

Status CheckComponent(std::string_view what, std::string_view name) {
  if (name.empty() || name.size() > 255 || name.front() == '.') {
    return Status::InvalidArgument(std::string(what) + " '" + std::string(name.substr(0, 64)) +
                                   "' is empty, too long or starts with '.'");
  }
  for (char c : name) {
    if (!IsComponentChar(c)) {
      return Status::InvalidArgument(std::string(what) + " '" + std::string(name.substr(0, 64)) +
                                     "' has a character other than letters, digits, . _ -");
    }
  }
  return Status::Ok();
}

}  // namespace nopfs::spank
