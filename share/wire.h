// The share protocol: what a job's nopfsd (as the job's user) and the node's share service (root)
// say to each other over the service's UNIX socket (SOCK_SEQPACKET: one message per request and
// per reply). docs/wire.md, "Shared datasets", is the reference; docs/security.md says why each
// check exists.
//
// A request names a declared dataset and up to kMaxBatch files of it by their path relative to
// the dataset's root, and carries, for each file, a descriptor the asker opened on it itself
// (SCM_RIGHTS): the proof that the asker may read it. The reply says per file whether the service
// hands back a read-only descriptor of its copy (kReady, in the reply's SCM_RIGHTS, in order),
// or why not. Every message from an asker is hostile input: the decoders check every length and
// refuse a message that is truncated, too long or has bytes left over.
//
// Thread safety: the functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace nopfs::share {

inline constexpr uint32_t kMagic = 0x4853504e;  // "NPSH"
inline constexpr uint16_t kVersion = 1;
// Files per request (below the kernel's SCM_MAX_FD, 253).
inline constexpr uint32_t kMaxBatch = 250;
// A request's bytes, at most (the asker splits a batch whose paths do not fit).
inline constexpr size_t kMaxRequestBytes = 64 * 1024;
inline constexpr size_t kMaxPathBytes = 4096;

enum class Op : uint16_t {
  kPing = 1,  // no files: is the service there (the prolog's check)
  kOpen = 2,  // prove each file and get a descriptor of its copy, filled first when missing
  kWarm = 3,  // prove each file and have it filled; no descriptors back
};

// The request's outcome as a whole.
enum class ReplyStatus : uint16_t {
  kOk = 0,
  kBadRequest = 1,  // malformed; the service closes the connection after saying so
  kNotShared = 2,   // the dataset is not one the node config declares shared
  kUnavailable = 3  // the dataset's copy cannot be used on this node now (its store failed)
};

// One file's outcome.
enum class Outcome : uint8_t {
  kReady = 0,      // a read-only descriptor of the copy follows; size and xxh3 are the file's
  kDenied = 1,     // the proof does not show that the asker may read this very file: read the PFS
  kNotStored = 2,  // not in the copy and not added (quota, a read error, changed while read)
  kBusy = 3,       // another request is filling it right now: read the PFS (or ask again later)
};

struct Request {
  Op op = Op::kPing;
  std::string dataset;             // the declared root, absolute
  std::vector<std::string> files;  // relative to the root; one proof descriptor each
};

struct FileAnswer {
  Outcome outcome = Outcome::kDenied;
  uint64_t size = 0;  // kReady: the copy's size (the whole file)
  uint64_t xxh3 = 0;  // kReady: the xxh3 of the whole file, computed by the service
};

struct Reply {
  ReplyStatus status = ReplyStatus::kOk;
  std::vector<FileAnswer> files;  // one per requested file (kOk), none otherwise
};

// A path a request may name: relative, at most kMaxPathBytes, no NUL, no empty, "." or ".."
// component. InvalidArgument says what is wrong.
Status CheckRelativePath(std::string_view rel);

std::vector<std::byte> EncodeRequest(const Request& r);
// Strict: every field checked, nothing left over; `fds` is how many descriptors came with it,
// which must equal the number of files.
Result<Request> DecodeRequest(std::span<const std::byte> bytes, size_t fds);
std::vector<std::byte> EncodeReply(const Reply& r);
// `fds`: the descriptors that came with it, which must equal the number of kReady answers to a
// kOpen request (`op`) and be none for the others.
Result<Reply> DecodeReply(std::span<const std::byte> bytes, size_t fds, Op op);

// One message and its descriptors on a SOCK_SEQPACKET socket (MSG_NOSIGNAL).
Status SendMessage(int sock, std::span<const std::byte> bytes, std::span<const int> fds);
// Receives one message of at most `max_bytes` and up to kMaxBatch descriptors (close-on-exec).
// A message or descriptor list that did not fit is InvalidArgument (its descriptors closed);
// the peer's end: Unavailable "closed".
struct Message {
  std::vector<std::byte> bytes;
  std::vector<UniqueFd> fds;
};
Result<Message> ReceiveMessage(int sock, size_t max_bytes);

}  // namespace nopfs::share
