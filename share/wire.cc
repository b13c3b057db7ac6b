#include "share/wire.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/coding.h"

namespace nopfs::share {

using coding::Reader;
using coding::Writer;
namespace {

Status Bad(const std::string& why) {
  return Status::InvalidArgument("share message: " + why);
}

}  // namespace

Status CheckRelativePath(std::string_view rel) {
  if (rel.empty()) return Bad("an empty path");
  if (rel.size() > kMaxPathBytes) return Bad("a path longer than 4096 bytes");
  if (rel.front() == '/') return Bad("an absolute path; name the file relative to the dataset");
  if (rel.find('\0') != std::string_view::npos) return Bad("a path with a NUL byte");
  size_t start = 0;
  while (start <= rel.size()) {
    size_t end = rel.find('/', start);
    if (end == std::string_view::npos) end = rel.size();
    const std::string_view c = rel.substr(start, end - start);
    if (c.empty() || c == "." || c == "..") {
      return Bad("a path with an empty, '.' or '..' component");
    }
    start = end + 1;
  }
  return Status::Ok();
}

std::vector<std::byte> EncodeRequest(const Request& r) {
  Writer w;
  w.U32(kMagic);
  w.U16(kVersion);
  w.U16(static_cast<uint16_t>(r.op));
  w.Str(r.dataset);
  w.U32(static_cast<uint32_t>(r.files.size()));
  for (const std::string& f : r.files)
    w.Str(f);
  return w.Take();
}

Result<Request> DecodeRequest(std::span<const std::byte> bytes, size_t fds) {
  if (bytes.size() > kMaxRequestBytes) return Bad("longer than 65536 bytes");
  Reader rd(bytes);
  uint32_t magic = 0, count = 0;
  uint16_t version = 0, op = 0;
  Request r;
  if (!rd.U32(&magic) || !rd.U16(&version) || !rd.U16(&op)) return Bad("truncated header");
  if (magic != kMagic) return Bad("not a share message");
  if (version != kVersion) return Bad("version " + std::to_string(version) + ", expected 1");
  if (op != static_cast<uint16_t>(Op::kPing) && op != static_cast<uint16_t>(Op::kOpen) &&
      op != static_cast<uint16_t>(Op::kWarm)) {
    return Bad("unknown operation " + std::to_string(op));
  }
  r.op = static_cast<Op>(op);
  if (!rd.Str(&r.dataset)) return Bad(std::string("dataset: ") + rd.error());
  if (r.dataset.size() > kMaxPathBytes || r.dataset.find('\0') != std::string::npos) {
    return Bad("dataset: not a path");
  }
  if (!rd.U32(&count)) return Bad("truncated count");
  if (count > kMaxBatch) return Bad("more than 250 files");
  if (r.op == Op::kPing && count != 0) return Bad("a ping names no files");
  if (count != fds) {
    return Bad(std::to_string(count) + " files but " + std::to_string(fds) + " descriptors");
  }
  r.files.resize(count);
  for (std::string& f : r.files) {
    if (!rd.Str(&f)) return Bad(std::string("file: ") + rd.error());
    NOPFS_RETURN_IF_ERROR(CheckRelativePath(f));
  }
  if (!rd.done()) return Bad("bytes left over");
  return r;
}

std::vector<std::byte> EncodeReply(const Reply& r) {
  Writer w;
  w.U32(kMagic);
  w.U16(kVersion);
  w.U16(static_cast<uint16_t>(r.status));
  w.U32(static_cast<uint32_t>(r.files.size()));
  for (const FileAnswer& a : r.files) {
    w.U8(static_cast<uint8_t>(a.outcome));
    w.U64(a.size);
    w.U64(a.xxh3);
  }
  return w.Take();
}

Result<Reply> DecodeReply(std::span<const std::byte> bytes, size_t fds, Op op) {
  Reader rd(bytes);
  uint32_t magic = 0, count = 0;
  uint16_t version = 0, status = 0;
  Reply r;
  if (!rd.U32(&magic) || !rd.U16(&version) || !rd.U16(&status) || !rd.U32(&count)) {
    return Bad("truncated reply");
  }
  if (magic != kMagic || version != kVersion) return Bad("not a share reply");
  if (status > static_cast<uint16_t>(ReplyStatus::kUnavailable)) return Bad("unknown status");
  r.status = static_cast<ReplyStatus>(status);
  if (count > kMaxBatch) return Bad("more than 250 answers");
  size_t ready = 0;
  r.files.resize(count);
  for (FileAnswer& a : r.files) {
    uint8_t o = 0;
    if (!rd.U8(&o) || !rd.U64(&a.size) || !rd.U64(&a.xxh3)) return Bad("truncated answer");
    if (o > static_cast<uint8_t>(Outcome::kBusy)) return Bad("unknown outcome");
    a.outcome = static_cast<Outcome>(o);
    if (a.outcome == Outcome::kReady) ++ready;
  }
  if (!rd.done()) return Bad("bytes left over");
  if (op != Op::kOpen) ready = 0;
  if (ready != fds) {
    return Bad(std::to_string(ready) + " copies but " + std::to_string(fds) + " descriptors");
  }
  return r;
}

Status SendMessage(int sock, std::span<const std::byte> bytes, std::span<const int> fds) {
  if (fds.size() > kMaxBatch) return Status::InvalidArgument("more than 250 descriptors");
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::FromErrno(errno, "share: send");
  if (static_cast<size_t>(n) != bytes.size()) return Status::IoError("share: short send");
  return Status::Ok();
}

Result<Message> ReceiveMessage(int sock, size_t max_bytes) {
  Message m;
  m.bytes.resize(max_bytes + 1);
  iovec iov{m.bytes.data(), m.bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kMaxBatch + 8))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::FromErrno(errno, "share: receive");
  // Every descriptor that arrived is owned (and so closed) whatever happens next.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      m.fds.emplace_back(fd);
    }
  }
  if (n == 0 && m.fds.empty()) return Status::Unavailable("share: closed");
  if ((msg.msg_flags & MSG_CTRUNC) != 0) return Bad("too many descriptors");
  if ((msg.msg_flags & MSG_TRUNC) != 0 || static_cast<size_t>(n) > max_bytes) {
    return Bad("longer than " + std::to_string(max_bytes) + " bytes");
  }
  if (m.fds.size() > kMaxBatch) return Bad("more than 250 descriptors");
  m.bytes.resize(static_cast<size_t>(n));
  return m;
}

}  // namespace nopfs::share
