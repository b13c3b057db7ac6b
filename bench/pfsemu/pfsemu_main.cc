// nopfs_pfsemu: an emulated parallel file system (FUSE 3 passthrough) for nopfs's benchmarks.
//
// Serves a backing directory read-only. Every read of a file is throttled by a Throttle (the
// aggregate bandwidth t(γ) over the γ reads in flight), every open() of a file sleeps
// open_latency_us, every getattr and readdir its own latency (the metadata server's), the kernel is
// told not to cache (direct_io, no attribute caching of contents), and the backing file's pages are
// dropped after each read (POSIX_FADV_DONTNEED), so a second read of the same bytes costs the same
// as the first. It is an emulation of a loaded PFS's shape, not of any particular PFS. Counters
// (bytes, opens, reads, getattrs (and of them those of directories: the kernel's lookups of them
// and its refreshes of their attributes), readdirs and the entries they listed, time spent
// throttled, peak readers) are served as MOUNTPOINT/.pfsemu_stats, printed on SIGUSR1, and written
// to --stats-out at unmount. SIGTERM/SIGINT/SIGHUP unmount cleanly (libfuse's handlers end the
// loop; we then unmount).
#define FUSE_USE_VERSION 314

#include <dirent.h>
#include <fcntl.h>
#include <fuse3/fuse.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/pfsemu/options.h"
#include "bench/pfsemu/throttle.h"

namespace nopfs::pfsemu {
namespace {

constexpr const char* kStatsName = ".pfsemu_stats";
constexpr uint64_t kStatsFh = ~uint64_t{0};  // file handle marking the stats file

struct Counters {
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> opens{0};
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> getattrs{0};
  std::atomic<uint64_t> getattrs_dirs{0};  // of them, of directories (lookups and refreshes)
  std::atomic<uint64_t> readdirs{0};
  std::atomic<uint64_t> readdir_entries{0};
  std::atomic<uint64_t> throttle_wait_us{0};
  std::atomic<uint64_t> active{0};
  std::atomic<uint64_t> peak_readers{0};
};

// The file system's state; FUSE hands it to every callback through fuse_get_context().
struct Fs {
  Options options;
  int backing_fd = -1;
  std::unique_ptr<Throttle> throttle;
  Counters counters;
};

Fs* GetFs() {
  return static_cast<Fs*>(fuse_get_context()->private_data);
}

std::string StatsText(const Fs& fs) {
  const Counters& c = fs.counters;
  return "bytes_read " + std::to_string(c.bytes.load()) + "\nopens " +
         std::to_string(c.opens.load()) + "\nreads " + std::to_string(c.reads.load()) +
         "\ngetattrs " + std::to_string(c.getattrs.load()) + "\ngetattrs_files " +
         std::to_string(c.getattrs.load() - c.getattrs_dirs.load()) + "\ngetattrs_dirs " +
         std::to_string(c.getattrs_dirs.load()) + "\nreaddirs " +
         std::to_string(c.readdirs.load()) + "\nreaddir_entries " +
         std::to_string(c.readdir_entries.load()) + "\nmetadata_ops " +
         std::to_string(c.opens.load() + c.getattrs.load() + c.readdirs.load()) +
         "\nthrottle_wait_us " + std::to_string(c.throttle_wait_us.load()) + "\npeak_readers " +
         std::to_string(c.peak_readers.load()) + "\nbandwidth_mbps " +
         fs.throttle->curve().ToString() + "\nopen_latency_us " +
         std::to_string(fs.options.open_latency_us) + "\ngetattr_latency_us " +
         std::to_string(fs.options.getattr_latency_us) + "\nreaddir_latency_us " +
         std::to_string(fs.options.readdir_latency_us) + "\nattr_cache_ms " +
         std::to_string(fs.options.attr_cache_ms) + "\n";
}

bool IsStats(const char* path) {
  return path[0] == '/' && std::strcmp(path + 1, kStatsName) == 0;
}

// Backing paths relative to backing_fd: "/" is ".", "/a/b" is "a/b".
const char* Rel(const char* path) {
  return path[1] == '\0' ? "." : path + 1;
}

int DoGetattr(const char* path, struct stat* st, struct fuse_file_info* /*fi*/) {
  Fs* fs = GetFs();
  if (IsStats(path)) {
    std::memset(st, 0, sizeof(*st));
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = static_cast<off_t>(StatsText(*fs).size());
    return 0;
  }
  if (fs->options.getattr_latency_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(fs->options.getattr_latency_us));
  }
  const bool found = fstatat(fs->backing_fd, Rel(path), st, AT_SYMLINK_NOFOLLOW) == 0;
  const int err = errno;
  // A directory's count first, so that a reader never sees more of them than getattrs in all.
  if (found && S_ISDIR(st->st_mode)) fs->counters.getattrs_dirs.fetch_add(1);
  fs->counters.getattrs.fetch_add(1);
  if (!found) return -err;
  st->st_mode &= ~static_cast<mode_t>(0222);  // read-only
  return 0;
}

int DoReaddir(const char* path, void* buf, fuse_fill_dir_t filler, off_t /*offset*/,
              struct fuse_file_info* /*fi*/, enum fuse_readdir_flags /*flags*/) {
  Fs* fs = GetFs();
  const int fd = openat(fs->backing_fd, Rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    close(fd);
    return -err;
  }
  if (fs->options.readdir_latency_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(fs->options.readdir_latency_us));
  }
  fs->counters.readdirs.fetch_add(1);
  // The stats file is not listed, so that a scan of the dataset does not take it for a sample.
  while (struct dirent* e = readdir(dir)) {
    fs->counters.readdir_entries.fetch_add(1);
    struct stat st {};
    st.st_ino = e->d_ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(e->d_type));
    if (filler(buf, e->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0)) != 0) break;
  }
  closedir(dir);
  return 0;
}

int DoOpen(const char* path, struct fuse_file_info* fi) {
  Fs* fs = GetFs();
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
  fi->direct_io = 1;  // no page cache in the kernel for this file
  fi->keep_cache = 0;
  if (IsStats(path)) {
    fi->fh = kStatsFh;
    return 0;
  }
  const int fd = openat(fs->backing_fd, Rel(path), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  if (fs->options.open_latency_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(fs->options.open_latency_us));
  }
  fs->counters.opens.fetch_add(1);
  fi->fh = static_cast<uint64_t>(fd);
  return 0;
}

int DoRead(const char* /*path*/, char* buf, size_t size, off_t offset, struct fuse_file_info* fi) {
  Fs* fs = GetFs();
  if (fi->fh == kStatsFh) {
    const std::string text = StatsText(*fs);
    if (offset < 0 || static_cast<uint64_t>(offset) >= text.size()) return 0;
    const size_t n = std::min(size, text.size() - static_cast<size_t>(offset));
    std::memcpy(buf, text.data() + offset, n);
    return static_cast<int>(n);
  }
  Counters& c = fs->counters;
  const uint64_t readers = c.active.fetch_add(1) + 1;
  uint64_t peak = c.peak_readers.load();
  while (readers > peak && !c.peak_readers.compare_exchange_weak(peak, readers)) {
  }
  const int fd = static_cast<int>(fi->fh);
  ssize_t n = pread(fd, buf, size, offset);
  const int err = errno;
  if (n > 0) {
    // Drop the backing pages so that the next read of them comes from the device again.
    (void)posix_fadvise(fd, offset, n, POSIX_FADV_DONTNEED);
    const auto now = Throttle::Clock::now();
    const auto done = fs->throttle->Reserve(static_cast<uint64_t>(n), readers, now);
    if (done > now) {
      std::this_thread::sleep_until(done);
      c.throttle_wait_us.fetch_add(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(done - now).count()));
    }
    c.bytes.fetch_add(static_cast<uint64_t>(n));
  }
  c.reads.fetch_add(1);
  c.active.fetch_sub(1);
  return n < 0 ? -err : static_cast<int>(n);
}

int DoRelease(const char* /*path*/, struct fuse_file_info* fi) {
  if (fi->fh != kStatsFh) close(static_cast<int>(fi->fh));
  return 0;
}

int DoStatfs(const char* /*path*/, struct statvfs* st) {
  if (fstatvfs(GetFs()->backing_fd, st) != 0) return -errno;
  return 0;
}

int DoAccess(const char* path, int mask) {
  if (mask & W_OK) return -EROFS;
  if (IsStats(path)) return 0;
  if (faccessat(GetFs()->backing_fd, Rel(path), mask, 0) != 0) return -errno;
  return 0;
}

// How long a lookup's attributes serve later calls when attr_cache_ms is 0.
constexpr double kLookupAttrSeconds = 0.05;

void* DoInit(struct fuse_conn_info* /*conn*/, struct fuse_config* cfg) {
  const Fs* fs = static_cast<const Fs*>(fuse_get_context()->private_data);
  cfg->direct_io = 1;
  cfg->kernel_cache = 0;
  cfg->use_ino = 1;
  cfg->entry_timeout = static_cast<double>(fs->options.attr_cache_ms) / 1000;
  // Without a cache every lookup reaches the file system, and the attributes it returns serve the
  // call that made it (as a PFS's lookup returns them): a stat is one getattr, not a lookup and a
  // second getattr because the kernel saw the attributes expire the same instant.
  cfg->attr_timeout = fs->options.attr_cache_ms == 0 ? kLookupAttrSeconds : cfg->entry_timeout;
  cfg->negative_timeout = 0;
  return fuse_get_context()->private_data;
}

// Prints the counters on each SIGUSR1; exits when `stop` is set and it is woken.
void SignalThread(const Fs* fs, const std::atomic<bool>* stop) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (stop->load()) return;
    std::cerr << ("pfsemu: stats:\n" + StatsText(*fs)) << std::flush;  // one write
  }
}

int Run(Options options) {
  Result<BandwidthCurve> curve = BandwidthCurve::Parse(options.bandwidth);
  if (!curve.ok()) {
    std::cerr << "pfsemu: " << curve.status().ToString() << "\n";
    return 2;
  }
  Fs fs;
  fs.options = std::move(options);
  fs.throttle = std::make_unique<Throttle>(std::move(curve).value(), fs.options.burst_bytes);
  fs.backing_fd = open(fs.options.backing.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fs.backing_fd < 0) {
    std::cerr << "pfsemu: " << Status::FromErrno(errno, "backing " + fs.options.backing).ToString()
              << "\n";
    return 1;
  }

  // SIGUSR1 is blocked everywhere (FUSE's threads inherit the mask) and taken by one thread.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  std::atomic<bool> stop{false};
  std::thread signal_thread(SignalThread, &fs, &stop);

  struct fuse_operations ops {};
  ops.getattr = DoGetattr;
  ops.readdir = DoReaddir;
  ops.open = DoOpen;
  ops.read = DoRead;
  ops.release = DoRelease;
  ops.statfs = DoStatfs;
  ops.access = DoAccess;
  ops.init = DoInit;

  // ro: no writes; allow_other: nopfsd runs as another user; default_permissions: the kernel
  // checks the backing modes; fsname/subtype: how `mount` and /proc/mounts name it.
  std::vector<std::string> args = {
      "nopfs_pfsemu", "-o", "ro,allow_other,default_permissions,fsname=pfsemu,subtype=pfsemu"};
  std::vector<char*> argv;
  for (std::string& a : args)
    argv.push_back(a.data());
  struct fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());

  int rc = 1;
  struct fuse* fuse = fuse_new(&fargs, &ops, sizeof(ops), &fs);
  if (fuse == nullptr) {
    std::cerr << "pfsemu: fuse_new failed\n";
  } else if (fuse_mount(fuse, fs.options.mountpoint.c_str()) != 0) {
    std::cerr << "pfsemu: mounting " << fs.options.mountpoint << " failed\n";
    fuse_destroy(fuse);
  } else {
    struct fuse_session* se = fuse_get_session(fuse);
    if (fuse_set_signal_handlers(se) != 0) {
      std::cerr << "pfsemu: installing signal handlers failed\n";
    } else {
      std::cerr << "pfsemu: mounted " << fs.options.backing << " at " << fs.options.mountpoint
                << " (t = " << fs.throttle->curve().ToString() << " MB/s, latency: open "
                << fs.options.open_latency_us << " us, getattr " << fs.options.getattr_latency_us
                << " us, readdir " << fs.options.readdir_latency_us << " us)\n"
                << std::flush;
      struct fuse_loop_config* cfg = fuse_loop_cfg_create();
      fuse_loop_cfg_set_max_threads(cfg, static_cast<unsigned>(fs.options.max_threads));
      fuse_loop_cfg_set_idle_threads(cfg, static_cast<unsigned>(fs.options.max_threads));
      // The loop returns the number of the signal that ended it: a requested stop is clean.
      const int loop = fuse_loop_mt(fuse, cfg);
      rc = (loop == 0 || loop == SIGTERM || loop == SIGINT || loop == SIGHUP) ? 0 : 1;
      fuse_loop_cfg_destroy(cfg);
      fuse_remove_signal_handlers(se);
    }
    fuse_unmount(fuse);
    fuse_destroy(fuse);
    std::cerr << "pfsemu: unmounted " << fs.options.mountpoint << "\n";
  }
  fuse_opt_free_args(&fargs);

  stop.store(true);
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  if (!fs.options.stats_out.empty()) {
    std::ofstream out(fs.options.stats_out);
    out << StatsText(fs);
    if (!out) {
      std::cerr << "pfsemu: writing " << fs.options.stats_out << " failed\n";
      rc = 1;
    }
  }
  std::cerr << "pfsemu: final stats:\n" << StatsText(fs);
  close(fs.backing_fd);
  return rc;
}

}  // namespace
}  // namespace nopfs::pfsemu

int main(int argc, char** argv) {
  using namespace nopfs::pfsemu;
  // A latency of 1 ms is 1 ms: without this, the kernel may let each sleep overrun by its
  // default timer slack (50 us). FUSE's threads, made later, inherit it.
  (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  std::vector<std::string> args(argv, argv + argc);
  if (std::find(args.begin(), args.end(), "--help") != args.end()) {
    std::cout << Usage();
    return 0;
  }
  nopfs::Result<Options> options = ParseOptions(args);
  if (!options.ok()) {
    std::cerr << "pfsemu: " << options.status().ToString() << "\n" << Usage();
    return 2;
  }
  return Run(std::move(options).value());
}
