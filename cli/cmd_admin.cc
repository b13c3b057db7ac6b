#include "cli/cmd_admin.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/small_file.h"
#include "common/version.h"
#include "lua/config.h"

namespace nopfs::cli {
namespace {

struct AdminFlags {
  std::string plugstack_dir = NOPFS_INSTALLED_PLUGSTACK_DIR;
  std::string line_file = NOPFS_INSTALLED_PLUGSTACK_LINE;
  std::string slurm_conf;  // default: $SLURM_CONF, else /etc/slurm/slurm.conf
  bool force = false;
};

constexpr const char* kEnabledName = "nopfs.conf";
constexpr const char* kDisabledName = "nopfs.conf.disabled";

std::string Enabled(const AdminFlags& f) {
  return f.plugstack_dir + "/" + kEnabledName;
}
std::string Disabled(const AdminFlags& f) {
  return f.plugstack_dir + "/" + kDisabledName;
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

Result<std::string> ReadText(const std::string& path) {
  SmallFileRules rules;
  rules.max_bytes = 1 << 20;
  return ReadSmallFile(path, rules);
}

// The plugin's line of a plugstack file: its words ("optional", the plugin's path, key=value...).
std::vector<std::string> PluginLine(const std::string& text) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;)
      w.push_back(x);
    if (w.size() >= 2 && (w[0] == "optional" || w[0] == "required") && w[1][0] != '#') return w;
  }
  return {};
}

std::string Arg(const std::vector<std::string>& line, const std::string& key) {
  for (size_t i = 2; i < line.size(); ++i) {
    if (line[i].rfind(key + "=", 0) == 0) return line[i].substr(key.size() + 1);
  }
  return "";
}

std::string Lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Slurm reads includes this deep at most here; deeper is taken for a loop.
constexpr int kMaxIncludeDepth = 16;

struct ConfRead {
  std::string prolog_flags;
  std::string cluster_name;  // for %c in an Include
  std::string error;         // the first file that could not be read, and why
};

// Reads one slurm.conf file into `r` by Slurm's rules: keys are case-insensitive, '#' starts a
// comment, the last assignment wins, and a line `Include FILE` reads FILE in its place (a
// relative name from slurm.conf's directory, %c the ClusterName so far).
void ReadConf(const std::string& path, const std::string& dir, int depth, ConfRead* r) {
  if (depth > kMaxIncludeDepth) {
    r->error = path + ": included more than " + std::to_string(kMaxIncludeDepth) +
               " deep (an Include loop?)";
    return;
  }
  std::ifstream in(path);
  if (!in) {
    r->error = path + ": cannot be read";
    return;
  }
  for (std::string line; std::getline(in, line) && r->error.empty();) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string first;
    if (!(words >> first)) continue;
    if (Lower(first) == "include" && first.find('=') == std::string::npos) {
      std::string name;
      std::getline(words >> std::ws, name);
      while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back())))
        name.pop_back();
      for (size_t at = name.find("%c"); at != std::string::npos; at = name.find("%c", at))
        name.replace(at, 2, r->cluster_name);
      if (name.empty()) continue;
      ReadConf(name[0] == '/' ? name : dir + "/" + name, dir, depth + 1, r);
      continue;
    }
    for (std::string w = first;;) {
      const size_t eq = w.find('=');
      if (eq != std::string::npos) {
        const std::string key = Lower(w.substr(0, eq));
        if (key == "prologflags") r->prolog_flags = w.substr(eq + 1);
        if (key == "clustername") r->cluster_name = w.substr(eq + 1);
      }
      if (!(words >> w)) break;
    }
  }
}

// slurm.conf's PrologFlags with its includes read; an error names the file that cannot be read.
Result<std::string> PrologFlags(const std::string& slurm_conf) {
  const size_t slash = slurm_conf.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slurm_conf.substr(0, slash);
  ConfRead r;
  ReadConf(slurm_conf, slash == 0 ? "/" : dir, 0, &r);
  if (!r.error.empty()) return Status::NotFound(r.error);
  return r.prolog_flags;
}

bool HasFlag(const std::string& flags, const std::string& flag) {
  return Lower("," + flags + ",").find("," + flag + ",") != std::string::npos;
}

// What the plugin's line needs; each problem with what to do about it.
std::vector<std::string> Check(const AdminFlags& f, const std::vector<std::string>& line,
                               std::vector<std::string>* notes) {
  std::vector<std::string> missing;
  if (line.empty()) {
    missing.push_back("the plugin's line: none in " + f.line_file +
                      " (reinstall the package, or give --line FILE)");
    return missing;
  }
  if (::access(line[1].c_str(), R_OK) != 0) {
    missing.push_back("the plugin " + line[1] + ": not there (reinstall the package)");
  }
  if (const std::string config = Arg(line, "config"); !config.empty()) {
    if (Result<lua::NodeConfig> c = lua::LoadNodeConfig(config); !c.ok()) {
      missing.push_back("the node config: " + c.status().message() + " (fix it; `nopfs config " +
                        config + "` shows what it gives)");
    }
  }
  if (const std::string policy = Arg(line, "policy");
      !policy.empty() && ::access(policy.c_str(), R_OK) != 0) {
    missing.push_back("the policy " + policy + ": cannot be read");
  }
  const std::string conf = f.slurm_conf.empty()
                               ? (std::getenv("SLURM_CONF") != nullptr ? std::getenv("SLURM_CONF")
                                                                       : "/etc/slurm/slurm.conf")
                               : f.slurm_conf;
  const Result<std::string> flags = PrologFlags(conf);
  if (!flags.ok()) {
    missing.push_back(flags.status().message() + " (give slurm.conf with --slurm-conf FILE)");
  } else if (!HasFlag(*flags, "alloc") && !HasFlag(*flags, "contain")) {
    missing.push_back("PrologFlags=Alloc in " + conf +
                      " (merge /usr/share/doc/nopfs/examples/slurm.conf.fragment; without it "
                      "the prolog runs only on the nodes a step touches)");
  }
  if (const std::string key = Arg(line, "peer_key"); key.empty()) {
    notes->push_back(
        "no peer_key= in the line: the nodes of a job will not serve each other (docs: "
        "\"Peers\" in /usr/share/doc/nopfs/docs/admin.md)");
  } else {
    struct stat st {};
    if (::stat(key.c_str(), &st) != 0) {
      missing.push_back("the peer key " + key +
                        ": not there (umask 077; head -c 32 /dev/urandom > " + key +
                        ", the same file on every node)");
    } else if (st.st_uid != 0 || (st.st_mode & 077) != 0) {
      missing.push_back("the peer key " + key + ": must be root's and mode 0600");
    }
  }
  return missing;
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "nopfs admin: %s\n", msg.c_str());
  return 2;
}

Status WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, tmp);
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = written ? errno : err;
    ::unlink(tmp.c_str());
    return Status::FromErrno(e, "writing " + path);
  }
  return Status::Ok();
}

// The line `enable` would write: the admin's from before `disable`, else the package's.
std::string Source(const AdminFlags& f) {
  return Exists(Disabled(f)) ? Disabled(f) : f.line_file;
}

int RunStatus(const AdminFlags& f) {
  const bool on = Exists(Enabled(f));
  const std::string from = on ? Enabled(f) : Source(f);
  Result<std::string> text = ReadText(from);
  std::printf("nopfs %s: %s (%s)\n", kVersion, on ? "enabled" : "disabled",
              on ? Enabled(f).c_str() : ("nopfs admin enable writes " + Enabled(f)).c_str());
  std::vector<std::string> notes;
  const std::vector<std::string> missing =
      Check(f, text.ok() ? PluginLine(*text) : std::vector<std::string>{}, &notes);
  for (const std::string& m : missing)
    std::printf("missing: %s\n", m.c_str());
  for (const std::string& n : notes)
    std::printf("note: %s\n", n.c_str());
  return 0;
}

int RunEnable(const AdminFlags& f) {
  if (::geteuid() != 0) return Fail("run it as root (it writes Slurm's configuration)");
  const std::string from = Source(f);
  Result<std::string> text = ReadText(from);
  if (!text.ok()) return Fail(text.status().message());
  std::vector<std::string> notes;
  const std::vector<std::string> missing = Check(f, PluginLine(*text), &notes);
  for (const std::string& m : missing)
    std::fprintf(stderr, "nopfs admin: missing: %s\n", m.c_str());
  for (const std::string& n : notes)
    std::printf("note: %s\n", n.c_str());
  if (!missing.empty() && !f.force) {
    return Fail("not enabled: " + std::to_string(missing.size()) +
                " missing (above); fix them, or give --force");
  }
  if (Status s = WriteAtomically(Enabled(f), *text); !s.ok()) return Fail(s.message());
  if (from == Disabled(f)) ::unlink(Disabled(f).c_str());
  std::printf(
      "enabled: %s (from %s); restart slurmd on this node (slurmd decides at its start whether "
      "it runs the plugin's prolog), and enable every node and submit host the same way\n",
      Enabled(f).c_str(), from.c_str());
  return 0;
}

int RunDisable(const AdminFlags& f) {
  if (::geteuid() != 0) return Fail("run it as root (it writes Slurm's configuration)");
  if (!Exists(Enabled(f))) {
    std::printf("disabled already: no %s\n", Enabled(f).c_str());
    return 0;
  }
  if (::rename(Enabled(f).c_str(), Disabled(f).c_str()) != 0) {
    return Fail(Status::FromErrno(errno, "renaming " + Enabled(f)).message());
  }
  std::printf(
      "disabled: %s moved to %s (nopfs admin enable puts it back); jobs submitted from "
      "now on have no --nopfs option; restart slurmd to unload the plugin\n",
      Enabled(f).c_str(), Disabled(f).c_str());
  return 0;
}

// What nopfs keeps on this node, as `<kind>\t<dir>[\t<pattern>]` lines: `tree DIR` (nopfs's own
// directory), `entries DIR PATTERN` (nopfs's entries in a directory that may hold others').
int RunState(const AdminFlags& f) {
  std::string from = Exists(Enabled(f)) ? Enabled(f) : Source(f);
  Result<std::string> text = ReadText(from);
  const std::vector<std::string> line = text.ok() ? PluginLine(*text) : std::vector<std::string>{};
  std::string rundir = line.empty() ? "" : Arg(line, "rundir");
  if (rundir.empty()) rundir = "/run/nopfs";
  std::printf("tree\t%s\n", rundir.c_str());
  const std::string config_path = line.empty() ? "" : Arg(line, "config");
  if (config_path.empty()) return 0;
  Result<lua::NodeConfig> config = lua::LoadNodeConfig(config_path);
  if (!config.ok()) return Fail(config.status().message());
  for (const policy::StorageClass& c : config->model().classes) {
    if (c.kind == policy::ClassKind::kSsd && !c.path.empty())
      std::printf("entries\t%s\tnopfs-[0-9]*\n", c.path.c_str());
  }
  if (!config->catalog_cache().empty())
    std::printf("entries\t%s\t[0-9]*\n", config->catalog_cache().c_str());
  if (!config->metrics_dir().empty())
    std::printf("entries\t%s\tnopfs_*.prom\n", config->metrics_dir().c_str());
  return 0;
}

}  // namespace

void RegisterAdmin(CLI::App* app, int* exit_code) {
  auto f = std::make_shared<AdminFlags>();
  CLI::App* admin =
      app->add_subcommand("admin", "As root: enable or disable the Slurm plugin on this node");
  admin->require_subcommand(1);
  auto common = [f](CLI::App* sub) {
    sub->add_option("--plugstack-dir", f->plugstack_dir,
                    "Slurm's plugstack.conf.d (plugstack.conf includes its *.conf)")
        ->capture_default_str();
    sub->add_option("--line", f->line_file, "The package's plugin line")->capture_default_str();
    sub->add_option("--slurm-conf", f->slurm_conf,
                    "slurm.conf to check (default: $SLURM_CONF, else /etc/slurm/slurm.conf)");
  };
  CLI::App* enable = admin->add_subcommand(
      "enable",
      "Check what the plugin needs and, when nothing is missing, write its line to "
      "plugstack.conf.d");
  common(enable);
  enable->add_flag("--force", f->force, "Write the line even with something missing");
  enable->callback([f, exit_code] { *exit_code = RunEnable(*f); });
  CLI::App* disable = admin->add_subcommand(
      "disable", "Move the plugin's line aside (nopfs.conf.disabled), keeping its edits");
  common(disable);
  disable->callback([f, exit_code] { *exit_code = RunDisable(*f); });
  CLI::App* status = admin->add_subcommand("status",
                                           "Whether the plugin is enabled, and what "
                                           "it still needs");
  common(status);
  status->callback([f, exit_code] { *exit_code = RunStatus(*f); });
  CLI::App* state = admin->add_subcommand(
      "state", "List where nopfs keeps state on this node (what the package's purge removes)");
  common(state);
  state->callback([f, exit_code] { *exit_code = RunState(*f); });
}

}  // namespace nopfs::cli
