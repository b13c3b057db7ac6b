#include "kept/finish.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "common/checksum.h"
#include "common/small_file.h"
#include "common/unique_fd.h"
#include "kept/area.h"

namespace nopfs::kept {
namespace {

// The SSD tier's slot alignment: what a kept sample takes on disk is its length rounded up to it.
constexpr uint64_t kSlotAlignment = 4096;

uint64_t Padded(uint64_t length) {
  return (length + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
}

// A data file of the record, opened and checked.
struct DataFile {
  UniqueFd fd;
  struct stat st {};
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // (offset, padded length), kept samples
};

Status WriteNewFileAt(int dfd, const std::string& shown, const std::string& name,
                      std::string_view bytes, uid_t uid) {
  const std::string path = shown + "/" + name;
  const UniqueFd fd(
      ::openat(dfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.get() < 0) return Status::FromErrno(errno, path);
  if (::geteuid() != uid && ::fchown(fd.get(), uid, static_cast<gid_t>(-1)) != 0) {
    return Status::FromErrno(errno, "chown " + path);
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, path);
    done += size_t(n);
  }
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, path);
  return Status::Ok();
}

// <user_dir>/kept, made (0700, the user's) when missing; a link or another owner's is refused.
Result<UniqueFd> OpenKeptDir(const FinishRequest& r) {
  const std::string shown = r.user_dir + "/kept";
  UniqueFd kfd(::openat(r.user_dir_fd, "kept",
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (kfd.get() < 0 && errno == ENOENT) {
    if (::mkdirat(r.user_dir_fd, "kept", 0700) != 0 && errno != EEXIST) {
      return Status::FromErrno(errno, "mkdir " + shown);
    }
    kfd.Reset(::openat(r.user_dir_fd, "kept",
                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
    struct stat st {};
    if (kfd.get() >= 0 && ::fstat(kfd.get(), &st) == 0 && st.st_uid == ::geteuid() &&
        ::geteuid() != r.uid && ::fchown(kfd.get(), r.uid, static_cast<gid_t>(-1)) != 0) {
      return Status::FromErrno(errno, "chown " + shown);
    }
  }
  if (kfd.get() < 0) {
    if (errno == ELOOP || errno == ENOTDIR) {
      return Status::PermissionDenied(shown + " is not a directory; not touching it");
    }
    return Status::FromErrno(errno, "open " + shown);
  }
  struct stat st {};
  if (::fstat(kfd.get(), &st) != 0) return Status::FromErrno(errno, "stat " + shown);
  if (st.st_uid != r.uid) {
    return Status::PermissionDenied(shown + " belongs to uid " + std::to_string(st.st_uid) +
                                    ", not " + std::to_string(r.uid) + "; not touching it");
  }
  return kfd;
}

// Checks every record of `rec` against the tier's data files (opened here, read-write, for the
// punching) and chooses the records kept within max_bytes; fills `files` [data file].
Result<std::vector<KeptSample>> ChooseSamples(const FinishRequest& r, int tier_fd,
                                              const std::string& tier_shown, KeepRecord& rec,
                                              std::vector<DataFile>& files, uint64_t* dropped) {
  files.resize(rec.manifest.data_files);
  std::vector<KeptSample> kept;
  uint64_t used = 0;
  for (KeptSample& s : rec.samples) {
    if (s.data_file >= files.size()) {
      return Status::Corruption("keep record: a sample names data." + std::to_string(s.data_file) +
                                ", the record has " + std::to_string(files.size()) + " data files");
    }
    DataFile& f = files[s.data_file];
    const std::string name = "data." + std::to_string(s.data_file);
    if (!f.fd.valid()) {
      f.fd.Reset(
          ::openat(tier_fd, name.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
      if (!f.fd.valid()) return Status::FromErrno(errno, "keep record: " + tier_shown + "/" + name);
      if (::fstat(f.fd.get(), &f.st) != 0) return Status::FromErrno(errno, tier_shown + "/" + name);
      if (!S_ISREG(f.st.st_mode) || f.st.st_uid != r.uid || f.st.st_nlink != 1) {
        return Status::PermissionDenied(tier_shown + "/" + name +
                                        " is not a regular file of the user's with one link");
      }
    }
    const uint64_t size = uint64_t(f.st.st_size);
    if (s.data_offset > size || s.length > size - s.data_offset) {
      return Status::Corruption("keep record: a sample's bytes run past the end of " + tier_shown +
                                "/" + name);
    }
    const uint64_t padded = std::min(Padded(s.length), size - s.data_offset);
    if (r.max_bytes != 0 && used + padded > r.max_bytes) {
      ++*dropped;
      continue;
    }
    used += padded;
    f.extents.emplace_back(s.data_offset, padded);
    kept.push_back(std::move(s));
  }
  return kept;
}

// Punches out every byte of each data file that holds no kept sample. Returns false when the
// file system refuses (the bytes stay allocated).
bool PunchUnkept(std::vector<DataFile>& files) {
  bool all = true;
  for (DataFile& f : files) {
    if (f.extents.empty()) continue;  // holds no kept sample: not moved
    std::sort(f.extents.begin(), f.extents.end());
    uint64_t at = 0;
    const auto punch = [&](uint64_t from, uint64_t to) {
      if (to <= from || !all) return;
      if (::fallocate(f.fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(from),
                      off_t(to - from)) != 0) {
        all = false;
      }
    };
    for (const auto& [off, len] : f.extents) {
      punch(at, off);
      at = std::max(at, off + len);
    }
    punch(at, uint64_t(f.st.st_size));
  }
  return all;
}

}  // namespace

Result<FinishResult> FinishKept(const FinishRequest& r) {
  FinishResult out;
  if (r.tier_name.empty() || r.tier_name[0] == '.' || r.tier_name.find('/') != std::string::npos) {
    return Status::InvalidArgument("kept area: \"" + r.tier_name + "\" is not a tier's name");
  }
  const std::string tier_shown = r.user_dir + "/" + r.tier_name;
  const UniqueFd tier_fd(::openat(r.user_dir_fd, r.tier_name.c_str(),
                                  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!tier_fd.valid()) {
    if (errno == ENOENT) return out;
    if (errno == ELOOP || errno == ENOTDIR) {
      return Status::PermissionDenied(tier_shown + " is not a directory; not touching it");
    }
    return Status::FromErrno(errno, "open " + tier_shown);
  }
  struct stat tst {};
  if (::fstat(tier_fd.get(), &tst) != 0) return Status::FromErrno(errno, "stat " + tier_shown);
  if (tst.st_uid != r.uid) {
    return Status::PermissionDenied(tier_shown + " belongs to uid " + std::to_string(tst.st_uid) +
                                    ", not " + std::to_string(r.uid) + "; not touching it");
  }
  // Root's memory: a record larger than nopfsd ever writes is refused before it is read.
  struct stat rst {};
  if (::fstatat(tier_fd.get(), kKeepRecordName, &rst, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISREG(rst.st_mode) && uint64_t(rst.st_size) > kMaxKeepRecordBytes) {
    return Status::ResourceExhausted(
        "keep record: " + tier_shown + "/" + kKeepRecordName + " holds " +
        std::to_string(rst.st_size) + " bytes, more than the " +
        std::to_string(kMaxKeepRecordBytes >> 20) +
        " MiB a keep record may hold (nopfsd writes none larger); not reading it, nothing kept");
  }
  Result<std::string> bytes =
      ReadSmallFileAt(tier_fd.get(), kKeepRecordName, SmallFileRules{kMaxKeepRecordBytes, r.uid});
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) return out;
    return bytes.status().WithContext(tier_shown);
  }
  out.found = true;
  Result<KeepRecord> rec = ParseKeepRecord(*bytes);
  bytes->clear();
  bytes->shrink_to_fit();
  if (!rec.ok()) return rec.status().WithContext(tier_shown);
  out.key = rec->manifest.key;  // IsKeptKey: ParseKeptManifest checked it
  Result<UniqueFd> kfd = OpenKeptDir(r);
  if (!kfd.ok()) return kfd.status();
  const std::string kept_shown = r.user_dir + "/kept";
  const std::string name = ".tmp.finish." + r.tier_name;
  const std::string entry_shown = kept_shown + "/" + name;
  // A finish killed before: its entry is incomplete.
  NOPFS_RETURN_IF_ERROR(RemoveKeptAt(kfd->get(), kept_shown, name));

  std::vector<DataFile> files;
  Result<std::vector<KeptSample>> kept =
      ChooseSamples(r, tier_fd.get(), tier_shown, *rec, files, &out.dropped);
  if (!kept.ok()) return kept.status();
  if (kept->empty()) return Status::FailedPrecondition("keep record: no sample within the grant");
  const bool punched = PunchUnkept(files);
  for (DataFile& f : files) {
    if (!f.extents.empty() && ::fstat(f.fd.get(), &f.st) == 0) {
      out.bytes += uint64_t(f.st.st_blocks) * 512;
    }
  }
  if (!punched && r.max_bytes != 0 && out.bytes > r.max_bytes) {
    return Status::ResourceExhausted(
        "the file system cannot punch holes, and the data files hold " + std::to_string(out.bytes) +
        " bytes, more than the " + std::to_string(r.max_bytes) + " the policy grants");
  }

  uint32_t steps = 0;
  // Whether a test asked to stop here, as a kill would, leaving what is on disk.
  const auto abandon = [&r, &steps] { return r.abandon_after != 0 && ++steps >= r.abandon_after; };
  if (::mkdirat(kfd->get(), name.c_str(), 0700) != 0) {
    return Status::FromErrno(errno, "mkdir " + entry_shown);
  }
  if (abandon()) return Status::Internal("kept area: abandoned (a test stops here)");
  const auto fail = [&](Status s) {
    (void)RemoveKeptAt(kfd->get(), kept_shown, name);
    return s;
  };
  const UniqueFd entry_fd(
      ::openat(kfd->get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat est {};
  if (!entry_fd.valid() || ::fstat(entry_fd.get(), &est) != 0) {
    return fail(Status::FromErrno(errno, "open " + entry_shown));
  }
  if (est.st_uid != ::geteuid()) {
    return fail(Status::PermissionDenied(entry_shown + " was replaced while it was made"));
  }
  if (::geteuid() != r.uid && ::fchown(entry_fd.get(), r.uid, static_cast<gid_t>(-1)) != 0) {
    return fail(Status::FromErrno(errno, "chown " + entry_shown));
  }
  for (uint32_t i = 0; i < files.size(); ++i) {
    if (files[i].extents.empty()) continue;
    const std::string data = "data." + std::to_string(i);
    if (::renameat(tier_fd.get(), data.c_str(), entry_fd.get(), data.c_str()) != 0) {
      return fail(Status::FromErrno(errno, "rename " + tier_shown + "/" + data));
    }
    struct stat moved {};
    if (::fstatat(entry_fd.get(), data.c_str(), &moved, AT_SYMLINK_NOFOLLOW) != 0 ||
        moved.st_dev != files[i].st.st_dev || moved.st_ino != files[i].st.st_ino) {
      return fail(Status::PermissionDenied(tier_shown + "/" + data +
                                           " was replaced while it was checked; nothing kept"));
    }
    if (abandon()) return Status::Internal("kept area: abandoned (a test stops here)");
  }
  const std::string index = EncodeKeptIndex(*kept);
  if (Status s = WriteNewFileAt(entry_fd.get(), entry_shown, "index", index, r.uid); !s.ok()) {
    return fail(s);
  }
  if (abandon()) return Status::Internal("kept area: abandoned (a test stops here)");
  KeptManifest m;
  m.key = out.key;
  m.dataset = r.dataset;
  m.created = r.now;
  m.last_used = r.now;
  m.samples = kept->size();
  m.index_bytes = index.size();
  m.index_xxh3 = ColdXxh3(std::as_bytes(std::span(index.data(), index.size())));
  m.data_files = rec->manifest.data_files;
  if (Status s =
          WriteNewFileAt(entry_fd.get(), entry_shown, "MANIFEST", EncodeKeptManifest(m), r.uid);
      !s.ok()) {
    return fail(s);
  }
  if (::fsync(entry_fd.get()) != 0) return fail(Status::FromErrno(errno, "fsync " + entry_shown));
  if (abandon()) return Status::Internal("kept area: abandoned (a test stops here)");
  if (::renameat(kfd->get(), name.c_str(), kfd->get(), out.key.c_str()) != 0) {
    if (errno != EEXIST && errno != ENOTEMPTY && errno != EISDIR && errno != ENOTDIR) {
      return fail(Status::FromErrno(errno, "rename " + entry_shown));
    }
    // An older entry of the key (another job of the user kept meanwhile): the newer replaces it.
    if (Status s = RemoveKeptAt(kfd->get(), kept_shown, out.key); !s.ok()) return fail(s);
    if (::renameat(kfd->get(), name.c_str(), kfd->get(), out.key.c_str()) != 0) {
      return fail(Status::FromErrno(errno, "rename " + entry_shown));
    }
  }
  (void)::fsync(kfd->get());
  (void)::unlinkat(tier_fd.get(), kKeepRecordName, 0);
  out.dir = kept_shown + "/" + out.key;
  out.samples = kept->size();
  return out;
}

}  // namespace nopfs::kept
