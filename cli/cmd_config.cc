#include "cli/cmd_config.h"

#include <sys/stat.h>

#include <cstdio>
#include <memory>
#include <string>

#include "common/units.h"
#include "lua/admit.h"
#include "lua/config.h"

namespace nopfs::cli {
namespace {

struct ConfigFlags {
  std::string config;
  std::string policy;
  std::string user = "nobody";
  uint32_t uid = 65534;
  std::string account;
  std::string partition;
  std::string qos;
  std::string node = "localhost";
  uint32_t nodes = 1;
  std::string ram = "0";
  std::string ssd = "0";
  std::string memory;  // the job's memory on the node, as Slurm's --mem
  std::string ram_reserved = "0";
  std::string ssd_reserved = "0";
  uint32_t jobs = 0;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "nopfs config: %s\n", s.message().c_str());
  return 2;
}

std::string Table(const policy::BandwidthTable& t) {
  if (t.empty()) return "-";
  std::string out;
  for (const auto& [x, y] : t.points()) {
    if (!out.empty()) out += ", ";
    out += std::to_string(static_cast<long long>(x)) + ":" + FormatBytes(y) + "/s";
  }
  return out;
}

int RunConfig(const ConfigFlags& f) {
  Result<lua::NodeConfig> config = lua::LoadNodeConfig(f.config);
  if (!config.ok()) return Fail(config.status());
  const policy::SystemModel& m = config->model();
  std::printf("config: %s\n", config->source().c_str());
  std::printf("log_level: %s\n", config->log_level().c_str());
  std::printf("catalog_cache: %s\n", config->catalog_cache().empty()
                                         ? "(none: catalogs are not reused)"
                                         : config->catalog_cache().c_str());
  std::printf("pfs: %s\n", Table(m.pfs).c_str());
  std::printf("network: %s\n", m.network_bandwidth > 0
                                   ? (FormatBytes(m.network_bandwidth) + "/s").c_str()
                                   : "none (peers are never read)");
  std::printf("staging: %s, %u threads, write %s\n",
              FormatBytes(static_cast<double>(m.staging.capacity)).c_str(), m.staging.threads,
              Table(m.staging.write).c_str());
  if (m.classes.empty()) std::printf("classes: none (every read goes to the PFS)\n");
  for (const policy::StorageClass& c : m.classes) {
    std::printf("class %s: %s%s%s, %s, %u threads, read %s, write %s\n", c.name.c_str(),
                c.kind == policy::ClassKind::kRam ? "ram" : "ssd", c.path.empty() ? "" : " at ",
                c.path.c_str(), FormatBytes(static_cast<double>(c.capacity)).c_str(), c.threads,
                Table(c.read).c_str(), Table(c.write).c_str());
    struct stat st {};
    if (!c.path.empty() && (::stat(c.path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
      std::fprintf(stderr,
                   "nopfs config: warning: class %s: %s is not a directory on this machine; "
                   "jobs here get no %s tier until it is\n",
                   c.name.c_str(), c.path.c_str(), c.name.c_str());
    }
  }
  const lua::Limits& l = config->limits();
  auto cap = [](policy::Bytes b) {
    return b == 0 ? std::string("none") : FormatBytes(static_cast<double>(b));
  };
  std::printf("limits: jobs_per_node %s, ram_per_job %s, ssd_per_job %s\n",
              l.jobs_per_node == 0 ? "none" : std::to_string(l.jobs_per_node).c_str(),
              cap(l.ram_per_job).c_str(), cap(l.ssd_per_job).c_str());
  if (!config->job_log_dir().empty()) {
    std::printf("job_logs: %s, kept %u days\n", config->job_log_dir().c_str(),
                config->job_log_days());
  }
  if (f.policy.empty()) return 0;

  lua::JobRequest job;
  job.uid = f.uid;
  job.user = f.user;
  job.account = f.account;
  job.partition = f.partition;
  job.qos = f.qos;
  job.nodes = f.nodes;
  if (!f.memory.empty()) {
    Result<uint64_t> mem = ParseSize(f.memory);
    if (!mem.ok()) return Fail(mem.status().WithContext("--memory"));
    job.memory = *mem;
  }
  lua::NodeState node;
  node.name = f.node;
  node.ram_total = config->CapacityOf(policy::ClassKind::kRam);
  node.ssd_total = config->SsdForJobs();
  node.jobs = f.jobs;
  struct Size {
    const char* flag;
    const std::string& text;
    policy::Bytes* out;
  };
  for (const Size& s : {Size{"--ram", f.ram, &job.ram}, Size{"--ssd", f.ssd, &job.ssd},
                        Size{"--ram-reserved", f.ram_reserved, &node.ram_reserved},
                        Size{"--ssd-reserved", f.ssd_reserved, &node.ssd_reserved}}) {
    Result<uint64_t> v = ParseSize(s.text);
    if (!v.ok()) return Fail(v.status().WithContext(s.flag));
    *s.out = *v;
  }
  Result<lua::Admission> a = lua::Admit(f.policy, *config, job, node);
  if (!a.ok()) return Fail(a.status());
  if (!a->admitted) {
    std::printf("admit: refused: %s\n", a->reason.c_str());
    return 1;
  }
  std::printf("admit: ram %s, ssd %s%s%s\n", FormatBytes(static_cast<double>(a->ram)).c_str(),
              FormatBytes(static_cast<double>(a->ssd)).c_str(), a->reason.empty() ? "" : " (",
              a->reason.empty() ? "" : (a->reason + ")").c_str());
  lua::KeepUser user;
  user.uid = f.uid;
  user.name = f.user;
  Result<lua::KeepGrant> k = lua::Keep(f.policy, *config, user, node);
  if (!k.ok()) return Fail(k.status());
  if (k->quota == 0) {
    std::printf("keep: nothing (the policy's keep(user, node) grants no quota)\n");
  } else {
    std::printf("keep: quota %s per node, lifetime %s\n",
                FormatBytes(static_cast<double>(k->quota)).c_str(),
                k->lifetime == 0 ? "none (until quota or space evicts)"
                                 : (std::to_string(k->lifetime) + " s after the last use").c_str());
  }
  return 0;
}

}  // namespace

void RegisterConfig(CLI::App* app, int* exit_code) {
  auto f = std::make_shared<ConfigFlags>();
  CLI::App* sub = app->add_subcommand(
      "config",
      "Check a node config (Lua) and print what it resolves to; with --policy, ask the "
      "admission policy about a job");
  sub->add_option("file", f->config, "The node config, e.g. /etc/nopfs/nopfs.conf.lua")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--policy", f->policy, "The admission policy (Lua) to ask")
      ->check(CLI::ExistingFile);
  CLI::Option_group* job = sub->add_option_group("job", "The job to ask the policy about");
  job->add_option("--user", f->user, "The job's user")->capture_default_str();
  job->add_option("--uid", f->uid, "The job's uid")->capture_default_str();
  job->add_option("--account", f->account, "The job's account");
  job->add_option("--partition", f->partition, "The job's partition");
  job->add_option("--qos", f->qos, "The job's QOS");
  job->add_option("--nodes", f->nodes, "Nodes in the allocation")->capture_default_str();
  job->add_option("--ram", f->ram, "RAM the job asks for, as --nopfs-ram (0: as much as allowed)")
      ->capture_default_str();
  job->add_option("--ssd", f->ssd, "SSD the job asks for, as --nopfs-ssd (0: as much as allowed)")
      ->capture_default_str();
  job->add_option("--memory", f->memory,
                  "The job's memory on the node, as Slurm's --mem (default: none, as a job "
                  "without --mem)");
  job->add_option("--node", f->node, "The node's name")->capture_default_str();
  job->add_option("--ram-reserved", f->ram_reserved, "RAM other jobs hold on the node")
      ->capture_default_str();
  job->add_option("--ssd-reserved", f->ssd_reserved, "SSD other jobs hold on the node")
      ->capture_default_str();
  job->add_option("--jobs", f->jobs, "nopfs jobs already on the node")->capture_default_str();
  sub->callback([f, exit_code] { *exit_code = RunConfig(*f); });
}

}  // namespace nopfs::cli
