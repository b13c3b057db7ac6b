// What nopfs-job learns about the job beyond its command line: its nodes and tasks from slurmctld,
// the ranks per node it runs, and its peers' secret and ports (derived from the site's key and
// the job, so that no other job can guess them).
#include "spank/launcher.h"

namespace nopfs::spank::launcher {

using namespace std::chrono_literals;

SlurmJob QuerySlurm(uint64_t job_id, const std::string& node) {
  SlurmJob out;
  // libslurm exits the process when it finds no configuration: ask only when there is one.
  const char* conf = std::getenv("SLURM_CONF");
  if ((conf == nullptr || ::access(conf, R_OK) != 0) &&
      ::access("/etc/slurm/slurm.conf", R_OK) != 0) {
    return out;
  }
  job_info_msg_t* msg = nullptr;
  if (slurm_load_job(&msg, static_cast<uint32_t>(job_id), SHOW_DETAIL) != SLURM_SUCCESS) {
    // A purged job is gone; any other error (controller unreachable) counts as alive, so that
    // a reservation is never released on a guess.
    out.active = slurm_get_errno() != ESLURM_INVALID_JOB_ID;
    return out;
  }
  if (msg != nullptr && msg->record_count > 0) {
    const slurm_job_info_t& j = msg->job_array[0];
    out.known = true;
    const uint32_t base = j.job_state & JOB_STATE_BASE;
    out.active = base == JOB_PENDING || base == JOB_RUNNING || base == JOB_SUSPENDED ||
                 (j.job_state & JOB_COMPLETING) != 0;
    if (j.account != nullptr) out.account = j.account;
    if (j.partition != nullptr) out.partition = j.partition;
    if (j.qos != nullptr) out.qos = j.qos;
    if (j.prefer != nullptr) out.prefer = j.prefer;
    if (j.features != nullptr) out.features = j.features;
    if (j.req_nodes != nullptr) out.req_nodes = j.req_nodes;
    if (j.admin_comment != nullptr) out.admin_comment = j.admin_comment;
    uint64_t mb = j.pn_min_memory;
    if ((mb & MEM_PER_CPU) != 0) {
      mb &= ~MEM_PER_CPU;
      int cpus = j.job_resrcs != nullptr
                     ? slurm_job_cpus_allocated_on_node(j.job_resrcs, node.c_str())
                     : 0;
      if (cpus <= 0 && j.num_nodes != 0) cpus = static_cast<int>(j.num_cpus / j.num_nodes);
      mb *= static_cast<uint64_t>(cpus > 0 ? cpus : 1);
    }
    out.memory = mb * 1024 * 1024;  // Slurm's MB are MiB
    // A count the user did not ask for is 0 or NO_VAL (-n) and 0 or NO_VAL16
    // (--ntasks-per-node).
    out.layout.nodes = j.num_nodes;
    out.layout.tasks = j.num_tasks == NO_VAL ? 0 : j.num_tasks;
    out.layout.tasks_per_node =
        j.ntasks_per_node == NO_VAL16 || j.ntasks_per_node == INFINITE16 ? 0 : j.ntasks_per_node;
    if (j.batch_flag != 0) {
      char path[4096] = {};
      slurm_get_job_stdout(path, sizeof(path), const_cast<slurm_job_info_t*>(&j));
      out.std_out = path;
    }
  }
  slurm_free_job_info_msg(msg);
  return out;
}

Result<uint32_t> DecideRanksPerNode(const Job& job, const SlurmJob& sj) {
  Result<uint32_t> rpn = Status::Unavailable(
      "cannot ask slurmctld for the job's task layout; give --nopfs-ranks-per-node");
  if (sj.layout.nodes != 0) {
    rpn = RanksPerNode(sj.layout, job.opts);
  } else if (OptionGiven(job.opts, "nopfs-ranks-per-node")) {
    rpn = job.opts.ranks_per_node;
  }
  if (!rpn.ok()) {
    WriteStatus(job, launch::kLayoutName,
                launch::FormatLayoutError("nopfs: layout: " + rpn.status().message()));
    return rpn.status();
  }
  WriteStatus(job, launch::kLayoutName, launch::FormatLayout(*rpn));
  return rpn;
}

Result<std::string> PeerSecret(const std::string& key_path, uint64_t job_id, uid_t uid) {
  const int fd = ::open(key_path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "peer_key " + key_path);
  struct stat st {};
  std::string key(4096, '\0');
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 && (st.st_mode & 077) == 0) {
    n = ::read(fd, key.data(), key.size());
  }
  ::close(fd);
  if (n < 16) {
    return Status::InvalidArgument("peer_key " + key_path +
                                   ": must be a regular file of 16 to 4095 bytes owned by root "
                                   "with mode 0600 (create it with: head -c 32 /dev/urandom > " +
                                   key_path + "; chmod 600 " + key_path + ")");
  }
  key.resize(static_cast<size_t>(n));
  const std::string msg =
      "nopfs peer secret v1:" + std::to_string(job_id) + ":" + std::to_string(uid);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len) == nullptr) {
    return Status::Internal("HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

uint32_t PeerPortOffset(const std::string& secret) {
  constexpr std::string_view kLabel = "nopfs peer ports v1";
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(kLabel.data()), kLabel.size(), out,
           &len) == nullptr ||
      len < 4) {
    return 0;
  }
  return uint32_t{out[0]} | uint32_t{out[1]} << 8 | uint32_t{out[2]} << 16;
}

uint32_t UnprivilegedPortStart() {
  uint32_t start = 1024;  // Linux's default
  const int fd = ::open("/proc/sys/net/ipv4/ip_unprivileged_port_start", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return start;
  char buf[32];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  if (n > 0) {
    uint32_t v = 0;
    const auto r = std::from_chars(buf, buf + n, v);
    if (r.ec == std::errc()) start = v;
  }
  return start;
}

std::string PeerPortsWarning(const PluginArgs& args) {
  const uint32_t start = UnprivilegedPortStart();
  if (args.peer_ports.empty() || args.peer_ports.back().high < start) return "";
  return "; warning: peer_ports=" + FormatPortRanges(args.peer_ports) +
         " reaches net.ipv4.ip_unprivileged_port_start=" + std::to_string(start) +
         ", so any user can bind those ports and keep jobs from their peers: keep peer_ports "
         "below " +
         std::to_string(start);
}

std::string PeersOutcome(const Job& job, const launch::DaemonArgs& dargs,
                         const launch::ReadyInfo& ready, std::string* for_job) {
  for_job->clear();
  if (dargs.peers.empty()) return "";
  const std::string ranges = FormatPortRanges(job.args.peer_ports);
  const size_t colon = dargs.peer_listen.rfind(':');
  const std::string port = colon == std::string::npos ? "" : dargs.peer_listen.substr(colon + 1);
  // nopfsd is the user's process: its words are shown printable and its port is checked.
  std::string said = Printable(ready.peers, 600);
  const std::string head = "peers: " + std::to_string(job.nodes) + " nodes, ";
  std::string note;
  if (ready.peer_port == 0 || std::to_string(ready.peer_port) != port) {
    if (said.rfind("no peers: ", 0) == 0) said.erase(0, 10);
    if (ready.peer_port != 0) said = "nopfsd said port " + std::to_string(ready.peer_port);
    note = "no peers: this node does not listen on " + dargs.peer_listen + " (" +
           (said.empty() ? "nopfsd did not say why" : said) +
           "); the job reads what this node lacks from the PFS. For the admin: `ss -tlnp "
           "'sport = :" +
           port +
           "'` shows who holds that port; free it, or leave it out of peer_ports= in "
           "plugstack.conf (now " +
           ranges + ")";
  } else if (!ready.peers_joined) {
    note = head + said + "; for the admin: the ports of peer_ports=" + ranges +
           " must be open between the compute nodes, and the other nodes' prolog lines in their "
           "slurmd logs say whether their nopfsd listens";
  } else {
    return head + said + PeerPortsWarning(job.args);
  }
  *for_job = "nopfs: " + job.node + ": " + note;
  return note + PeerPortsWarning(job.args);
}

void SetPeers(const Job& job, launch::DaemonArgs* args, std::string* why) {
  if (job.nodes < 2) return;
  if (job.args.peer_key.empty()) {
    *why = "no peers (peer_key is not set in plugstack.conf)";
    return;
  }
  Result<std::string> secret = PeerSecret(job.args.peer_key, job.job_id, job.uid);
  if (!secret.ok()) {
    *why = "no peers: " + secret.status().message();
    return;
  }
  if (Status s = WriteFileAs(job.run_dir, launch::kSecretName, *secret, job.uid, job.gid, 0600);
      !s.ok()) {
    *why = "no peers: " + s.message();
    return;
  }
  const std::vector<std::string> peers =
      PeerEndpoints(job.args, job.names, PeerPortOffset(*secret));
  std::string list;
  for (const std::string& p : peers)
    list += (list.empty() ? "" : ",") + p;
  // Until nopfsd says it listens (PeersOutcome), the line says only where it is to.
  *why = "peers: " + std::to_string(peers.size()) + " nodes, to listen on " + peers[job.node_index];
  *why += PeerPortsWarning(job.args);
  args->peer_listen = peers[job.node_index];
  args->peers = list;
  args->peer_secret_file = job.run_dir + "/" + launch::kSecretName;
}

}  // namespace nopfs::spank::launcher
