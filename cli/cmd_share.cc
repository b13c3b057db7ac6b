#include "cli/cmd_share.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/dir_names.h"
#include "common/printable.h"
#include "common/units.h"
#include "share/client.h"

namespace nopfs::cli {
namespace {

struct ShareFlags {
  std::string dataset;
  std::string rundir = "/run/nopfs";
  std::string node;
  std::string socket;
};

int Fail(const std::string& msg) {
  std::fprintf(stderr, "nopfs share: %s\n", msg.c_str());
  return 2;
}

// Every regular file below `root`, relative to it, never through a link.
void Walk(const std::string& root, const std::string& rel, std::vector<std::string>* out,
          uint64_t* unreadable_dirs) {
  const std::string dir = rel.empty() ? root : root + "/" + rel;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    ++*unreadable_dirs;
    return;
  }
  Result<std::vector<std::string>> names = DirNames(fd, dir);
  if (!names.ok()) {
    ::close(fd);
    ++*unreadable_dirs;
    return;
  }
  for (const std::string& n : *names) {
    struct stat st {};
    if (::fstatat(fd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const std::string r = rel.empty() ? n : rel + "/" + n;
    if (S_ISDIR(st.st_mode)) {
      Walk(root, r, out, unreadable_dirs);
    } else if (S_ISREG(st.st_mode)) {
      out->push_back(r);
    }
  }
  ::close(fd);
}

int RunWarm(ShareFlags f) {
  while (f.dataset.size() > 1 && f.dataset.back() == '/')
    f.dataset.pop_back();
  if (f.dataset.empty() || f.dataset.front() != '/') {
    return Fail(
        "give the dataset's absolute directory, as the node config's shared = { ... } "
        "names it");
  }
  if (f.socket.empty()) {
    if (f.node.empty()) {
      char host[256] = {};
      if (::gethostname(host, sizeof host - 1) == 0) f.node = host;
      f.node = f.node.substr(0, f.node.find('.'));
    }
    f.socket = f.rundir + "/" + f.node + "/share/socket";
  }
  share::ShareClient client(f.socket, f.dataset, std::chrono::minutes(5));
  if (Status s = client.Ping(); !s.ok()) {
    return Fail(
        s.message() +
        "; the node's share service runs while jobs use a shared dataset (a job's prolog "
        "starts it), or start it as root: systemctl start nopfs-share (the package's unit), "
        "or nopfs-job share-serve --config=NODE_CONFIG "
        "--dir=" +
        f.rundir + "/" + f.node + "/share --node=" + f.node);
  }
  std::vector<std::string> files;
  uint64_t unreadable_dirs = 0;
  Walk(f.dataset, "", &files, &unreadable_dirs);
  uint64_t ready = 0, bytes = 0, denied = 0, not_stored = 0, busy = 0;
  for (size_t i = 0; i < files.size(); i += share::kMaxBatch) {
    const size_t n = std::min<size_t>(share::kMaxBatch, files.size() - i);
    Result<std::vector<share::ShareClient::Copy>> got =
        client.Ask(share::Op::kWarm, std::span(files).subspan(i, n));
    if (!got.ok()) return Fail(got.status().message());
    for (const share::ShareClient::Copy& c : *got) {
      switch (c.outcome) {
        case share::Outcome::kReady:
          ++ready;
          bytes += c.size;
          break;
        case share::Outcome::kDenied:
          ++denied;
          break;
        case share::Outcome::kNotStored:
          ++not_stored;
          break;
        case share::Outcome::kBusy:
          ++busy;
          break;
      }
    }
  }
  std::printf("nopfs share warm %s: %llu files in the copy (%s)", Printable(f.dataset).c_str(),
              static_cast<unsigned long long>(ready),
              FormatBytes(static_cast<double>(bytes)).c_str());
  if (denied != 0 || unreadable_dirs != 0) {
    std::printf("; %llu files and %llu directories you cannot read were left out",
                static_cast<unsigned long long>(denied),
                static_cast<unsigned long long>(unreadable_dirs));
  }
  if (not_stored != 0) {
    std::printf("; %llu not stored (over the dataset's ssd quota, or changed while read)",
                static_cast<unsigned long long>(not_stored));
  }
  if (busy != 0) {
    std::printf("; %llu being filled by a job", static_cast<unsigned long long>(busy));
  }
  std::printf("\n");
  return not_stored != 0 ? 1 : 0;
}

}  // namespace

void RegisterShare(CLI::App* app, int* exit_code) {
  CLI::App* share = app->add_subcommand(
      "share", "The node's shared copies of the datasets the node config declares shared");
  share->require_subcommand(1);
  auto f = std::make_shared<ShareFlags>();
  CLI::App* warm = share->add_subcommand(
      "warm",
      "Fill this node's shared copy of DATASET ahead of the jobs: every file you can read is "
      "read from the PFS by the share service, once");
  warm->add_option("DATASET", f->dataset, "The shared dataset's directory")->required();
  warm->add_option("--rundir", f->rundir, "The plugin's rundir= (its socket is below)")
      ->capture_default_str();
  warm->add_option("--node", f->node, "This node's Slurm name (default: hostname)");
  warm->add_option("--socket", f->socket, "The share service's socket (default: from the above)");
  warm->callback([f, exit_code] { *exit_code = RunWarm(*f); });
}

}  // namespace nopfs::cli
