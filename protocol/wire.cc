#include "protocol/wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <initializer_list>
#include <string>

#include "common/coding.h"

namespace nopfs::wire {
namespace {

using coding::Reader;
using coding::Writer;

// A boolean byte: 0 or 1, anything else is malformed (so that decoding is canonical).
bool ReadBool(Reader& r, bool* v) {
  uint8_t b = 0;
  if (!r.U8(&b) || b > 1) return false;
  *v = b == 1;
  return true;
}

void EncodeBody(Writer& w, const Hello& m) {
  w.U16(m.client_version);
  w.U32(m.pid);
}
void EncodeBody(Writer& w, const HelloOk& m) {
  w.U16(m.service_version);
  w.Str(m.job_id);
  w.U32(m.ranks);
  w.U32(m.first_rank);
  w.U32(m.local_ranks);
}
void EncodeBody(Writer& w, const OpenStream& m) {
  w.U32(m.rank);
  w.U32(m.epoch);
  w.U64(m.step);
  if (m.share || m.flags || m.owner) {
    const StreamShare share = m.share.value_or(StreamShare{});
    w.U32(share.worker);
    w.U32(share.workers);
    w.U64(share.batch);
    w.U32(share.epochs);
  }
  if (m.flags || m.owner) w.U32(m.flags.value_or(0));
  if (m.owner) w.U32(*m.owner);
}
void EncodeBody(Writer& w, const StreamOk& m) {
  w.U64(m.stream_id);
  w.U64(m.capacity);
  w.U32(m.slot_count);
  if (m.region_bytes) w.U64(*m.region_bytes);
}
// The structured status (docs/wire.md, "Structured status"), after its u16 version.
void EncodePeers(Writer& w, const report::Peers& p);

void EncodeReport(Writer& w, const report::StatusReport& r) {
  w.Str(r.job_id);
  w.U32(r.node);
  w.U32(r.nodes);
  w.U32(r.pid);
  w.U64(r.uptime_ns);
  w.Str(r.dataset);
  w.U64(r.dataset_samples);
  w.U64(r.dataset_bytes);
  w.U64(r.predicted_stall_ns);
  w.U32(static_cast<uint32_t>(r.tiers.size()));
  for (const report::Tier& t : r.tiers) {
    w.Str(t.name);
    w.U8(static_cast<uint8_t>(t.state));
    for (uint64_t v : {t.capacity, t.planned_samples, t.planned_bytes, t.ready_samples,
                       t.ready_bytes, t.kept_on_read, t.pushed, t.failed, t.rate, t.eta_ns}) {
      w.U64(v);
    }
  }
  w.U32(static_cast<uint32_t>(r.streams.size()));
  for (const report::Stream& s : r.streams) {
    w.U64(s.id);
    w.U32(s.rank);
    for (uint64_t v : {s.staged, s.total, s.errors, s.read})
      w.U64(v);
  }
  w.U32(static_cast<uint32_t>(r.sources.size()));
  for (const report::Source& s : r.sources) {
    w.Str(s.name);
    w.U64(s.samples);
    w.U64(s.bytes);
    w.U8(s.zero_copy ? 1 : 0);
    w.U64(s.in_place);
  }
  for (uint64_t v : {r.pfs_bytes, r.corrupt, r.changed, r.stall.reads, r.stall.total_ns,
                     r.stall.median_ns, r.stall.p99_ns}) {
    w.U64(v);
  }
  for (uint64_t v : r.stall.histogram)
    w.U64(v);
  w.U64(r.refusals.owners);
  w.U32(r.refusals.streams_per_rank);
  for (uint64_t v : {r.refusals.streams, r.refusals.connections, r.refusals.timed_out,
                     r.cpu_user_ns, r.cpu_system_ns}) {
    w.U64(v);
  }
  w.U8(r.peers ? 1 : 0);
  if (r.peers) EncodePeers(w, *r.peers);
  // The kept area's group, then the sibling jobs' (optional and trailing, each only after the one
  // before; nopfsd always sends both).
  if (r.kept || r.siblings) {
    const report::Kept k = r.kept.value_or(report::Kept{});
    for (uint64_t v : {k.kept_bytes, k.adopted_bytes, k.adopted_samples, k.adopt_rejected_samples})
      w.U64(v);
  }
  if (r.siblings) {
    const report::Siblings& s = *r.siblings;
    w.Str(s.through);
    for (uint64_t v :
         {s.read_samples, s.read_bytes, s.read_failed, s.served_samples, s.served_bytes}) {
      w.U64(v);
    }
  }
}

void EncodePeers(Writer& w, const report::Peers& p) {
  w.U32(p.node);
  w.U32(p.nodes);
  w.Str(p.state);
  w.U64(p.held_elsewhere);
  w.U64(p.needed);
  for (uint64_t v : {p.served_samples, p.served_bytes, p.served_not_available, p.fetched_samples,
                     p.fetched_bytes, p.fetch_not_available, p.timeouts, p.refused, p.malformed}) {
    w.U64(v);
  }
  w.U32(static_cast<uint32_t>(p.dead.size()));
  for (uint32_t n : p.dead)
    w.U32(n);
  w.U64(p.done_reports);
  w.Str(p.rma);
  for (uint64_t v : {p.served_rma, p.fetched_rma, p.rma_failed, p.served_in_place, p.pushes_sent,
                     p.push_bytes_sent, p.pushes_dropped, p.pushes_received, p.pushes_kept,
                     p.copied_samples, p.copied_bytes, p.deferred, p.fill_gave_up}) {
    w.U64(v);
  }
}

void EncodeBody(Writer& w, const StatusRequest& m) {
  if (m.report_version) w.U16(*m.report_version);
}
void EncodeBody(Writer& w, const StatusOk& m) {
  w.Str(m.text);
  if (m.report) {
    w.U16(report::kReportVersion);
    EncodeReport(w, *m.report);
  }
}
void EncodeBody(Writer& w, const CloseStream& m) {
  w.U64(m.stream_id);
}
void EncodeBody(Writer& w, const CloseOk& m) {
  w.U64(m.stream_id);
}
void EncodeBody(Writer& w, const Error& m) {
  w.U32(m.code);
  w.Str(m.message);
}
void EncodeBody(Writer& w, const Describe& m) {
  w.U32(m.sample_id);
}
void EncodeBody(Writer& w, const DescribeOk& m) {
  w.U32(m.sample_id);
  w.Str(m.path);
  w.U64(m.offset);
  w.U64(m.length);
  w.U64(static_cast<uint64_t>(m.label));
}
void EncodeBody(Writer& w, const ReadSample& m) {
  w.U64(m.fingerprint);
  w.U32(m.sample_id);
}
void EncodeBody(Writer& w, const SampleOk& m) {
  w.U32(m.sample_id);
  w.U64(m.xxh3);
  w.U64(m.size);
  w.Str(m.data);
}

bool DecodeBody(Reader& r, Hello* m) {
  return r.U16(&m->client_version) && r.U32(&m->pid);
}
bool DecodeBody(Reader& r, HelloOk* m) {
  return r.U16(&m->service_version) && r.Str(&m->job_id) && r.U32(&m->ranks) &&
         r.U32(&m->first_rank) && r.U32(&m->local_ranks);
}
bool DecodeBody(Reader& r, OpenStream* m) {
  if (!(r.U32(&m->rank) && r.U32(&m->epoch) && r.U64(&m->step))) return false;
  if (r.done()) return true;  // the base message: the whole stream
  StreamShare share;
  if (!(r.U32(&share.worker) && r.U32(&share.workers) && r.U64(&share.batch) &&
        r.U32(&share.epochs))) {
    return false;
  }
  m->share = share;
  if (r.done()) return true;
  uint32_t flags = 0;
  if (!r.U32(&flags) || (flags & ~kOpenKnownFlags) != 0) return false;
  m->flags = flags;
  if (r.done()) return true;
  uint32_t owner = 0;
  if (!r.U32(&owner)) return false;
  m->owner = owner;
  return true;
}
bool DecodeBody(Reader& r, StreamOk* m) {
  if (!(r.U64(&m->stream_id) && r.U64(&m->capacity) && r.U32(&m->slot_count))) return false;
  if (r.done()) return true;
  uint64_t region = 0;
  if (!r.U64(&region)) return false;
  m->region_bytes = region;
  return true;
}
// Reads u64 fields in order; false at the first that is missing.
bool U64s(Reader& r, std::initializer_list<uint64_t*> fields) {
  for (uint64_t* f : fields) {
    if (!r.U64(f)) return false;
  }
  return true;
}

bool DecodePeers(Reader& r, report::StatusReport* m);

bool DecodeReport(Reader& r, report::StatusReport* m) {
  uint32_t n = 0;
  if (!(r.Str(&m->job_id) && r.U32(&m->node) && r.U32(&m->nodes) && r.U32(&m->pid) &&
        r.U64(&m->uptime_ns) && r.Str(&m->dataset) && r.U64(&m->dataset_samples) &&
        r.U64(&m->dataset_bytes) && r.U64(&m->predicted_stall_ns) && r.U32(&n))) {
    return false;
  }
  // Every element takes bytes of the payload, so a count larger than the payload fails on the
  // first missing field, before it can cost more than the payload's size in memory.
  for (uint32_t i = 0; i < n; ++i) {
    report::Tier t;
    uint8_t state = 0;
    if (!(r.Str(&t.name) && r.U8(&state) && state <= report::kLastTierState &&
          U64s(r, {&t.capacity, &t.planned_samples, &t.planned_bytes, &t.ready_samples,
                   &t.ready_bytes, &t.kept_on_read, &t.pushed, &t.failed, &t.rate, &t.eta_ns}))) {
      return false;
    }
    t.state = static_cast<report::TierState>(state);
    m->tiers.push_back(std::move(t));
  }
  if (!r.U32(&n)) return false;
  for (uint32_t i = 0; i < n; ++i) {
    report::Stream s;
    if (!(r.U64(&s.id) && r.U32(&s.rank) && U64s(r, {&s.staged, &s.total, &s.errors, &s.read}))) {
      return false;
    }
    m->streams.push_back(s);
  }
  if (!r.U32(&n)) return false;
  for (uint32_t i = 0; i < n; ++i) {
    report::Source s;
    if (!(r.Str(&s.name) && r.U64(&s.samples) && r.U64(&s.bytes) && ReadBool(r, &s.zero_copy) &&
          r.U64(&s.in_place))) {
      return false;
    }
    m->sources.push_back(std::move(s));
  }
  if (!U64s(r, {&m->pfs_bytes, &m->corrupt, &m->changed, &m->stall.reads, &m->stall.total_ns,
                &m->stall.median_ns, &m->stall.p99_ns})) {
    return false;
  }
  for (uint64_t& v : m->stall.histogram) {
    if (!r.U64(&v)) return false;
  }
  bool has_peers = false;
  if (!(r.U64(&m->refusals.owners) && r.U32(&m->refusals.streams_per_rank) &&
        U64s(r, {&m->refusals.streams, &m->refusals.connections, &m->refusals.timed_out,
                 &m->cpu_user_ns, &m->cpu_system_ns}) &&
        ReadBool(r, &has_peers))) {
    return false;
  }
  if (has_peers && !DecodePeers(r, m)) return false;
  if (r.done()) return true;  // without the kept area's group
  report::Kept k;
  if (!U64s(r, {&k.kept_bytes, &k.adopted_bytes, &k.adopted_samples, &k.adopt_rejected_samples}))
    return false;
  m->kept = k;
  if (r.done()) return true;  // without the sibling jobs' group
  report::Siblings s;
  if (!(r.Str(&s.through) && U64s(r, {&s.read_samples, &s.read_bytes, &s.read_failed,
                                      &s.served_samples, &s.served_bytes}))) {
    return false;
  }
  m->siblings = std::move(s);
  return true;
}

bool DecodePeers(Reader& r, report::StatusReport* m) {
  uint32_t n = 0;
  report::Peers p;
  if (!(r.U32(&p.node) && r.U32(&p.nodes) && r.Str(&p.state) && r.U64(&p.held_elsewhere) &&
        r.U64(&p.needed) &&
        U64s(r,
             {&p.served_samples, &p.served_bytes, &p.served_not_available, &p.fetched_samples,
              &p.fetched_bytes, &p.fetch_not_available, &p.timeouts, &p.refused, &p.malformed}) &&
        r.U32(&n))) {
    return false;
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t node = 0;
    if (!r.U32(&node)) return false;
    p.dead.push_back(node);
  }
  if (!(r.U64(&p.done_reports) && r.Str(&p.rma) &&
        U64s(r, {&p.served_rma, &p.fetched_rma, &p.rma_failed, &p.served_in_place, &p.pushes_sent,
                 &p.push_bytes_sent, &p.pushes_dropped, &p.pushes_received, &p.pushes_kept,
                 &p.copied_samples, &p.copied_bytes, &p.deferred, &p.fill_gave_up}))) {
    return false;
  }
  m->peers = std::move(p);
  return true;
}

bool DecodeBody(Reader& r, StatusRequest* m) {
  if (r.done()) return true;  // the base message: the status text
  uint16_t version = 0;
  if (!r.U16(&version)) return false;
  m->report_version = version;
  return true;
}
bool DecodeBody(Reader& r, StatusOk* m) {
  if (!r.Str(&m->text)) return false;
  if (r.done()) return true;
  uint16_t version = 0;
  if (!r.U16(&version) || version != report::kReportVersion) return false;
  report::StatusReport rep;
  if (!DecodeReport(r, &rep)) return false;
  m->report = std::move(rep);
  return true;
}
bool DecodeBody(Reader& r, CloseStream* m) {
  return r.U64(&m->stream_id);
}
bool DecodeBody(Reader& r, CloseOk* m) {
  return r.U64(&m->stream_id);
}
bool DecodeBody(Reader& r, Error* m) {
  return r.U32(&m->code) && r.Str(&m->message);
}
bool DecodeBody(Reader& r, Describe* m) {
  return r.U32(&m->sample_id);
}
bool DecodeBody(Reader& r, DescribeOk* m) {
  uint64_t label = 0;
  if (!(r.U32(&m->sample_id) && r.Str(&m->path) && r.U64(&m->offset) && r.U64(&m->length) &&
        r.U64(&label))) {
    return false;
  }
  m->label = static_cast<int64_t>(label);
  return true;
}
bool DecodeBody(Reader& r, ReadSample* m) {
  return r.U64(&m->fingerprint) && r.U32(&m->sample_id);
}
bool DecodeBody(Reader& r, SampleOk* m) {
  if (!(r.U32(&m->sample_id) && r.U64(&m->xxh3) && r.U64(&m->size) && r.Str(&m->data))) {
    return false;
  }
  // Inline exactly when small: the bytes are all there, or none (a memfd carries them).
  return m->size <= kMaxInlineSample ? m->data.size() == m->size : m->data.empty();
}

template <typename T>
Result<Message> DecodeAs(const Header& h, std::span<const std::byte> payload) {
  Reader r(payload);
  T body;
  if (!DecodeBody(r, &body)) {
    return Status::InvalidArgument("wire: " + std::string(TypeName(h.type)) +
                                   " payload is truncated");
  }
  if (!r.done()) {
    return Status::InvalidArgument("wire: " + std::string(TypeName(h.type)) +
                                   " payload has trailing bytes");
  }
  return Message{h.request_id, Body(std::move(body))};
}

// Waits until `sock` is readable; false with a status on timeout or error.
Status WaitReadable(int sock, std::chrono::milliseconds timeout) {
  pollfd p{sock, POLLIN, 0};
  int ms = timeout.count() < 0 ? -1 : static_cast<int>(std::min<int64_t>(timeout.count(), 1 << 30));
  for (;;) {
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return Status::Ok();
    if (rc == 0) return Status::TimedOut("wire: no message from the peer within the timeout");
    if (errno != EINTR) return Status::FromErrno(errno, "wire: poll");
  }
}

// Reads exactly `len` bytes, collecting at most two SCM_RIGHTS descriptors into `fd`, `fd2`.
Status RecvExact(int sock, std::byte* buf, size_t len, std::chrono::milliseconds timeout,
                 UniqueFd* fd, UniqueFd* fd2, bool first) {
  size_t got = 0;
  while (got < len) {
    NOPFS_RETURN_IF_ERROR(WaitReadable(sock, timeout));
    iovec iov{buf + got, len - got};
    alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * 4)> control{};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::FromErrno(errno, "wire: recvmsg");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received = -1;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (!fd->valid()) {
          fd->Reset(received);
        } else if (!fd2->valid()) {
          fd2->Reset(received);
        } else {
          ::close(received);  // at most two descriptors per message are meaningful
        }
      }
    }
    if (n == 0) {
      if (first && got == 0) return Status::Unavailable("wire: connection closed by the peer");
      return Status::InvalidArgument("wire: connection closed in the middle of a message");
    }
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

MsgType TypeOf(const Body& body) {
  return static_cast<MsgType>(body.index() + 1);  // Body's alternatives follow MsgType's order
}

std::string_view TypeName(MsgType type) {
  switch (type) {
    case MsgType::kHello:
      return "HELLO";
    case MsgType::kHelloOk:
      return "HELLO_OK";
    case MsgType::kOpenStream:
      return "OPEN_STREAM";
    case MsgType::kStreamOk:
      return "STREAM_OK";
    case MsgType::kStatus:
      return "STATUS";
    case MsgType::kStatusOk:
      return "STATUS_OK";
    case MsgType::kCloseStream:
      return "CLOSE_STREAM";
    case MsgType::kCloseOk:
      return "CLOSE_OK";
    case MsgType::kError:
      return "ERROR";
    case MsgType::kDescribe:
      return "DESCRIBE";
    case MsgType::kDescribeOk:
      return "DESCRIBE_OK";
    case MsgType::kReadSample:
      return "READ_SAMPLE";
    case MsgType::kSampleOk:
      return "SAMPLE_OK";
  }
  return "UNKNOWN";
}

Result<std::vector<std::byte>> Encode(const Message& message) {
  Writer w;
  w.U32(kMagic);
  w.U16(kVersion);
  w.U16(static_cast<uint16_t>(TypeOf(message.body)));
  w.U32(0);  // payload length, patched below
  w.U32(message.request_id);
  std::visit([&w](const auto& body) { EncodeBody(w, body); }, message.body);
  std::vector<std::byte>& out = w.bytes();
  size_t payload = out.size() - kHeaderSize;
  if (payload > kMaxPayload) {
    return Status::InvalidArgument("wire: " + std::string(TypeName(TypeOf(message.body))) +
                                   " payload of " + std::to_string(payload) +
                                   " bytes exceeds the limit of " + std::to_string(kMaxPayload));
  }
  w.PatchU32(8, static_cast<uint32_t>(payload));
  return std::move(out);
}

Result<Header> DecodeHeader(std::span<const std::byte> bytes) {
  if (bytes.size() < kHeaderSize) return Status::InvalidArgument("wire: header is truncated");
  if (coding::LoadLe32(bytes.data()) != kMagic) {
    return Status::InvalidArgument("wire: bad magic (not a nopfs client/service message)");
  }
  uint16_t version = coding::LoadLe16(bytes.data() + 4);
  if (version != kVersion) {
    return Status::InvalidArgument("wire: protocol version " + std::to_string(version) +
                                   " is not supported (this build speaks version " +
                                   std::to_string(kVersion) +
                                   "); use a client and nopfsd from the same release");
  }
  uint16_t type = coding::LoadLe16(bytes.data() + 6);
  if (type < static_cast<uint16_t>(MsgType::kHello) || type > static_cast<uint16_t>(kLastType)) {
    return Status::InvalidArgument("wire: unknown message type " + std::to_string(type));
  }
  Header h;
  h.type = static_cast<MsgType>(type);
  h.payload_length = coding::LoadLe32(bytes.data() + 8);
  h.request_id = coding::LoadLe32(bytes.data() + 12);
  if (h.payload_length > kMaxPayload) {
    return Status::InvalidArgument("wire: payload length " + std::to_string(h.payload_length) +
                                   " exceeds the limit of " + std::to_string(kMaxPayload));
  }
  return h;
}

Result<Message> DecodePayload(const Header& header, std::span<const std::byte> payload) {
  if (payload.size() != header.payload_length) {
    return Status::InvalidArgument("wire: payload length does not match the header");
  }
  switch (header.type) {
    case MsgType::kHello:
      return DecodeAs<Hello>(header, payload);
    case MsgType::kHelloOk:
      return DecodeAs<HelloOk>(header, payload);
    case MsgType::kOpenStream:
      return DecodeAs<OpenStream>(header, payload);
    case MsgType::kStreamOk:
      return DecodeAs<StreamOk>(header, payload);
    case MsgType::kStatus:
      return DecodeAs<StatusRequest>(header, payload);
    case MsgType::kStatusOk:
      return DecodeAs<StatusOk>(header, payload);
    case MsgType::kCloseStream:
      return DecodeAs<CloseStream>(header, payload);
    case MsgType::kCloseOk:
      return DecodeAs<CloseOk>(header, payload);
    case MsgType::kError:
      return DecodeAs<Error>(header, payload);
    case MsgType::kDescribe:
      return DecodeAs<Describe>(header, payload);
    case MsgType::kDescribeOk:
      return DecodeAs<DescribeOk>(header, payload);
    case MsgType::kReadSample:
      return DecodeAs<ReadSample>(header, payload);
    case MsgType::kSampleOk:
      return DecodeAs<SampleOk>(header, payload);
  }
  return Status::InvalidArgument("wire: unknown message type");
}

Result<Message> Decode(std::span<const std::byte> bytes) {
  Result<Header> h = DecodeHeader(bytes);
  if (!h.ok()) return h.status();
  if (bytes.size() - kHeaderSize != h->payload_length) {
    return Status::InvalidArgument("wire: message length does not match its header");
  }
  return DecodePayload(*h, bytes.subspan(kHeaderSize));
}

Status ToStatus(const Error& error) {
  uint32_t code = error.code;
  if (code == 0 || code > static_cast<uint32_t>(StatusCode::kInternal)) {
    code = static_cast<uint32_t>(StatusCode::kInternal);
  }
  return Status(static_cast<StatusCode>(code), error.message);
}

Error FromStatus(const Status& status) {
  return Error{static_cast<uint32_t>(status.code()), status.message()};
}

Status SendMessage(int sock, const Message& message, int pass_fd, int pass_fd2) {
  Result<std::vector<std::byte>> bytes = Encode(message);
  if (!bytes.ok()) return bytes.status();
  size_t sent = 0;
  while (sent < bytes->size()) {
    iovec iov{bytes->data() + sent, bytes->size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) std::array<char, CMSG_SPACE(2 * sizeof(int))> control{};
    std::array<int, 2> fds{};
    size_t nfds = 0;
    for (int f : {pass_fd, pass_fd2}) {
      if (f >= 0) fds[nfds++] = f;
    }
    if (nfds > 0 && sent == 0) {
      msg.msg_control = control.data();
      msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
      std::memcpy(CMSG_DATA(c), fds.data(), nfds * sizeof(int));
    }
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno,
                               "wire: sending " + std::string(TypeName(TypeOf(message.body))));
    }
    sent += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<Received> RecvMessage(int sock, std::chrono::milliseconds timeout) {
  Received out;
  std::array<std::byte, kHeaderSize> head{};
  NOPFS_RETURN_IF_ERROR(
      RecvExact(sock, head.data(), head.size(), timeout, &out.fd, &out.fd2, true));
  Result<Header> h = DecodeHeader(head);
  if (!h.ok()) return h.status();
  std::vector<std::byte> payload(h->payload_length);
  NOPFS_RETURN_IF_ERROR(
      RecvExact(sock, payload.data(), payload.size(), timeout, &out.fd, &out.fd2, false));
  Result<Message> m = DecodePayload(*h, payload);
  if (!m.ok()) return m.status();
  out.message = std::move(*m);
  return out;
}

Result<uint32_t> PeerUid(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno(errno, "wire: getsockopt(SO_PEERCRED)");
  }
  return static_cast<uint32_t>(cred.uid);
}

}  // namespace nopfs::wire
