#include "cli/cmd_gc.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "common/printable.h"
#include "common/units.h"
#include "kept/space.h"
#include "lua/admit.h"
#include "lua/config.h"

namespace nopfs::cli {
namespace {

struct GcFlags {
  std::string config = NOPFS_INSTALLED_CONFIG;
  std::string policy = NOPFS_INSTALLED_POLICY;
  std::string node;
  bool quiet = false;
};

int Fail(const std::string& msg) {
  std::fprintf(stderr, "nopfs gc: %s\n", msg.c_str());
  return 2;
}

int RunGc(GcFlags f) {
  if (::geteuid() != 0) {
    return Fail(
        "run it as root (it looks at every user's kept datasets); to remove your own, "
        "use nopfs cache rm");
  }
  if (::access(f.policy.c_str(), R_OK) != 0) {
    return Fail("policy " + f.policy +
                ": cannot be read; give the policy of the plugin's plugstack.conf line with "
                "--policy FILE (without a keep function in it, nothing is kept)");
  }
  Result<lua::NodeConfig> config = lua::LoadNodeConfig(f.config);
  if (!config.ok()) return Fail(config.status().message() + " (give it with --config FILE)");
  if (f.node.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) f.node = host;
    f.node = f.node.substr(0, f.node.find('.'));
  }
  std::vector<std::string> paths;
  for (const policy::StorageClass& c : config->model().classes) {
    if (c.kind == policy::ClassKind::kSsd && !c.path.empty()) paths.push_back(c.path);
  }
  // Root's view (kept/space.h): everything in every nopfs-<uid>/, with root's own record of
  // times (datasets root has not seen before are recorded as first seen now, so that a node
  // where only gc runs still ages them). The ledger is not read here: a running job's directory
  // is in use (its lock is held) and left alone, counted among the held bytes.
  kept::ScanOptions scan;
  scan.root = true;
  kept::KeptNode kept = kept::KeptNode::Scan(paths, scan);
  lua::NodeState ns;
  ns.name = f.node;
  ns.ram_total = config->CapacityOf(policy::ClassKind::kRam);
  ns.ssd_total = config->SsdForJobs();
  ns.ssd_kept = kept.Bytes() - kept.HeldBytes();
  ns.ssd_reserved = kept.HeldBytes();
  lua::KeepGrants grants(f.policy, *config, ns);
  const std::vector<kept::Removal> removed = kept.Sweep(
      [&](uint32_t uid) {
        const lua::KeepGrant g = grants.For(uid);
        return kept::KeepLimits{g.quota, g.lifetime};
      },
      ::time(nullptr));
  int rc = 0;
  for (const std::string& e : kept.errors()) {
    std::fprintf(stderr, "nopfs gc: %s\n", e.c_str());
    rc = 1;
  }
  for (const std::string& e : grants.errors()) {
    std::fprintf(stderr, "nopfs gc: %s (that user's datasets are left alone)\n", e.c_str());
    rc = 1;
  }
  for (const kept::Removal& r : removed) {
    if (!r.status.ok()) rc = 1;
    std::printf("%s %s (uid %u, %s, %s)%s%s\n", r.status.ok() ? "removed" : "could not remove",
                Printable(r.entry.data.dir).c_str(), r.entry.uid,
                FormatBytes(static_cast<double>(r.entry.data.bytes)).c_str(), r.why.c_str(),
                r.status.ok() ? "" : ": ",
                r.status.ok() ? "" : Printable(r.status.message()).c_str());
  }
  if (!f.quiet) {
    std::printf("kept on %s: %zu entries, %s, of %zu users\n", f.node.c_str(),
                kept.entries().size(), FormatBytes(static_cast<double>(kept.Bytes())).c_str(),
                kept.Users().size());
  }
  return rc;
}

}  // namespace

void RegisterGc(CLI::App* app, int* exit_code) {
  auto f = std::make_shared<GcFlags>();
  CLI::App* sub = app->add_subcommand(
      "gc",
      "As root: remove expired, over-quota and incomplete kept datasets of every user on this "
      "node, by the policy's keep rules");
  sub->add_option("--config", f->config, "The node config (its SSD classes hold the kept areas)")
      ->capture_default_str();
  sub->add_option("--policy", f->policy, "The policy whose keep(user, node) sets the rules")
      ->capture_default_str();
  sub->add_option("--node", f->node, "The node's name as the policy sees it (default: hostname)");
  sub->add_flag("-q,--quiet", f->quiet, "Print only what was removed");
  sub->callback([f, exit_code] { *exit_code = RunGc(*f); });
}

}  // namespace nopfs::cli
