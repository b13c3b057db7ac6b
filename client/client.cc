#include "client/client.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "protocol/ring.h"
#include "protocol/wire.h"

namespace nopfs::client {

// One socket to the service; requests and their answers are serialized by a mutex.
class Connection {
 public:
  Connection(wire::UniqueFd fd, std::chrono::milliseconds timeout)
      : fd_(std::move(fd)), timeout_(timeout), pid_(::getpid()) {}

  pid_t pid() const { return pid_; }
  // The socket, to watch for the service's hang-up (RingReader::WatchProducer).
  int fd() const { return fd_.get(); }

  // Sends `body` and waits for the answer of type `want` (an ERROR answer becomes its Status).
  Result<wire::Received> Call(wire::Body body, wire::MsgType want) {
    if (::getpid() != pid_) {
      return Status::FailedPrecondition(
          "nopfs client: a connection was used across fork(); connect again in the child");
    }
    MutexLock lock(&mu_);
    if (broken_) return Status::Unavailable("nopfs client: the connection to nopfsd is broken");
    const uint32_t id = ++next_id_;
    const wire::MsgType sent = wire::TypeOf(body);
    Status st = wire::SendMessage(fd_.get(), wire::Message{id, std::move(body)});
    if (!st.ok()) {
      broken_ = true;
      // A service that refuses the connection says why and shuts it down at once, possibly
      // before this request is sent: its reason, already in the socket, is the better error.
      Result<wire::Received> why = wire::RecvMessage(fd_.get(), std::chrono::milliseconds(100));
      if (why.ok() && why->message.request_id == 0) {
        if (auto* e = std::get_if<wire::Error>(&why->message.body)) return wire::ToStatus(*e);
      }
      return st.WithContext("nopfs client");
    }
    Result<wire::Received> r = wire::RecvMessage(fd_.get(), timeout_);
    if (!r.ok()) {
      broken_ = true;  // we can no longer tell which answer belongs to which request
      return r.status().WithContext("nopfs client: waiting for the answer to " +
                                    std::string(wire::TypeName(sent)));
    }
    if (auto* e = std::get_if<wire::Error>(&r->message.body);
        e != nullptr && r->message.request_id == 0) {
      broken_ = true;  // request id 0: the service refused the whole connection
      return wire::ToStatus(*e);
    }
    if (r->message.request_id != id) {
      broken_ = true;
      return Status::Corruption("nopfs client: answer for request " +
                                std::to_string(r->message.request_id) + ", expected " +
                                std::to_string(id));
    }
    if (auto* e = std::get_if<wire::Error>(&r->message.body)) return wire::ToStatus(*e);
    if (wire::TypeOf(r->message.body) != want) {
      broken_ = true;
      return Status::Corruption("nopfs client: nopfsd answered " +
                                std::string(wire::TypeName(wire::TypeOf(r->message.body))) +
                                " to " + std::string(wire::TypeName(sent)));
    }
    return r;
  }

  // The region (a RAM cache tier) that memfd `fd` holds, mapped once per connection: a stream
  // handed the memfd of an earlier stream shares its mapping, so its first reads fault in no
  // page the connection has read before (a fresh mapping of a tier costs a fault per few pages,
  // which on some machines takes longer than copying the sample).
  Result<std::shared_ptr<const ring::Region>> MapRegion(int fd, uint64_t bytes) {
    MutexLock lock(&regions_mu_);
    for (const std::shared_ptr<const ring::Region>& r : regions_) {
      if (r->bytes() >= bytes && r->Maps(fd)) return r;
    }
    Result<std::shared_ptr<const ring::Region>> m = ring::Region::Map(fd, bytes);
    if (!m.ok()) return m.status();
    // A smaller mapping of the same file is replaced; beyond a few files, the oldest is dropped
    // (the streams that use it keep it mapped).
    std::erase_if(regions_,
                  [&](const std::shared_ptr<const ring::Region>& r) { return r->Maps(fd); });
    if (regions_.size() >= kMaxRegions) regions_.erase(regions_.begin());
    regions_.push_back(*m);
    return m;
  }

 private:
  static constexpr size_t kMaxRegions = 4;

  Mutex mu_;
  Mutex regions_mu_;
  std::vector<std::shared_ptr<const ring::Region>> regions_ GUARDED_BY(regions_mu_);
  wire::UniqueFd fd_;
  std::chrono::milliseconds timeout_;
  pid_t pid_;
  uint32_t next_id_ GUARDED_BY(mu_) = 0;
  bool broken_ GUARDED_BY(mu_) = false;
};

namespace {

// Forks this process has made, counted in each child (pthread_atfork): a stream compares the count
// it was made with, instead of making a getpid() system call for every sample it hands out or
// takes back (on some virtual machines a system call costs more than the rest of Next()).
std::atomic<uint64_t> g_forks{0};

void CountFork() {
  g_forks.fetch_add(1, std::memory_order_relaxed);
}

// Whether forks are counted (the handler registered once, by the first stream).
bool ForksCounted() {
  static const bool registered = ::pthread_atfork(nullptr, nullptr, CountFork) == 0;
  return registered;
}

Status ForkError() {
  return Status::FailedPrecondition(
      "nopfs client: a stream was used across fork(); connect and open it again in the child");
}

}  // namespace

Stream::Stream(std::shared_ptr<Connection> conn, uint64_t id,
               std::unique_ptr<ring::RingReader> reader, bool read_once)
    : conn_(std::move(conn)),
      id_(id),
      reader_(std::move(reader)),
      read_once_(read_once),
      pid_(::getpid()),
      forks_counted_(ForksCounted()),
      forks_(g_forks.load(std::memory_order_relaxed)) {}

Stream::~Stream() {
  if (!closed_ && ::getpid() == pid_) {
    Status st = Close();
    (void)st;  // best effort: if the service is gone there is nothing left to free
  }
}

Status Stream::CheckPid() const {
  const bool same =
      forks_counted_ ? g_forks.load(std::memory_order_relaxed) == forks_ : ::getpid() == pid_;
  return same ? Status::Ok() : ForkError();
}

namespace {

// Whether a failure met after a batch call had samples is kept for the next call: what the stream
// delivered (a sample's error, the service gone) is; a timeout or a full slot table is not, since
// the next call waits again or finds the slots released.
bool Reportable(const Status& st) {
  return st.code() != StatusCode::kTimedOut && st.code() != StatusCode::kFailedPrecondition;
}

Sample ToSample(const ring::View& x) {
  return Sample{x.seq, x.sample_id, x.label, x.epoch, x.step, x.position, x.data, x.size};
}

}  // namespace

Result<std::optional<Sample>> Stream::Next(std::chrono::milliseconds timeout) {
  NOPFS_RETURN_IF_ERROR(CheckPid());
  if (closed_) return Status::FailedPrecondition("nopfs client: Next() on a closed stream");
  MutexLock lock(&take_mu_);
  if (!carried_.empty()) {
    Sample s = carried_.front();
    carried_.pop_front();
    return std::optional<Sample>(s);
  }
  if (!carried_error_.ok()) return std::exchange(carried_error_, Status::Ok());
  Result<std::optional<ring::View>> v = reader_->Next(timeout);
  if (!v.ok()) return v.status();
  if (!v->has_value()) return std::optional<Sample>();
  return std::optional<Sample>(ToSample(**v));
}

Status Stream::Release(const Sample& sample) {
  NOPFS_RETURN_IF_ERROR(CheckPid());
  if (closed_) return Status::FailedPrecondition("nopfs client: Release() on a closed stream");
  return reader_->Release(sample.seq);
}

Result<size_t> Stream::TakeLocked(size_t n, std::vector<Sample>* out,
                                  std::chrono::milliseconds timeout) {
  size_t taken = 0;
  while (taken < n && !carried_.empty()) {
    out->push_back(carried_.front());
    carried_.pop_front();
    ++taken;
  }
  if (taken == n) return taken;
  if (!carried_error_.ok()) {
    if (taken != 0) return taken;  // reported by the next call
    return std::exchange(carried_error_, Status::Ok());
  }
  std::vector<ring::View>& views = views_;
  views.clear();
  Result<size_t> r =
      reader_->NextBatch(n - taken, taken == 0 ? timeout : std::chrono::milliseconds(0), &views);
  if (!r.ok()) {
    if (taken == 0) return r.status();
    if (Reportable(r.status())) carried_error_ = r.status();
    return taken;
  }
  for (const ring::View& v : views)
    out->push_back(ToSample(v));
  return taken + *r;
}

Result<size_t> Stream::NextBatch(size_t n, std::vector<Sample>* out,
                                 std::chrono::milliseconds timeout) {
  NOPFS_RETURN_IF_ERROR(CheckPid());
  if (closed_) return Status::FailedPrecondition("nopfs client: NextBatch() on a closed stream");
  MutexLock lock(&take_mu_);
  return TakeLocked(n, out, timeout);
}

Status Stream::ReleaseBatch(std::span<const Sample> samples) {
  NOPFS_RETURN_IF_ERROR(CheckPid());
  if (closed_) {
    return Status::FailedPrecondition("nopfs client: ReleaseBatch() on a closed stream");
  }
  std::vector<uint64_t> seqs;
  seqs.reserve(samples.size());
  for (const Sample& s : samples)
    seqs.push_back(s.seq);
  return reader_->ReleaseBatch(seqs);
}

void Stream::CopyOut(const Sample& s, std::byte* dst) const {
  CopyOut(s, 0, s.size, dst);
}

void Stream::CopyOut(const Sample& s, uint64_t offset, uint64_t size, std::byte* dst) const {
  if (size == 0) return;
  const ring::Region* region = read_once_ ? reader_->region() : nullptr;
  if (region != nullptr && s.data >= region->data() && s.data < region->data() + region->bytes()) {
    region->Read(s.data + offset, size, dst);
  } else {
    std::memcpy(dst, s.data + offset, size);
  }
}

Result<size_t> Stream::FillBatch(size_t n, std::span<std::byte> dst,
                                 std::vector<BatchEntry>* entries,
                                 std::chrono::milliseconds timeout) {
  NOPFS_RETURN_IF_ERROR(CheckPid());
  if (closed_) return Status::FailedPrecondition("nopfs client: FillBatch() on a closed stream");
  MutexLock lock(&take_mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  size_t copied = 0;
  uint64_t used = 0;
  std::vector<Sample> taken;
  std::vector<uint64_t> seqs;
  while (copied < n) {
    taken.clear();
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    Result<size_t> r = TakeLocked(n - copied, &taken, left);
    if (!r.ok()) {
      if (copied == 0) return r.status();
      if (Reportable(r.status())) carried_error_ = r.status();
      break;
    }
    if (*r == 0) break;  // end of stream
    seqs.clear();
    size_t k = 0;
    for (; k < taken.size(); ++k) {
      const Sample& s = taken[k];
      if (s.size > dst.size() - used) break;
      CopyOut(s, dst.data() + used);
      entries->push_back(
          BatchEntry{s.sample_id, s.label, s.epoch, s.step, s.position, used, s.size});
      used += s.size;
      seqs.push_back(s.seq);
    }
    copied += k;
    // The rest did not fit: first in line for the next call, still held.
    carried_.insert(carried_.begin(), taken.begin() + static_cast<std::ptrdiff_t>(k), taken.end());
    if (Status st = reader_->ReleaseBatch(seqs); !st.ok()) return st;
    if (k < taken.size()) {
      if (copied == 0) {
        return Status::InvalidArgument(
            "nopfs client: sample " + std::to_string(taken[k].sample_id) + " is " +
            std::to_string(taken[k].size) + " bytes, larger than the batch buffer (" +
            std::to_string(dst.size()) + " bytes); give a buffer of at least " +
            std::to_string(taken[k].size) + " bytes (it stays first in line)");
      }
      break;
    }
  }
  return copied;
}

bool Stream::ServiceGone() const {
  return reader_->ProducerGone();
}

Stats Stream::stats() const {
  ring::RingStats r = reader_->stats();
  return Stats{r.samples,        r.bytes,           r.next_calls,
               r.stall_ns_total, r.stall_ns_median, r.stall_ns_p99};
}

Status Stream::Close() {
  NOPFS_RETURN_IF_ERROR(CheckPid());
  if (closed_.exchange(true)) return Status::Ok();
  Result<wire::Received> r = conn_->Call(wire::CloseStream{id_}, wire::MsgType::kCloseOk);
  return r.ok() ? Status::Ok() : r.status();
}

Result<std::unique_ptr<Client>> Client::Connect(std::string socket_path) {
  ConnectOptions o;
  o.socket_path = std::move(socket_path);
  return Connect(o);
}

Result<std::unique_ptr<Client>> Client::Connect(const ConnectOptions& options) {
  std::string path = options.socket_path;
  if (path.empty()) {
    const char* env = std::getenv("NOPFS_SOCKET");
    if (env == nullptr || *env == '\0') {
      return Status::InvalidArgument(
          "nopfs client: no socket path given and NOPFS_SOCKET is not set (run inside a job "
          "started with --nopfs, or pass the path of nopfsd's socket)");
    }
    path = env;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("nopfs client: socket path is too long (" +
                                   std::to_string(path.size()) + " bytes, at most " +
                                   std::to_string(sizeof(addr.sun_path) - 1) + "): " + path);
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  wire::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno(errno, "nopfs client: socket");
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::FromErrno(errno, "nopfs client: connecting to nopfsd at " + path);
  }
  Result<uint32_t> uid = wire::PeerUid(fd.get());
  if (!uid.ok()) return uid.status();
  const uint32_t want = options.expected_server_uid.value_or(static_cast<uint32_t>(::getuid()));
  if (*uid != want) {
    return Status::PermissionDenied("nopfs client: the service at " + path + " runs as uid " +
                                    std::to_string(*uid) + ", not as uid " + std::to_string(want) +
                                    "; refusing to use it");
  }
  std::unique_ptr<Client> c(new Client());
  c->conn_ = std::make_shared<Connection>(std::move(fd), options.timeout);
  Result<wire::Received> r = c->conn_->Call(
      wire::Hello{wire::kVersion, static_cast<uint32_t>(::getpid())}, wire::MsgType::kHelloOk);
  if (!r.ok()) return r.status();
  const auto& ok = std::get<wire::HelloOk>(r->message.body);
  c->info_ = ServiceInfo{ok.service_version, ok.job_id, ok.ranks, ok.first_rank, ok.local_ranks};
  return c;
}

Client::~Client() = default;

Result<std::unique_ptr<Stream>> Client::Open(uint32_t rank, uint32_t epoch, uint64_t step) {
  OpenOptions o;
  o.epoch = epoch;
  o.step = step;
  return Open(rank, o);
}

Result<std::unique_ptr<Stream>> Client::Open(uint32_t rank, const OpenOptions& options) {
  if (options.workers == 0 || options.worker >= options.workers || options.batch == 0) {
    return Status::InvalidArgument(
        "nopfs client: a stream share needs worker < workers and a "
        "batch of at least 1 (got worker " +
        std::to_string(options.worker) + " of " + std::to_string(options.workers) + ", batch " +
        std::to_string(options.batch) + ")");
  }
  wire::OpenStream req{rank, options.epoch, options.step, std::nullopt, std::nullopt, std::nullopt};
  if (options.workers > 1 || options.epochs != 0) {
    req.share = wire::StreamShare{options.worker, options.workers, options.batch, options.epochs};
  }
  if (options.zero_copy) req.flags = wire::kOpenAcceptRegion;
  if (options.owner_pid != 0) req.owner = options.owner_pid;
  Result<wire::Received> r = conn_->Call(req, wire::MsgType::kStreamOk);
  if (!r.ok()) return r.status();
  const auto ok = std::get<wire::StreamOk>(r->message.body);
  // From here on the service holds a stream for us: close it if the ring is unusable.
  auto abandon = [&](Status st) {
    Result<wire::Received> c =
        conn_->Call(wire::CloseStream{ok.stream_id}, wire::MsgType::kCloseOk);
    (void)c;
    return st;
  };
  if (!r->fd.valid()) {
    return abandon(Status::Corruption("nopfs client: STREAM_OK arrived without the ring's memfd"));
  }
  Result<std::unique_ptr<ring::RingReader>> reader =
      ring::RingReader::Open(std::move(r->fd), ok.capacity, ok.slot_count);
  if (!reader.ok()) return abandon(reader.status());
  // A killed nopfsd never finishes or cancels the ring: its socket's hang-up tells Next().
  (*reader)->WatchProducer(conn_->fd());
  if (ok.region_bytes) {
    if (!options.zero_copy || !r->fd2.valid()) {
      return abandon(Status::Corruption(
          "nopfs client: STREAM_OK names a region the client did not ask for or did not attach"));
    }
    Result<std::shared_ptr<const ring::Region>> region =
        conn_->MapRegion(r->fd2.get(), *ok.region_bytes);
    if (!region.ok()) return abandon(region.status());
    if (Status a = (*reader)->AttachRegion(std::move(*region)); !a.ok()) return abandon(a);
  }
  return std::unique_ptr<Stream>(
      new Stream(conn_, ok.stream_id, std::move(*reader), options.read_once));
}

Result<SampleInfo> Client::Describe(uint32_t sample_id) {
  Result<wire::Received> r = conn_->Call(wire::Describe{sample_id}, wire::MsgType::kDescribeOk);
  if (!r.ok()) return r.status();
  const wire::DescribeOk& d = std::get<wire::DescribeOk>(r->message.body);
  if (d.sample_id != sample_id) {
    return Status::Internal("nopfsd described sample " + std::to_string(d.sample_id) +
                            " when asked for " + std::to_string(sample_id));
  }
  return SampleInfo{d.path, d.offset, d.length, d.label};
}

Result<std::string> Client::StatusText() {
  Result<wire::Received> r = conn_->Call(wire::StatusRequest{}, wire::MsgType::kStatusOk);
  if (!r.ok()) return r.status();
  return std::get<wire::StatusOk>(r->message.body).text;
}

Result<report::StatusReport> Client::Report() {
  Result<wire::Received> r =
      conn_->Call(wire::StatusRequest{report::kReportVersion}, wire::MsgType::kStatusOk);
  if (!r.ok()) return r.status();
  std::optional<report::StatusReport>& rep = std::get<wire::StatusOk>(r->message.body).report;
  if (!rep) {
    return Status::Internal(
        "nopfsd answered STATUS without the structured report it was asked for");
  }
  return std::move(*rep);
}

}  // namespace nopfs::client
