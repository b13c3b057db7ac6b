#include "cli/cmd_cache.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "common/printable.h"
#include "common/units.h"
#include "kept/space.h"
#include "lua/config.h"

namespace nopfs::cli {
namespace {

struct CacheFlags {
  std::string config = NOPFS_INSTALLED_CONFIG;
  bool json = false;
  bool all = false;
  std::vector<std::string> keys;
};

int Fail(const std::string& what, const std::string& msg) {
  std::fprintf(stderr, "nopfs cache %s: %s\n", what.c_str(), msg.c_str());
  return 2;
}

Result<kept::KeptNode> Mine(const std::string& config_path) {
  Result<lua::NodeConfig> config = lua::LoadNodeConfig(config_path);
  if (!config.ok()) {
    return Status(config.status().code(),
                  config.status().message() + " (give the node's config with --config FILE)");
  }
  std::vector<std::string> paths;
  for (const policy::StorageClass& c : config->model().classes) {
    if (c.kind == policy::ClassKind::kSsd && !c.path.empty()) paths.push_back(c.path);
  }
  return kept::KeptNode::Scan(paths, ::getuid());
}

int List(const CacheFlags& f) {
  Result<kept::KeptNode> node = Mine(f.config);
  if (!node.ok()) return Fail("ls", node.status().message());
  for (const std::string& e : node->errors())
    std::fprintf(stderr, "nopfs cache ls: %s\n", e.c_str());
  const int64_t now = ::time(nullptr);
  if (f.json) {
    Json list = Json::array();
    for (const kept::KeptEntry& e : node->entries()) {
      const kept::KeptDataset& d = e.data;
      list.push_back({{"key", JsonBytes(d.key)},
                      {"dataset", JsonBytes(d.dataset)},
                      {"bytes", d.bytes},
                      {"samples", d.samples},
                      {"created", d.created},
                      {"last_used", d.last_used},
                      {"complete", d.complete},
                      {"dir", JsonBytes(d.dir)}});
    }
    std::printf("%s\n", DumpJson(list, 2).c_str());
    return 0;
  }
  if (node->entries().empty()) {
    std::printf("no kept datasets on this machine\n");
    return 0;
  }
  std::printf("%-16s  %10s  %9s  %5s  %9s  %s\n", "KEY", "SIZE", "SAMPLES", "AGE", "LAST USE",
              "DATASET");
  for (const kept::KeptEntry& e : node->entries()) {
    const kept::KeptDataset& d = e.data;
    if (d.complete) {
      std::printf(
          "%-16s  %10s  %9llu  %5s  %9s  %s\n", Printable(d.key).c_str(),
          FormatBytes(static_cast<double>(d.bytes)).c_str(),
          static_cast<unsigned long long>(d.samples), kept::FormatAge(now - d.created).c_str(),
          (kept::FormatAge(now - d.last_used) + " ago").c_str(), Printable(d.dataset).c_str());
    } else {
      std::printf("%-16s  %10s  %9s  %5s  %9s  %s\n", Printable(d.key).c_str(),
                  FormatBytes(static_cast<double>(d.bytes)).c_str(), "-", "-", "-",
                  e.Pending() ? "(being kept or adopted)" : "(incomplete: never used)");
    }
  }
  std::printf(
      "AGE and LAST USE as each MANIFEST says; the site's lifetime and eviction order go by "
      "root's own record of when your jobs last used each one\n");
  return 0;
}

int Remove(const CacheFlags& f) {
  if (f.all == !f.keys.empty()) {
    return Fail("rm", "give the keys to remove (as nopfs cache ls shows them) or --all");
  }
  Result<kept::KeptNode> node = Mine(f.config);
  if (!node.ok()) return Fail("rm", node.status().message());
  std::vector<kept::KeptEntry> doomed;
  for (const kept::KeptEntry& e : node->entries()) {
    bool asked = f.all;
    for (const std::string& k : f.keys)
      asked = asked || k == e.data.key;
    if (asked) doomed.push_back(e);
  }
  int rc = 0;
  for (const std::string& k : f.keys) {
    bool found = false;
    for (const kept::KeptEntry& e : doomed)
      found = found || e.data.key == k;
    if (!found) {
      std::fprintf(stderr, "nopfs cache rm: %s: no such kept dataset here (nopfs cache ls)\n",
                   Printable(k).c_str());
      rc = 1;
    }
  }
  for (const kept::KeptEntry& e : doomed) {
    const kept::Removal r = node->Remove(e, "asked");
    if (!r.status.ok()) {
      std::fprintf(stderr, "nopfs cache rm: %s\n", r.status.message().c_str());
      rc = 1;
      continue;
    }
    std::printf("removed %s (%s, %s)\n", Printable(e.data.key).c_str(),
                FormatBytes(static_cast<double>(e.data.bytes)).c_str(),
                e.data.dataset.empty() ? "incomplete" : Printable(e.data.dataset).c_str());
  }
  return rc;
}

}  // namespace

void RegisterCache(CLI::App* app, int* exit_code) {
  auto f = std::make_shared<CacheFlags>();
  CLI::App* sub = app->add_subcommand(
      "cache", "Your datasets kept on this machine's SSD for your next job (list, remove)");
  sub->require_subcommand(1);
  CLI::App* ls = sub->add_subcommand("ls", "List your kept datasets on this machine");
  CLI::App* rm = sub->add_subcommand("rm", "Remove kept datasets of yours on this machine");
  for (CLI::App* s : {ls, rm}) {
    s->add_option("--config", f->config, "The node config (its SSD classes hold the kept area)")
        ->capture_default_str();
  }
  ls->add_flag("--json", f->json, "One JSON array of objects (for programs)");
  rm->add_option("key", f->keys, "Keys to remove, as nopfs cache ls shows them");
  rm->add_flag("--all", f->all, "Remove every kept dataset of yours on this machine");
  ls->callback([f, exit_code] { *exit_code = List(*f); });
  rm->callback([f, exit_code] { *exit_code = Remove(*f); });
}

}  // namespace nopfs::cli
