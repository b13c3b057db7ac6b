// The client <-> nopfsd wire format: the messages exchanged over the job's local UNIX socket.
//
// Every message is a 16-byte header followed by a payload of at most kMaxPayload bytes:
//   u32 magic "NPFS" | u16 version | u16 type | u32 payload length | u32 request id
// All integers are little-endian; strings are a u32 byte count followed by the bytes (no NUL).
// docs/wire.md describes each message byte by byte and the versioning rule. A ring's memfd travels
// as SCM_RIGHTS ancillary data on the STREAM_OK message.
//
// Decoding never trusts its input: a bad magic, an unknown version or type, a length over the
// limit, a truncated field or trailing bytes all yield a non-ok Status (never a crash, never an
// allocation larger than the payload). wire_test.cc runs a randomized fuzz loop over Decode().
//
// Thread safety: the functions are reentrant; SendMessage/RecvMessage on one socket must be
// serialized by the caller.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "protocol/status_report.h"

namespace nopfs::wire {

inline constexpr uint32_t kMagic = 0x5346504E;  // the bytes 'N' 'P' 'F' 'S'
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderSize = 16;
inline constexpr uint32_t kMaxPayload = 64 * 1024;

enum class MsgType : uint16_t {
  kHello = 1,
  kHelloOk = 2,
  kOpenStream = 3,
  kStreamOk = 4,
  kStatus = 5,
  kStatusOk = 6,
  kCloseStream = 7,
  kCloseOk = 8,
  kError = 9,
  kDescribe = 10,
  kDescribeOk = 11,
  kReadSample = 12,
  kSampleOk = 13,
};
inline constexpr MsgType kLastType = MsgType::kSampleOk;

// client -> service: the first message on a connection.
struct Hello {
  uint16_t client_version = kVersion;
  uint32_t pid = 0;
  bool operator==(const Hello&) const = default;
};
// service -> client: the answer to HELLO.
struct HelloOk {
  uint16_t service_version = kVersion;
  std::string job_id;
  uint32_t ranks = 0;        // ranks in the whole job
  uint32_t first_rank = 0;   // the first rank served by this node's service
  uint32_t local_ranks = 0;  // ranks served by this node's service
  bool operator==(const HelloOk&) const = default;
};
// The optional tail of OPEN_STREAM (docs/wire.md, "Optional trailing fields"): a share of the
// rank's stream and an end. With it, the stream holds only the accesses of batches `worker`,
// `worker + workers`, ... of each epoch (batches of `batch` entries counted from where the stream
// enters that epoch), and ends after `epochs` epochs (0: at the end of the job). A DataLoader
// worker w of W opens {w, W, batch_size, 1}; their batches interleave back into the rank's order.
struct StreamShare {
  uint32_t worker = 0;   // < workers
  uint32_t workers = 1;  // >= 1
  uint64_t batch = 1;    // entries per batch, >= 1
  uint32_t epochs = 0;   // epochs to serve from the start epoch; 0: all that remain
  bool operator==(const StreamShare&) const = default;
};
// client -> service: open `rank`'s stream starting at (epoch, step), whole or a share of it.
// OPEN_STREAM's flags (the second optional trailing group).
inline constexpr uint32_t kOpenAcceptRegion = 1;  // the client maps a region (STREAM_OK's 2nd fd)
inline constexpr uint32_t kOpenKnownFlags = kOpenAcceptRegion;

struct OpenStream {
  uint32_t rank = 0;
  uint32_t epoch = 0;
  uint64_t step = 0;
  std::optional<StreamShare> share;  // absent: the whole stream (the version-1 base message)
  // Absent: 0. Sent after the share (a default share is sent with it when none is set).
  std::optional<uint32_t> flags;
  // The third optional group: the stream is a DataLoader worker's share of the rank that process
  // `owner` (a pid as the client sees it) reads. Absent: the stream is the client's own (HELLO's
  // pid). Streams of one rank whose epochs overlap must all have one owner (docs/wire.md).
  std::optional<uint32_t> owner;
  bool operator==(const OpenStream&) const = default;
};
// service -> client: the stream is open; its ring's memfd is attached (SCM_RIGHTS).
// With region_bytes (only in answer to kOpenAcceptRegion), a second descriptor follows the
// ring's: a read-only memfd of which the client maps region_bytes (a RAM cache tier), that ring
// slots may point into (zero copy).
struct StreamOk {
  uint64_t stream_id = 0;
  uint64_t capacity = 0;    // data arena bytes
  uint32_t slot_count = 0;  // slots in the ring's slot table
  std::optional<uint64_t> region_bytes;
  bool operator==(const StreamOk&) const = default;
};
// client -> service: ask for the service's status: its text, or (with the optional trailing
// group, docs/wire.md "Structured status") the structured report of that version.
struct StatusRequest {
  std::optional<uint16_t> report_version;
  bool operator==(const StatusRequest&) const = default;
};
// service -> client: human-readable UTF-8 status (what `nopfs status` prints), or, in answer to a
// STATUS that asked for it, an empty text and the structured report (the optional trailing group).
struct StatusOk {
  std::string text;
  std::optional<report::StatusReport> report;
  bool operator==(const StatusOk&) const = default;
};
// client -> service: the client is done with a stream; the service frees its ring.
struct CloseStream {
  uint64_t stream_id = 0;
  bool operator==(const CloseStream&) const = default;
};
// service -> client: the answer to CLOSE_STREAM.
struct CloseOk {
  uint64_t stream_id = 0;
  bool operator==(const CloseOk&) const = default;
};
// service -> client: a request failed. `code` is a nopfs::StatusCode value.
struct Error {
  uint32_t code = 0;
  std::string message;
  bool operator==(const Error&) const = default;
};

// client -> service: where does sample `sample_id` come from (`nopfs cat --verify` reads the
// file itself to compare)?
struct Describe {
  uint32_t sample_id = 0;
  bool operator==(const Describe&) const = default;
};
// service -> client: the sample's file on the PFS, its byte range and its label.
struct DescribeOk {
  uint32_t sample_id = 0;
  std::string path;  // absolute
  uint64_t offset = 0;
  uint64_t length = 0;
  int64_t label = -1;
  bool operator==(const DescribeOk&) const = default;
};

// A sibling's request (docs/wire.md, "Sibling reads"): another job of the same user on this node
// and dataset asks for sample `sample_id` of the catalog whose fingerprint is `fingerprint`. The
// service answers SAMPLE_OK (reading the sample from the PFS itself when no tier holds it) or
// ERROR (failed precondition when the fingerprints differ).
struct ReadSample {
  uint64_t fingerprint = 0;
  uint32_t sample_id = 0;
  bool operator==(const ReadSample&) const = default;
};
// Samples up to this size travel inside SAMPLE_OK; larger ones in a memfd (SCM_RIGHTS).
inline constexpr uint64_t kMaxInlineSample = 60 * 1024;
// service -> client: the sample's bytes, `size` of them, whose xxh3 is `xxh3`: in `data` when
// size <= kMaxInlineSample, else `data` is empty and a memfd holding them is attached.
struct SampleOk {
  uint32_t sample_id = 0;
  uint64_t xxh3 = 0;
  uint64_t size = 0;
  std::string data;
  bool operator==(const SampleOk&) const = default;
};

// The alternatives follow MsgType's order (TypeOf relies on it).
using Body = std::variant<Hello, HelloOk, OpenStream, StreamOk, StatusRequest, StatusOk,
                          CloseStream, CloseOk, Error, Describe, DescribeOk, ReadSample, SampleOk>;

struct Message {
  uint32_t request_id = 0;  // echoed in the answer
  Body body;
  bool operator==(const Message&) const = default;
};

struct Header {
  MsgType type = MsgType::kError;
  uint32_t payload_length = 0;
  uint32_t request_id = 0;
};

MsgType TypeOf(const Body& body);
std::string_view TypeName(MsgType type);

// Header + payload. Fails (InvalidArgument) only if a string makes the payload exceed kMaxPayload.
Result<std::vector<std::byte>> Encode(const Message& message);
// Validates magic, version, type and length of the first kHeaderSize bytes.
Result<Header> DecodeHeader(std::span<const std::byte> bytes);
// Decodes a payload whose header was accepted by DecodeHeader. Rejects truncated fields and
// trailing bytes.
Result<Message> DecodePayload(const Header& header, std::span<const std::byte> payload);
// A whole message (header + payload, nothing more).
Result<Message> Decode(std::span<const std::byte> bytes);

// Maps an ERROR message to a Status (an out-of-range code becomes kInternal) and back.
Status ToStatus(const Error& error);
Error FromStatus(const Status& status);

// An owned file descriptor (common/unique_fd.h).
using ::nopfs::UniqueFd;

// A received message and the descriptor that came with it (invalid if none).
struct Received {
  Message message;
  UniqueFd fd;
  UniqueFd fd2;  // a second descriptor (STREAM_OK's region), invalid if none
};

// Sends one message on a connected stream socket, with `pass_fd` and then `pass_fd2` (each if
// >= 0) as SCM_RIGHTS. MSG_NOSIGNAL: a closed peer is an Unavailable status, never SIGPIPE.
Status SendMessage(int sock, const Message& message, int pass_fd = -1, int pass_fd2 = -1);
// Receives one message, waiting at most `timeout` for each part (negative: forever). A clean EOF
// before the first byte is kUnavailable "connection closed"; a malformed message is
// kInvalidArgument; at most two descriptors are accepted per message (extra ones are closed).
Result<Received> RecvMessage(int sock, std::chrono::milliseconds timeout);

// The uid of the process at the other end of a connected UNIX socket (SO_PEERCRED).
Result<uint32_t> PeerUid(int sock);

}  // namespace nopfs::wire
