#include "service/daemon/metrics.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/version.h"

namespace nopfs::service {
namespace {

// A label value with the escapes the exposition format requires.
std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Writes one metric family: its HELP and TYPE lines, then its samples.
class Exposition {
 public:
  explicit Exposition(const MetricsLabels& l)
      : base_("slurm_job_id=\"" + Escape(l.job) + "\",slurm_user=\"" + Escape(l.user) +
              "\",slurm_node=\"" + Escape(l.node) + "\"") {}

  void Family(const char* name, const char* type, const char* help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  // name{slurm_job_id,slurm_user,slurm_node[,extra]} value
  void Sample(const std::string& name, const std::string& extra, const std::string& value) {
    out_ += name;
    out_ += '{';
    out_ += base_;
    if (!extra.empty()) {
      out_ += ',';
      out_ += extra;
    }
    out_ += "} ";
    out_ += value;
    out_ += '\n';
  }
  void Sample(const std::string& name, const std::string& extra, uint64_t value) {
    Sample(name, extra, std::to_string(value));
  }
  std::string& str() { return out_; }

 private:
  std::string base_;
  std::string out_;
};

std::string Label(const char* key, const std::string& value) {
  return std::string(key) + "=\"" + Escape(value) + "\"";
}

}  // namespace

std::string RenderMetrics(const report::StatusReport& r, const MetricsLabels& labels) {
  Exposition e(labels);
  e.Family("nopfs_served_samples_total", "counter",
           "Samples handed to the job's clients, by source.");
  for (const report::Source& s : r.sources)
    e.Sample("nopfs_served_samples_total", Label("source", s.name), s.samples);
  e.Family("nopfs_served_bytes_total", "counter", "Bytes handed to the job's clients, by source.");
  for (const report::Source& s : r.sources)
    e.Sample("nopfs_served_bytes_total", Label("source", s.name), s.bytes);

  // Bucket b of the report holds stalls in [2^(b-1), 2^b) ns (bucket 0: 0 ns), so every stall
  // of bucket b is at most 2^b ns: the bucket `le` 2^b ns counts buckets 0..b. Buckets past
  // 2^40 ns (18 min) are folded into +Inf.
  constexpr size_t kLastBucket = 40;
  e.Family("nopfs_stall_seconds", "histogram",
           "Time the job's clients waited inside next() per call, over every stream.");
  uint64_t cumulative = 0;
  uint64_t count = 0;
  for (uint64_t c : r.stall.histogram)
    count += c;
  for (size_t b = 0; b <= kLastBucket; ++b) {
    cumulative += r.stall.histogram[b];
    e.Sample("nopfs_stall_seconds_bucket",
             "le=\"" + Num(static_cast<double>(uint64_t{1} << b) / 1e9) + "\"", cumulative);
  }
  e.Sample("nopfs_stall_seconds_bucket", "le=\"+Inf\"", count);
  e.Sample("nopfs_stall_seconds_sum", "", Num(static_cast<double>(r.stall.total_ns) / 1e9));
  e.Sample("nopfs_stall_seconds_count", "", count);

  e.Family("nopfs_tier_capacity_bytes", "gauge",
           "Bytes of the class the job may use on this node.");
  for (const report::Tier& t : r.tiers)
    e.Sample("nopfs_tier_capacity_bytes", Label("tier", t.name), t.capacity);
  e.Family("nopfs_tier_used_bytes", "gauge",
           "Bytes of the class the job's plan fills (the samples it puts there).");
  for (const report::Tier& t : r.tiers)
    e.Sample("nopfs_tier_used_bytes", Label("tier", t.name), t.planned_bytes);
  e.Family("nopfs_tier_ready_bytes", "gauge", "Bytes of the class holding their sample now.");
  for (const report::Tier& t : r.tiers)
    e.Sample("nopfs_tier_ready_bytes", Label("tier", t.name), t.ready_bytes);
  e.Family("nopfs_tier_ready_samples", "gauge", "Samples of the class ready now.");
  for (const report::Tier& t : r.tiers)
    e.Sample("nopfs_tier_ready_samples", Label("tier", t.name), t.ready_samples);
  e.Family("nopfs_staging_rate_bytes_per_second", "gauge",
           "Bytes per second entering the class over the last 5 s.");
  for (const report::Tier& t : r.tiers)
    e.Sample("nopfs_staging_rate_bytes_per_second", Label("tier", t.name), t.rate);
  e.Family("nopfs_staging_eta_seconds", "gauge",
           "Seconds until the class holds its plan at the current rate (absent when unknown).");
  for (const report::Tier& t : r.tiers) {
    if (t.eta_ns == report::kUnknown) continue;
    e.Sample("nopfs_staging_eta_seconds", Label("tier", t.name),
             Num(static_cast<double>(t.eta_ns) / 1e9));
  }

  e.Family("nopfs_pfs_read_bytes_total", "counter",
           "Bytes read from the PFS on this node, prefetch included.");
  e.Sample("nopfs_pfs_read_bytes_total", "", r.pfs_bytes);

  e.Family("nopfs_kept_bytes", "gauge",
           "Disk bytes of the SSD tier's samples kept at exit for the next job (0 until then).");
  const report::Kept kept = r.kept.value_or(report::Kept{});
  e.Sample("nopfs_kept_bytes", "", kept.kept_bytes);
  e.Family("nopfs_adopted_bytes_total", "counter",
           "Bytes taken from the copy an earlier job kept instead of the PFS.");
  e.Sample("nopfs_adopted_bytes_total", "", kept.adopted_bytes);
  e.Family("nopfs_adopted_samples_total", "counter",
           "Samples taken from the copy an earlier job kept instead of the PFS.");
  e.Sample("nopfs_adopted_samples_total", "", kept.adopted_samples);
  e.Family("nopfs_adopt_rejected_samples_total", "counter",
           "Kept samples not used (file changed, bytes differ, gone from the dataset).");
  e.Sample("nopfs_adopt_rejected_samples_total", "", kept.adopt_rejected_samples);

  const report::Siblings sib = r.siblings.value_or(report::Siblings{});
  e.Family("nopfs_sibling_reads_total", "counter",
           "Samples read through another running job of the user on this node and dataset "
           "(read) and for such jobs (served).");
  e.Sample("nopfs_sibling_reads_total", "direction=\"read\"", sib.read_samples);
  e.Sample("nopfs_sibling_reads_total", "direction=\"served\"", sib.served_samples);
  e.Family("nopfs_sibling_read_bytes_total", "counter",
           "Bytes read through another running job of the user (read) and for such jobs "
           "(served).");
  e.Sample("nopfs_sibling_read_bytes_total", "direction=\"read\"", sib.read_bytes);
  e.Sample("nopfs_sibling_read_bytes_total", "direction=\"served\"", sib.served_bytes);
  e.Family("nopfs_sibling_failures_total", "counter",
           "Reads through a sibling job that failed (the sample then comes from the PFS).");
  e.Sample("nopfs_sibling_failures_total", "", sib.read_failed);

  const report::Peers none;
  const report::Peers& p = r.peers ? *r.peers : none;
  e.Family("nopfs_peer_reads_total", "counter",
           "Samples read from the job's other nodes (fetched) and for them (served).");
  e.Sample("nopfs_peer_reads_total", "direction=\"fetched\"", p.fetched_samples);
  e.Sample("nopfs_peer_reads_total", "direction=\"served\"", p.served_samples);
  e.Family("nopfs_peer_failures_total", "counter",
           "Peer requests that failed, by kind (the sample then comes from the PFS).");
  e.Sample("nopfs_peer_failures_total", "kind=\"not_available\"", p.fetch_not_available);
  e.Sample("nopfs_peer_failures_total", "kind=\"timeout\"", p.timeouts);
  e.Sample("nopfs_peer_failures_total", "kind=\"refused\"", p.refused);
  e.Sample("nopfs_peer_failures_total", "kind=\"malformed\"", p.malformed);
  e.Sample("nopfs_peer_failures_total", "kind=\"rma\"", p.rma_failed);
  e.Family("nopfs_peers_dead", "gauge", "Nodes of the job this node found dead.");
  e.Sample("nopfs_peers_dead", "", static_cast<uint64_t>(p.dead.size()));

  e.Family("nopfs_refusals_total", "counter",
           "Requests nopfsd refused, by kind (docs/service.md, \"Limits\").");
  e.Sample("nopfs_refusals_total", "kind=\"owner\"", r.refusals.owners);
  e.Sample("nopfs_refusals_total", "kind=\"stream\"", r.refusals.streams);
  e.Sample("nopfs_refusals_total", "kind=\"connection\"", r.refusals.connections);
  e.Sample("nopfs_refusals_total", "kind=\"timed_out\"", r.refusals.timed_out);

  e.Family("nopfs_start_time_seconds", "gauge", "When nopfsd started, in seconds since the epoch.");
  e.Sample("nopfs_start_time_seconds", "", Num(labels.start_time));
  e.Family("nopfs_build_info", "gauge", "The nopfs version that nopfsd was built as.");
  e.Sample("nopfs_build_info", "version=\"" + Escape(kVersion) + "\"", uint64_t{1});
  return std::move(e.str());
}

MetricsWriter::MetricsWriter(std::string dir, MetricsLabels labels, LocalIo* io)
    : dir_(std::move(dir)),
      labels_(std::move(labels)),
      path_(dir_ + "/" + MetricsFileName(labels_.job)),
      io_(io != nullptr ? io : LocalIo::Default()) {
  // A reader's open(2) breaks the write lease with SIGIO, whose default action ends the process;
  // the lease is released within microseconds anyway, so the signal is not needed.
  struct sigaction old {};
  if (::sigaction(SIGIO, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    ::sigemptyset(&ign.sa_mask);
    ::sigaction(SIGIO, &ign, nullptr);
  }
}

Status MetricsWriter::RemoveIfMade() {
  if (!created_) return Status::Ok();
  created_ = false;
  if (io_->Unlink(path_) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno, "metrics: removing " + path_);
  }
  return Status::Ok();
}

Status MetricsWriter::Open(int* fd_out, struct stat* st, bool* busy) {
  *busy = false;
  // The file is rewritten in place: nopfsd may not create or rename anything in a metrics
  // directory that only root writes (root made this file for the job). O_NOFOLLOW: a link is
  // never written through.
  int fd = io_->Open(path_, O_RDWR | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0 && errno == ENOENT) {
    // Made here only in a directory of this user's that nobody else may write (`nopfs run`'s):
    // a file of nopfsd's own among other users' would let them stand in for it.
    struct stat dir {};
    if (::stat(dir_.c_str(), &dir) != 0) return Status::FromErrno(errno, "metrics: " + dir_);
    if (dir.st_uid != ::geteuid() || (dir.st_mode & 022) != 0) {
      return Status::NotFound("metrics: " + path_ +
                              " does not exist: nopfsd writes only the file root made for the "
                              "job (Slurm's prolog), or one in a directory of its user's own "
                              "that nobody else may write");
    }
    fd = io_->Open(path_, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd >= 0) created_ = true;
  }
  if (fd < 0) {
    // EWOULDBLOCK: another writer holds the lease right now (the caller waits and tries again).
    *busy = errno == EWOULDBLOCK;
    return Status::FromErrno(errno, "metrics: opening " + path_);
  }
  if (io_->Fstat(fd, st) != 0) {
    const int err = errno;
    io_->Close(fd);
    return Status::FromErrno(err, "metrics: checking " + path_);
  }
  if (!S_ISREG(st->st_mode) || st->st_uid != ::geteuid()) {
    io_->Close(fd);
    return Status::PermissionDenied("metrics: " + path_ +
                                    " is not a regular file of this user; not writing it");
  }
  *fd_out = fd;
  return Status::Ok();
}

Status MetricsWriter::Write(const report::StatusReport& r) {
  const std::string text = RenderMetrics(r, labels_);
  // A write lease: granted only while no other process has the file open, and from then on an
  // open(2) by anyone else (node_exporter) waits until it is released, so no reader ever sees
  // the file between its old and its new text. A reader that has it open now is waited for, with
  // the file closed meanwhile: two writers of one file (nodes sharing a metrics directory) that
  // both held it open while waiting would each keep the other from its lease, and neither write.
  int fd = -1;
  struct stat st {};
  bool leased = false;
  int lease_err = 0;
  for (int attempt = 0; attempt < kLeaseAttempts; ++attempt) {
    if (attempt > 0) {
      // 1 to 2 waits, at random: apart in time from another writer that retries too.
      thread_local std::minstd_rand jitter(std::random_device{}());
      ::usleep(kLeaseWaitUs + static_cast<unsigned>(jitter() % kLeaseWaitUs));
    }
    bool busy = false;
    const Status opened = Open(&fd, &st, &busy);
    if (busy) continue;
    if (!opened.ok()) return opened;
    if (::fcntl(fd, F_SETLEASE, F_WRLCK) == 0) {
      leased = true;
      break;
    }
    lease_err = errno;
    if (lease_err != EAGAIN && lease_err != EBUSY) break;  // leases unsupported here: see below
    io_->Close(fd);
    fd = -1;
  }
  if (fd < 0) {
    return Status::Unavailable("metrics: " + path_ +
                               " stays open in another process; not rewritten this time");
  }
  if (!leased && !lease_warned_) {
    // NFS and a few others grant no leases: the rewrite then goes on without one, and a reader
    // that opens the file during the few microseconds of the write may see it mixed.
    lease_warned_ = true;
    spdlog::warn("metrics: no write lease on {} ({}): a scrape during a rewrite may see it mixed",
                 path_, std::strerror(lease_err));
  }
  auto fail = [&](int err, const std::string& what) {
    io_->Close(fd);
    return Status::FromErrno(err, "metrics: " + what + " " + path_);
  };
  auto release = [&] {
    if (leased) ::fcntl(fd, F_SETLEASE, F_UNLCK);
  };
  // The space first: a full disk then fails here, with the previous text still whole.
  const off_t size = static_cast<off_t>(text.size());
  if (size > st.st_size) {
    if (const int err = io_->Fallocate(fd, 0, size); err != 0 && err != EOPNOTSUPP) {
      release();
      return fail(err, "writing");
    }
  }
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t n =
        io_->Pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  // Never half a text: what failed midway leaves an empty file (no series, never a wrong one).
  if (err == 0 && ::ftruncate(fd, size) != 0) err = errno;
  if (err != 0) {
    const int emptied = ::ftruncate(fd, 0);  // the error reported stays the first one
    static_cast<void>(emptied);
  }
  // fchmod: the umask must not hide the file from node_exporter (which runs as its own user).
  if (err == 0 && (st.st_mode & 07777) != 0644 && ::fchmod(fd, 0644) != 0) err = errno;
  release();
  if (err != 0) return fail(err, "writing");
  if (io_->Close(fd) != 0) return Status::FromErrno(errno, "metrics: closing " + path_);
  return Status::Ok();
}

}  // namespace nopfs::service
