// The C API (nopfs_client.h) over the C++ client. No exception crosses it.
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/nopfs_client.h"

struct nopfs_client {
  std::unique_ptr<nopfs::client::Client> impl;
};
struct nopfs_stream {
  std::unique_ptr<nopfs::client::Stream> impl;
};

namespace {

thread_local std::string g_last_error;

int Fail(const nopfs::Status& st) {
  g_last_error = st.message();
  return -static_cast<int>(st.ok() ? nopfs::StatusCode::kInternal : st.code());
}

int FailNull(const char* what) {
  return Fail(nopfs::Status::InvalidArgument(std::string("nopfs: ") + what + " is NULL"));
}

// Runs `f`, turning an escaping exception (allocation failure) into NOPFS_E_INTERNAL.
template <typename F>
int Guard(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Fail(nopfs::Status::Internal(std::string("nopfs: ") + e.what()));
  }
}

}  // namespace

extern "C" {

const char* nopfs_last_error(void) {
  return g_last_error.c_str();
}

int nopfs_connect(const char* socket_path, nopfs_client** out) {
  if (out == nullptr) return FailNull("out");
  return Guard([&] {
    auto c = nopfs::client::Client::Connect(socket_path == nullptr ? "" : socket_path);
    if (!c.ok()) return Fail(c.status());
    *out = new nopfs_client{std::move(*c)};
    return 0;
  });
}

void nopfs_close(nopfs_client* client) {
  delete client;
}

int nopfs_open(nopfs_client* client, uint32_t rank, uint32_t epoch, uint64_t step,
               nopfs_stream** out) {
  if (client == nullptr) return FailNull("client");
  if (out == nullptr) return FailNull("out");
  return Guard([&] {
    auto s = client->impl->Open(rank, epoch, step);
    if (!s.ok()) return Fail(s.status());
    *out = new nopfs_stream{std::move(*s)};
    return 0;
  });
}

int nopfs_open_share(nopfs_client* client, uint32_t rank, uint32_t epoch, uint64_t step,
                     uint32_t worker, uint32_t workers, uint64_t batch, uint32_t epochs,
                     nopfs_stream** out) {
  if (client == nullptr) return FailNull("client");
  if (out == nullptr) return FailNull("out");
  return Guard([&] {
    nopfs::client::OpenOptions o;
    o.epoch = epoch;
    o.step = step;
    o.worker = worker;
    o.workers = workers;
    o.batch = batch;
    o.epochs = epochs;
    auto s = client->impl->Open(rank, o);
    if (!s.ok()) return Fail(s.status());
    *out = new nopfs_stream{std::move(*s)};
    return 0;
  });
}

namespace {

std::chrono::milliseconds CTimeout(int64_t timeout_ms) {
  // "Without limit" is a year: long enough for any job, small enough for the deadline sum.
  return timeout_ms < 0 ? std::chrono::milliseconds(std::chrono::hours(24 * 365))
                        : std::chrono::milliseconds(timeout_ms);
}

int CheckBatchSize(size_t n) {
  if (n > static_cast<size_t>(INT_MAX)) {
    return Fail(nopfs::Status::InvalidArgument("nopfs: a batch of " + std::to_string(n) +
                                               " samples is too large; ask for at most " +
                                               std::to_string(INT_MAX)));
  }
  return 0;
}

}  // namespace

int nopfs_next(nopfs_stream* stream, nopfs_sample* sample, int64_t timeout_ms) {
  if (stream == nullptr) return FailNull("stream");
  if (sample == nullptr) return FailNull("sample");
  return Guard([&] {
    auto r = stream->impl->Next(CTimeout(timeout_ms));
    if (!r.ok()) return Fail(r.status());
    if (!r->has_value()) return 0;
    const nopfs::client::Sample& s = **r;
    *sample =
        nopfs_sample{s.seq, s.sample_id, s.epoch, s.label, s.step, s.position, s.data, s.size};
    return 1;
  });
}

int nopfs_release(nopfs_stream* stream, const nopfs_sample* sample) {
  if (stream == nullptr) return FailNull("stream");
  if (sample == nullptr) return FailNull("sample");
  return Guard([&] {
    nopfs::client::Sample s;
    s.seq = sample->seq;
    nopfs::Status st = stream->impl->Release(s);
    return st.ok() ? 0 : Fail(st);
  });
}

int nopfs_next_batch(nopfs_stream* stream, nopfs_sample* samples, size_t n, int64_t timeout_ms) {
  if (stream == nullptr) return FailNull("stream");
  if (samples == nullptr && n != 0) return FailNull("samples");
  if (int rc = CheckBatchSize(n); rc < 0) return rc;
  return Guard([&] {
    std::vector<nopfs::client::Sample> got;
    got.reserve(n);
    auto r = stream->impl->NextBatch(n, &got, CTimeout(timeout_ms));
    if (!r.ok()) return Fail(r.status());
    for (size_t i = 0; i < got.size(); ++i) {
      const nopfs::client::Sample& s = got[i];
      samples[i] =
          nopfs_sample{s.seq, s.sample_id, s.epoch, s.label, s.step, s.position, s.data, s.size};
    }
    return static_cast<int>(got.size());
  });
}

int nopfs_release_batch(nopfs_stream* stream, const nopfs_sample* samples, size_t n) {
  if (stream == nullptr) return FailNull("stream");
  if (samples == nullptr && n != 0) return FailNull("samples");
  return Guard([&] {
    std::vector<nopfs::client::Sample> s(n);
    for (size_t i = 0; i < n; ++i)
      s[i].seq = samples[i].seq;
    nopfs::Status st = stream->impl->ReleaseBatch(s);
    return st.ok() ? 0 : Fail(st);
  });
}

int nopfs_fill_batch(nopfs_stream* stream, size_t n, void* buffer, size_t capacity,
                     nopfs_batch_entry* entries, int64_t timeout_ms) {
  if (stream == nullptr) return FailNull("stream");
  if (buffer == nullptr && capacity != 0) return FailNull("buffer");
  if (entries == nullptr && n != 0) return FailNull("entries");
  if (int rc = CheckBatchSize(n); rc < 0) return rc;
  return Guard([&] {
    std::vector<nopfs::client::BatchEntry> got;
    got.reserve(n);
    auto r = stream->impl->FillBatch(n, {static_cast<std::byte*>(buffer), capacity}, &got,
                                     CTimeout(timeout_ms));
    if (!r.ok()) return Fail(r.status());
    for (size_t i = 0; i < got.size(); ++i) {
      const nopfs::client::BatchEntry& e = got[i];
      entries[i] =
          nopfs_batch_entry{e.sample_id, e.epoch, e.label, e.step, e.position, e.offset, e.size};
    }
    return static_cast<int>(got.size());
  });
}

int nopfs_stream_stats(const nopfs_stream* stream, nopfs_stats* out) {
  if (stream == nullptr) return FailNull("stream");
  if (out == nullptr) return FailNull("out");
  nopfs::client::Stats s = stream->impl->stats();
  *out = nopfs_stats{s.samples,        s.bytes,           s.next_calls,
                     s.stall_ns_total, s.stall_ns_median, s.stall_ns_p99};
  return 0;
}

void nopfs_stream_close(nopfs_stream* stream) {
  delete stream;
}

char* nopfs_status_text(nopfs_client* client) {
  if (client == nullptr) {
    FailNull("client");
    return nullptr;
  }
  try {
    auto t = client->impl->StatusText();
    if (!t.ok()) {
      Fail(t.status());
      return nullptr;
    }
    char* out = static_cast<char*>(std::malloc(t->size() + 1));
    if (out == nullptr) {
      Fail(nopfs::Status::ResourceExhausted("nopfs: out of memory for the status text"));
      return nullptr;
    }
    std::memcpy(out, t->data(), t->size());
    out[t->size()] = '\0';
    return out;
  } catch (const std::exception& e) {
    Fail(nopfs::Status::Internal(std::string("nopfs: ") + e.what()));
    return nullptr;
  }
}

}  // extern "C"
