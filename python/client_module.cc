// nopfs._client: the Python binding of the nopfs client (client/client.h) and of the planner's
// per-rank order (policy/partition.h). Pure local IPC: a UNIX socket and shared memory, no
// libfabric, so DataLoader worker processes can each connect on their own.
//
// Buffer lifetime (docs/python.md): Stream.next() returns a Sample whose bytes live in the
// stream's shared-memory ring. Sample.data (a read-only memoryview) and Sample.numpy() (a
// read-only uint8 array) are views of those bytes, not copies; each view keeps the sample's slot
// alive. Sample.release() gives the slot back to the service and refuses (BufferError) while a
// view is still alive, so a view can never show bytes the service has reused. A Sample dropped
// without release() is released when its last view goes away. Sample.tobytes() copies.
//
// Thread safety: a Client and its Streams may be used from several Python threads; next() waits
// without the GIL. Objects must not be used across fork() (they raise nopfs.Error in the child):
// connect in the child, as nopfs.torch does in each DataLoader worker.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "client/client.h"
#include "common/mutex.h"
#include "common/status.h"
#include "policy/job.h"
#include "policy/partition.h"

namespace py = pybind11;

namespace nopfs::python {
namespace {

// The module's exception types (created in PYBIND11_MODULE; they live as long as the module).
PyObject* g_error = nullptr;         // nopfs.Error(RuntimeError)
PyObject* g_sample_error = nullptr;  // nopfs.SampleError(Error): one sample could not be read
PyObject* g_unavailable = nullptr;   // nopfs.UnavailableError(Error): no service, or it went away
PyObject* g_timeout = nullptr;       // nopfs.TimeoutError(Error, TimeoutError)

[[noreturn]] void Raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

[[noreturn]] void RaiseStatus(const Status& st) {
  if (st.code() == StatusCode::kUnavailable) Raise(g_unavailable, st.message());
  if (st.code() == StatusCode::kTimedOut) Raise(g_timeout, st.message());
  Raise(g_error, st.message());
}

// "sample 17 (/pfs/a.jpg): ..." -> 17: how the service words a failed sample (staging.cc).
std::optional<uint32_t> FailedSampleId(const std::string& message) {
  static constexpr std::string_view kPrefix = "sample ";
  if (message.rfind(kPrefix, 0) != 0) return std::nullopt;
  uint64_t id = 0;
  size_t i = kPrefix.size();
  const size_t digits = i;
  while (i < message.size() && message[i] >= '0' && message[i] <= '9' && id <= UINT32_MAX) {
    id = id * 10 + static_cast<uint64_t>(message[i] - '0');
    ++i;
  }
  if (i == digits || id > UINT32_MAX || message.compare(i, 2, " (") != 0) return std::nullopt;
  return static_cast<uint32_t>(id);
}

// The client, shared by its streams (a stream may outlive the Python Client object).
class ClientHolder {
 public:
  explicit ClientHolder(std::unique_ptr<client::Client> c) : client_(std::move(c)) {}
  client::Client& get() { return *client_; }

 private:
  std::unique_ptr<client::Client> client_;
};

// One open stream. Next/Release hold the lock shared (the client allows them concurrently),
// Close holds it exclusively, so Close never races with them.
class StreamHolder {
 public:
  StreamHolder(std::shared_ptr<ClientHolder> c, std::unique_ptr<client::Stream> s)
      : client_(std::move(c)), stream_(std::move(s)) {}

  Result<std::optional<client::Sample>> Next(std::chrono::milliseconds timeout) {
    ReaderLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("nopfs: next() on a closed stream");
    return stream_->Next(timeout);
  }
  Status Release(const client::Sample& s) {
    ReaderLock lock(&mu_);
    if (closed_) return Status::Ok();  // the ring is gone with the stream: nothing to give back
    return stream_->Release(s);
  }
  Result<size_t> NextBatch(size_t n, std::vector<client::Sample>* out,
                           std::chrono::milliseconds timeout) {
    ReaderLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("nopfs: next_batch() on a closed stream");
    return stream_->NextBatch(n, out, timeout);
  }
  Status ReleaseBatch(std::span<const client::Sample> samples) {
    ReaderLock lock(&mu_);
    if (closed_) return Status::Ok();  // the ring is gone with the stream
    return stream_->ReleaseBatch(samples);
  }
  Result<size_t> FillBatch(size_t n, std::span<std::byte> dst,
                           std::vector<client::BatchEntry>* entries,
                           std::chrono::milliseconds timeout) {
    ReaderLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("nopfs: next_batch_into() on a closed stream");
    return stream_->FillBatch(n, dst, entries, timeout);
  }
  // A failure met after a batch call had samples to return: raised by the next call.
  void Defer(Status st) {
    MutexLock lock(&deferred_mu_);
    deferred_ = std::move(st);
  }
  Status TakeDeferred() {
    MutexLock lock(&deferred_mu_);
    return std::exchange(deferred_, Status::Ok());
  }
  Status Close() {
    WriterLock lock(&mu_);
    if (closed_) return Status::Ok();
    closed_ = true;
    return stream_->Close();
  }
  client::Stats stats() const { return stream_->stats(); }
  // A held sample's bytes to dst (client::Stream::CopyOut; the mapping outlives Close()).
  void CopyOut(const client::Sample& s, std::byte* dst) const { stream_->CopyOut(s, dst); }
  uint64_t id() const { return stream_->id(); }
  bool service_gone() const { return stream_->ServiceGone(); }
  bool closed() const {
    ReaderLock lock(&mu_);
    return closed_;
  }
  ClientHolder& client() { return *client_; }

 private:
  std::shared_ptr<ClientHolder> client_;
  mutable SharedMutex mu_;
  bool closed_ GUARDED_BY(mu_) = false;
  Mutex deferred_mu_;
  Status deferred_ GUARDED_BY(deferred_mu_) = Status::Ok();
  // Declared last: destroyed first. Its mapping stays valid after Close() (the memfd is ours
  // until unmapped), so views of samples outlive a closed stream safely.
  std::unique_ptr<client::Stream> stream_;
};

// The exporter of a sample's bytes: owns the slot until it is destroyed or released.
class SampleBuffer {
 public:
  SampleBuffer(std::shared_ptr<StreamHolder> stream, const client::Sample& s)
      : stream_(std::move(stream)), sample_(s) {}
  ~SampleBuffer() {
    if (!released_) (void)stream_->Release(sample_);  // best effort: e.g. in a forked child
  }
  SampleBuffer(const SampleBuffer&) = delete;
  SampleBuffer& operator=(const SampleBuffer&) = delete;

  Status Release() {
    if (released_) return Status::Ok();
    released_ = true;
    return stream_->Release(sample_);
  }
  const client::Sample& sample() const { return sample_; }

 private:
  std::shared_ptr<StreamHolder> stream_;
  client::Sample sample_;
  bool released_ = false;
};

// What Python sees of one sample.
class PySample {
 public:
  PySample(const client::Sample& s, py::object buffer) : meta_(s), buffer_(std::move(buffer)) {}

  const client::Sample& meta() const { return meta_; }
  bool released() const { return !buffer_; }

  py::memoryview Data() const {
    CheckLive("data");
    return py::memoryview(buffer_);
  }
  py::array Numpy() const {
    CheckLive("numpy()");
    py::array a(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(meta_.size)}, {1},
                static_cast<const void*>(meta_.data), buffer_);
    a.attr("setflags")(py::arg("write") = false);
    return a;
  }
  py::bytes ToBytes() const {
    CheckLive("tobytes()");
    return py::bytes(reinterpret_cast<const char*>(meta_.data), meta_.size);
  }
  // Gives up this sample's hold on its slot: released now if no view is alive, else when the last
  // one goes.
  void Drop() { buffer_ = py::object(); }
  void Release() {
    if (!buffer_) return;
    // One reference is ours; every other one is a live view (memoryview, array, ...).
    const py::ssize_t views = buffer_.ref_count() - 1;
    if (views > 0) {
      Raise(PyExc_BufferError,
            "nopfs: sample " + std::to_string(meta_.sample_id) + " has " + std::to_string(views) +
                " live view(s) of its shared-memory buffer; drop them (del) or copy the bytes "
                "(bytes(view), array.copy()) before release()");
    }
    Status st = buffer_.cast<SampleBuffer&>().Release();
    buffer_ = py::object();
    if (!st.ok()) RaiseStatus(st);
  }

 private:
  void CheckLive(const char* what) const {
    if (!buffer_) {
      Raise(PyExc_ValueError, "nopfs: " + std::string(what) + " of sample " +
                                  std::to_string(meta_.sample_id) +
                                  " after release(): its bytes belong to the service again");
    }
  }
  client::Sample meta_;
  py::object buffer_;  // a SampleBuffer; empty after release()
};

std::chrono::milliseconds ToMs(double seconds) {
  if (seconds < 0) throw py::value_error("nopfs: a timeout must be >= 0 seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// A stream's failure as Python sees it: a sample the service could not read is a SampleError
// naming it (the stream goes on after it), the rest RaiseStatus's.
[[noreturn]] void RaiseStreamError(StreamHolder& stream, const Status& st) {
  if (std::optional<uint32_t> id = FailedSampleId(st.message())) {
    py::object path = py::none();
    Result<client::SampleInfo> info = stream.client().get().Describe(*id);
    if (info.ok()) path = py::str(info->path);
    PyObject* e = PyObject_CallFunction(g_sample_error, "s", st.message().c_str());
    if (e == nullptr) throw py::error_already_set();
    py::object exc = py::reinterpret_steal<py::object>(e);
    exc.attr("sample_id") = *id;
    exc.attr("path") = path;
    exc.attr("code") = static_cast<int>(st.code());
    PyErr_SetObject(g_sample_error, exc.ptr());
    throw py::error_already_set();
  }
  RaiseStatus(st);
}

// Waits are cut into slices, so that Ctrl-C (and other signals) reach Python.
constexpr std::chrono::milliseconds kSlice{100};

std::chrono::steady_clock::time_point DeadlineOf(std::optional<double> timeout) {
  return timeout ? std::chrono::steady_clock::now() + ToMs(*timeout)
                 : std::chrono::steady_clock::time_point::max();
}

// The next wait slice before `deadline`.
std::chrono::milliseconds SliceBefore(std::chrono::steady_clock::time_point deadline) {
  if (deadline == std::chrono::steady_clock::time_point::max()) return kSlice;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::clamp(left, std::chrono::milliseconds(0), kSlice);
}

// Waits for the next sample in slices.
py::object NextSample(const std::shared_ptr<StreamHolder>& stream, std::optional<double> timeout) {
  if (Status d = stream->TakeDeferred(); !d.ok()) RaiseStreamError(*stream, d);
  const auto deadline = DeadlineOf(timeout);
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    const auto left =
        deadline == std::chrono::steady_clock::time_point::max()
            ? kSlice
            : std::min<std::chrono::milliseconds>(
                  kSlice, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    Result<std::optional<client::Sample>> r = Status::Internal("unset");
    {
      py::gil_scoped_release nogil;
      r = stream->Next(std::max(left, std::chrono::milliseconds(0)));
    }
    if (r.ok()) {
      if (!r->has_value()) return py::none();
      const client::Sample& s = **r;
      py::object buf = py::cast(std::make_unique<SampleBuffer>(stream, s));
      return py::cast(PySample(s, std::move(buf)));
    }
    const Status& st = r.status();
    if (st.code() == StatusCode::kTimedOut && std::chrono::steady_clock::now() < deadline) {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      continue;
    }
    RaiseStreamError(*stream, st);
  }
}

// The samples of one next_batch() call, held in the ring until released (by Batch.release(), or
// when the Batch and every view of its samples are gone).
class BatchHolder {
 public:
  BatchHolder(std::shared_ptr<StreamHolder> stream, std::vector<client::Sample> samples)
      : stream_(std::move(stream)), samples_(std::move(samples)) {}
  ~BatchHolder() {
    // Best effort (e.g. in a forked child); an empty holder (a dropped Batch's) has no stream.
    if (!released_ && stream_ != nullptr) (void)stream_->ReleaseBatch(samples_);
  }
  BatchHolder(const BatchHolder&) = delete;
  BatchHolder& operator=(const BatchHolder&) = delete;

  Status Release() {
    if (released_) return Status::Ok();
    released_ = true;
    return stream_->ReleaseBatch(samples_);
  }
  bool released() const { return released_; }
  const std::vector<client::Sample>& samples() const { return samples_; }
  void CopyOut(size_t i, std::byte* dst) const { stream_->CopyOut(samples_[i], dst); }

 private:
  std::shared_ptr<StreamHolder> stream_;
  std::vector<client::Sample> samples_;
  bool released_ = false;
};

// The exporter of one sample of a batch (what a view made by Batch.views() refers to).
class BatchSampleBuffer {
 public:
  BatchSampleBuffer(std::shared_ptr<BatchHolder> batch, size_t index)
      : batch_(std::move(batch)), index_(index) {}
  const client::Sample& sample() const { return batch_->samples()[index_]; }

 private:
  std::shared_ptr<BatchHolder> batch_;
  size_t index_;
};

// A writable, contiguous byte buffer (bytearray, numpy uint8 array, a torch.uint8 tensor's
// .numpy()), held while we write into it.
struct WritableBytes {
  py::buffer_info info;
  std::span<std::byte> span;
};

WritableBytes RequestWritable(const py::buffer& out, const char* call) {
  py::buffer_info info;
  try {
    info = out.request(/*writable=*/true);
  } catch (const py::error_already_set&) {
    throw py::value_error(std::string("nopfs: ") + call +
                          ": out must be a writable buffer of bytes (a bytearray, a numpy uint8 "
                          "array, or tensor.numpy() of a contiguous torch.uint8 tensor)");
  }
  py::ssize_t expect = info.itemsize;
  bool contiguous = true;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    const auto u = static_cast<size_t>(d);
    if (info.shape[u] > 1 && info.strides[u] != expect) contiguous = false;
    expect *= info.shape[u];
  }
  if (!contiguous) {
    throw py::value_error(std::string("nopfs: ") + call +
                          ": out must be contiguous (pass tensor.contiguous() or a fresh "
                          "torch.empty(n, dtype=torch.uint8))");
  }
  const auto bytes = static_cast<size_t>(info.size * info.itemsize);
  std::span<std::byte> span(static_cast<std::byte*>(info.ptr), bytes);
  return WritableBytes{std::move(info), span};
}

template <typename T>
py::array_t<T> ArrayOf(size_t n) {
  return py::array_t<T>(static_cast<py::ssize_t>(n));
}

// What Python sees of a batch: its samples' metadata as arrays, and their bytes by one copy into
// a caller's buffer (copy_into), as bytes objects (tobytes) or as views (views).
class PyBatch {
 public:
  explicit PyBatch(std::shared_ptr<BatchHolder> h) : holder_(std::move(h)) {}

  size_t size() const { return holder_->samples().size(); }
  uint64_t nbytes() const {
    uint64_t n = 0;
    for (const client::Sample& s : holder_->samples())
      n += s.size;
    return n;
  }
  template <typename T, typename F>
  py::array_t<T> Field(F f) const {
    const auto& v = holder_->samples();
    py::array_t<T> a = ArrayOf<T>(v.size());
    T* p = a.mutable_data();
    for (size_t i = 0; i < v.size(); ++i)
      p[i] = static_cast<T>(f(v[i]));
    return a;
  }
  // offsets[i]: where sample i starts when the samples lie back to back; offsets[n] = nbytes.
  py::array_t<int64_t> Offsets() const {
    const auto& v = holder_->samples();
    py::array_t<int64_t> a = ArrayOf<int64_t>(v.size() + 1);
    int64_t* p = a.mutable_data();
    int64_t at = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      p[i] = at;
      at += static_cast<int64_t>(v[i].size);
    }
    p[v.size()] = at;
    return a;
  }
  // Copies the samples back to back into out[offset:], without the GIL; returns the end offset.
  uint64_t CopyInto(const py::buffer& out, uint64_t offset) const {
    CheckLive("copy_into()");
    WritableBytes w = RequestWritable(out, "Batch.copy_into()");
    const uint64_t need = nbytes();
    if (offset > w.span.size() || need > w.span.size() - offset) {
      throw py::value_error("nopfs: Batch.copy_into(): the batch is " + std::to_string(need) +
                            " bytes, the buffer has " +
                            std::to_string(offset > w.span.size() ? 0 : w.span.size() - offset) +
                            " bytes from offset " + std::to_string(offset) +
                            "; give a buffer of at least offset + batch.nbytes bytes");
    }
    {
      py::gil_scoped_release nogil;
      std::byte* dst = w.span.data() + offset;
      const auto& v = holder_->samples();
      for (size_t i = 0; i < v.size(); ++i) {
        holder_->CopyOut(i, dst);
        dst += v[i].size;
      }
    }
    return offset + need;
  }
  py::list ToBytes() const {
    CheckLive("tobytes()");
    // The objects are made with the GIL, their bytes copied without it (nothing else sees them
    // yet): the copy, and the page faults of fresh memory, overlap other Python threads.
    const auto& v = holder_->samples();
    py::list out(v.size());
    std::vector<char*> dst(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<py::ssize_t>(v[i].size));
      if (b == nullptr) throw py::error_already_set();
      dst[i] = PyBytes_AS_STRING(b);
      out[i] = py::reinterpret_steal<py::object>(b);
    }
    {
      py::gil_scoped_release nogil;
      for (size_t i = 0; i < v.size(); ++i)
        holder_->CopyOut(i, reinterpret_cast<std::byte*>(dst[i]));
    }
    return out;
  }
  py::list Views() {
    CheckLive("views()");
    const auto& v = holder_->samples();
    py::list out(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      py::object e = py::cast(std::make_unique<BatchSampleBuffer>(holder_, i));
      out[i] = py::memoryview(e);
      exporters_.push_back(std::move(e));
    }
    return out;
  }
  void Release() {
    if (released()) return;
    size_t alive = 0;
    for (const py::object& e : exporters_) {
      if (e.ref_count() > 1) ++alive;  // one reference is ours; the others are views
    }
    if (alive > 0) {
      Raise(PyExc_BufferError,
            "nopfs: " + std::to_string(alive) +
                " sample(s) of this batch have live views of their shared-memory buffers; "
                "drop them (del) or copy the bytes (bytes(view)) before release()");
    }
    exporters_.clear();
    Status st = holder_->Release();
    if (!st.ok()) RaiseStatus(st);
  }
  // Gives up this batch's hold (leaving a `with` block on an exception): released now if no view
  // is alive, else when the last one goes.
  void Drop() {
    exporters_.clear();
    dropped_ = true;
    holder_ = std::make_shared<BatchHolder>(nullptr, std::vector<client::Sample>());
  }
  bool released() const { return dropped_ || holder_->released(); }

 private:
  void CheckLive(const char* what) const {
    if (released()) {
      Raise(PyExc_ValueError, "nopfs: Batch." + std::string(what) +
                                  " after release(): its bytes belong to the service again");
    }
  }
  bool dropped_ = false;
  std::shared_ptr<BatchHolder> holder_;
  std::vector<py::object> exporters_;  // one per view made by views()
};

// Takes up to n samples (held until released): waits in slices for the first, then returns
// what the ring gives in one call. None at end of stream.
py::object NextBatch(const std::shared_ptr<StreamHolder>& stream, size_t n,
                     std::optional<double> timeout) {
  if (n == 0) throw py::value_error("nopfs: next_batch(0): ask for at least 1 sample");
  if (Status d = stream->TakeDeferred(); !d.ok()) RaiseStreamError(*stream, d);
  const auto deadline = DeadlineOf(timeout);
  std::vector<client::Sample> samples;
  samples.reserve(n);
  for (;;) {
    Result<size_t> r = Status::Internal("unset");
    {
      py::gil_scoped_release nogil;
      r = stream->NextBatch(n, &samples, SliceBefore(deadline));
    }
    if (r.ok()) {
      if (*r == 0) return py::none();
      return py::cast(PyBatch(std::make_shared<BatchHolder>(stream, std::move(samples))));
    }
    const Status& st = r.status();
    if (st.code() == StatusCode::kTimedOut && std::chrono::steady_clock::now() < deadline) {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      continue;
    }
    RaiseStreamError(*stream, st);
  }
}

// Copies the next n samples back to back into `out` and releases them: (offsets, labels, ids),
// numpy arrays of n + 1, n and n entries (fewer at the end of the stream, or when the next sample
// does not fit what is left of `out`; it comes first in the next call).
py::tuple NextBatchInto(const std::shared_ptr<StreamHolder>& stream, size_t n,
                        const py::buffer& out, std::optional<double> timeout) {
  if (n == 0) throw py::value_error("nopfs: next_batch_into(0, ...): ask for at least 1 sample");
  if (Status d = stream->TakeDeferred(); !d.ok()) RaiseStreamError(*stream, d);
  WritableBytes w = RequestWritable(out, "next_batch_into()");
  const auto deadline = DeadlineOf(timeout);
  std::vector<client::BatchEntry> entries;
  entries.reserve(n);
  uint64_t used = 0;
  while (entries.size() < n) {
    const size_t before = entries.size();
    Result<size_t> r = Status::Internal("unset");
    {
      py::gil_scoped_release nogil;
      r = stream->FillBatch(n - before, w.span.subspan(used), &entries, SliceBefore(deadline));
    }
    for (size_t i = before; i < entries.size(); ++i)
      entries[i].offset += used;
    if (entries.size() > before) used = entries.back().offset + entries.back().size;
    if (r.ok()) {
      if (*r == 0) break;  // end of stream
      continue;
    }
    const Status& st = r.status();
    if (st.code() == StatusCode::kTimedOut) {
      if (std::chrono::steady_clock::now() >= deadline) {
        if (entries.empty()) RaiseStatus(st);
        break;  // the rest comes with the next call
      }
      if (PyErr_CheckSignals() != 0) {
        // Interrupted: what was copied is lost with the exception; the stream goes on after it.
        throw py::error_already_set();
      }
      continue;
    }
    if (entries.empty()) {
      if (st.code() == StatusCode::kInvalidArgument) {
        throw py::value_error("nopfs: next_batch_into(): " + st.message());
      }
      RaiseStreamError(*stream, st);
    }
    // The buffer is full (the next sample waits for the next call), or a failure after some
    // samples: those are returned, the failure is raised by the next call.
    if (st.code() != StatusCode::kInvalidArgument) stream->Defer(st);
    break;
  }
  const size_t k = entries.size();
  py::array_t<int64_t> offsets = ArrayOf<int64_t>(k + 1);
  py::array_t<int64_t> labels = ArrayOf<int64_t>(k);
  py::array_t<uint32_t> ids = ArrayOf<uint32_t>(k);
  int64_t* o = offsets.mutable_data();
  int64_t* l = labels.mutable_data();
  uint32_t* d = ids.mutable_data();
  for (size_t i = 0; i < k; ++i) {
    o[i] = static_cast<int64_t>(entries[i].offset);
    l[i] = entries[i].label;
    d[i] = entries[i].sample_id;
  }
  o[k] = static_cast<int64_t>(used);
  return py::make_tuple(offsets, labels, ids);
}

policy::JobSpec MakeJob(uint64_t seed, uint64_t samples, uint32_t epochs, uint32_t ranks,
                        uint64_t batch, const std::string& scheme, bool drop_last,
                        uint32_t ranks_per_node) {
  policy::JobSpec j;
  j.seed = seed;
  j.samples = samples;
  j.epochs = epochs;
  j.ranks = ranks;
  j.batch = batch;
  Result<policy::Scheme> s = policy::ParseScheme(scheme);
  if (!s.ok()) throw py::value_error("nopfs: " + s.status().message());
  j.scheme = *s;
  j.drop_last = drop_last;
  j.ranks_per_node = ranks_per_node == 0 ? ranks : ranks_per_node;
  if (Status st = j.Validate(); !st.ok()) throw py::value_error("nopfs: " + st.message());
  return j;
}

void CheckRank(const policy::JobSpec& j, uint32_t rank) {
  if (rank >= j.ranks) {
    throw py::value_error("nopfs: rank " + std::to_string(rank) + " is out of range: the job has " +
                          std::to_string(j.ranks) + " ranks");
  }
}

}  // namespace
}  // namespace nopfs::python

PYBIND11_MODULE(_client, m) {
  using namespace nopfs;
  using namespace nopfs::python;
  m.doc() = "nopfs client: read a rank's samples from the node's nopfsd without copying";

  g_error = PyErr_NewExceptionWithDoc("nopfs.Error", "An error from the nopfs service or client.",
                                      PyExc_RuntimeError, nullptr);
  g_sample_error = PyErr_NewExceptionWithDoc(
      "nopfs.SampleError",
      "The service could not read one sample; the message names its id and path (also in "
      ".sample_id and .path). The stream goes on with the next sample.",
      g_error, nullptr);
  g_unavailable = PyErr_NewExceptionWithDoc(
      "nopfs.UnavailableError", "No nopfs service answers, or it went away.", g_error, nullptr);
  py::tuple timeout_bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_TimeoutError));
  g_timeout = PyErr_NewExceptionWithDoc("nopfs.TimeoutError", "No sample within the timeout.",
                                        timeout_bases.ptr(), nullptr);
  if (g_error == nullptr || g_sample_error == nullptr || g_unavailable == nullptr ||
      g_timeout == nullptr) {
    throw py::error_already_set();
  }
  m.add_object("Error", py::handle(g_error));
  m.add_object("SampleError", py::handle(g_sample_error));
  m.add_object("UnavailableError", py::handle(g_unavailable));
  m.add_object("TimeoutError", py::handle(g_timeout));

  py::class_<SampleBuffer>(m, "_SampleBuffer", py::buffer_protocol())
      .def_buffer([](SampleBuffer& b) {
        const client::Sample& s = b.sample();
        return py::buffer_info(const_cast<std::byte*>(s.data), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.size)}, {py::ssize_t{1}},
                               /*readonly=*/true);
      });

  py::class_<PySample>(m, "Sample",
                       "One sample of a stream; its bytes are shared memory until release()")
      .def_property_readonly("id", [](const PySample& s) { return s.meta().sample_id; })
      .def_property_readonly("label", [](const PySample& s) { return s.meta().label; })
      .def_property_readonly("epoch", [](const PySample& s) { return s.meta().epoch; })
      .def_property_readonly("step", [](const PySample& s) { return s.meta().step; })
      .def_property_readonly(
          "position", [](const PySample& s) { return s.meta().position; },
          "index in the rank's stream within the epoch")
      .def_property_readonly(
          "seq", [](const PySample& s) { return s.meta().seq; }, "position in this stream, from 0")
      .def_property_readonly("size", [](const PySample& s) { return s.meta().size; })
      .def_property_readonly("released", &PySample::released)
      .def_property_readonly("data", &PySample::Data,
                             "read-only memoryview of the bytes (no copy); valid until release()")
      .def("numpy", &PySample::Numpy, "read-only uint8 array over the bytes (no copy)")
      .def("tobytes", &PySample::ToBytes, "a copy of the bytes")
      .def("release", &PySample::Release,
           "gives the bytes back to the service; BufferError while views are alive")
      .def("__len__", [](const PySample& s) { return s.meta().size; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PySample& s, py::object type, py::object, py::object) {
             // Leaving on an exception: do not mask it with a BufferError; the slot is given
             // back when the last view goes.
             if (type.is_none()) {
               s.Release();
             } else {
               s.Drop();
             }
           })
      .def("__repr__", [](const PySample& s) {
        return "<nopfs.Sample id=" + std::to_string(s.meta().sample_id) +
               " label=" + std::to_string(s.meta().label) +
               " epoch=" + std::to_string(s.meta().epoch) +
               " size=" + std::to_string(s.meta().size) + (s.released() ? " released" : "") + ">";
      });

  py::class_<BatchSampleBuffer>(m, "_BatchSampleBuffer", py::buffer_protocol())
      .def_buffer([](BatchSampleBuffer& b) {
        const client::Sample& s = b.sample();
        return py::buffer_info(const_cast<std::byte*>(s.data), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.size)}, {py::ssize_t{1}},
                               /*readonly=*/true);
      });

  py::class_<PyBatch>(m, "Batch",
                      "Samples of one next_batch() call, in stream order; their bytes are shared "
                      "memory until release()")
      .def("__len__", &PyBatch::size)
      .def_property_readonly("nbytes", &PyBatch::nbytes, "the samples' bytes together")
      .def_property_readonly(
          "ids",
          [](const PyBatch& b) {
            return b.Field<uint32_t>([](const auto& x) { return x.sample_id; });
          },
          "uint32 array of the sample ids")
      .def_property_readonly(
          "labels",
          [](const PyBatch& b) { return b.Field<int64_t>([](const auto& x) { return x.label; }); },
          "int64 array of the labels")
      .def_property_readonly(
          "sizes",
          [](const PyBatch& b) { return b.Field<int64_t>([](const auto& x) { return x.size; }); },
          "int64 array of the sample sizes")
      .def_property_readonly(
          "epochs",
          [](const PyBatch& b) { return b.Field<uint32_t>([](const auto& x) { return x.epoch; }); })
      .def_property_readonly(
          "steps",
          [](const PyBatch& b) { return b.Field<int64_t>([](const auto& x) { return x.step; }); })
      .def_property_readonly("offsets", &PyBatch::Offsets,
                             "int64 array of n + 1: where each sample starts when copied back to "
                             "back (copy_into), and the end")
      .def_property_readonly("released", &PyBatch::released)
      .def("copy_into", &PyBatch::CopyInto, py::arg("out"), py::arg("offset") = 0,
           "copies the samples back to back into the writable buffer `out` from `offset` (one "
           "call, no per-sample objects); returns offset + nbytes")
      .def("tobytes", &PyBatch::ToBytes, "a list of bytes, one copy per sample")
      .def("views", &PyBatch::Views,
           "a list of read-only memoryviews, one per sample (no copy); release() refuses while "
           "one is alive")
      .def("release", &PyBatch::Release,
           "gives the bytes back to the service; BufferError while views are alive")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyBatch& b, py::object type, py::object, py::object) {
             if (type.is_none()) {
               b.Release();
             } else {
               b.Drop();
             }
           })
      .def("__repr__", [](const PyBatch& b) {
        return "<nopfs.Batch samples=" + std::to_string(b.size()) +
               " nbytes=" + std::to_string(b.nbytes()) + (b.released() ? " released" : "") + ">";
      });

  py::class_<StreamHolder, std::shared_ptr<StreamHolder>>(m, "Stream",
                                                          "One rank's samples, in stream order")
      .def("next_batch", &NextBatch, py::arg("n"), py::arg("timeout") = py::none(),
           "a Batch of up to n samples in one call, or None at the end; fewer than n at the end, "
           "when the ring holds no more at once, or when the rest has not arrived yet")
      .def("next_batch_into", &NextBatchInto, py::arg("n"), py::arg("out"),
           py::arg("timeout") = py::none(),
           "copies the next n samples back to back into the writable buffer `out` (e.g. "
           "tensor.numpy() of a torch.uint8 tensor) and releases them; returns (offsets, labels, "
           "ids): int64 n + 1, int64 n, uint32 n (fewer at the end, or when the next sample does "
           "not fit what is left of `out`); ValueError for a sample larger than all of `out`")
      .def("next", &NextSample, py::arg("timeout") = py::none(),
           "the next Sample, or None at the end; waits at most `timeout` seconds (None: no limit)")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__",
           [](const std::shared_ptr<StreamHolder>& s) {
             py::object x = NextSample(s, std::nullopt);
             if (x.is_none()) throw py::stop_iteration();
             return x;
           })
      .def("stats",
           [](const StreamHolder& s) {
             client::Stats st = s.stats();
             py::dict d;
             d["samples"] = st.samples;
             d["bytes"] = st.bytes;
             d["next_calls"] = st.next_calls;
             d["stall_ns_total"] = st.stall_ns_total;
             d["stall_ns_median"] = st.stall_ns_median;
             d["stall_ns_p99"] = st.stall_ns_p99;
             return d;
           })
      .def_property_readonly("id", &StreamHolder::id)
      .def_property_readonly("closed", &StreamHolder::closed)
      .def_property_readonly("service_gone", &StreamHolder::service_gone)
      .def("close",
           [](StreamHolder& s) {
             Status st = Status::Ok();
             {
               py::gil_scoped_release nogil;  // may wait for a next() in another thread
               st = s.Close();
             }
             if (!st.ok()) RaiseStatus(st);
           })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](StreamHolder& s, py::args) {
        py::gil_scoped_release nogil;
        (void)s.Close();
      });

  py::class_<ClientHolder, std::shared_ptr<ClientHolder>>(m, "Client",
                                                          "A connection to the node's nopfsd")
      .def(
          "open",
          [](const std::shared_ptr<ClientHolder>& c, uint32_t rank, uint32_t epoch, uint64_t step,
             uint32_t worker, uint32_t workers, uint64_t batch, uint32_t epochs, uint32_t owner,
             bool read_once) {
            client::OpenOptions o;
            o.owner_pid = owner;
            o.read_once = read_once;
            o.epoch = epoch;
            o.step = step;
            o.worker = worker;
            o.workers = workers;
            o.batch = batch;
            o.epochs = epochs;
            Result<std::unique_ptr<client::Stream>> s = Status::Internal("unset");
            {
              py::gil_scoped_release nogil;
              s = c->get().Open(rank, o);
            }
            if (!s.ok()) RaiseStatus(s.status());
            return std::make_shared<StreamHolder>(c, std::move(*s));
          },
          py::arg("rank"), py::arg("epoch") = 0, py::arg("step") = 0, py::arg("worker") = 0,
          py::arg("workers") = 1, py::arg("batch") = 1, py::arg("epochs") = 0, py::arg("owner") = 0,
          py::arg("read_once") = false,
          "opens rank's stream at (epoch, step); worker/workers/batch: only batches worker, "
          "worker+workers, ... of each epoch; epochs: how many epochs (0: to the end); owner: "
          "a DataLoader worker's share of the rank process `owner` reads (0: this process's); "
          "read_once: this process reads each sample once (a worker that lives one pass), so "
          "copies out of the RAM tier read its file instead of faulting in the process's mapping")
      .def("status",
           [](ClientHolder& c) {
             Result<std::string> t = c.get().StatusText();
             if (!t.ok()) RaiseStatus(t.status());
             return *t;
           })
      .def(
          "report",
          [](ClientHolder& c) {
            Result<report::StatusReport> r = c.get().Report();
            if (!r.ok()) RaiseStatus(r.status());
            return py::module_::import("json").attr("loads")(report::RenderJson(*r));
          },
          "the structured status as a dict (what `nopfs status --json` prints, docs/service.md)")
      .def(
          "describe",
          [](ClientHolder& c, uint32_t id) {
            Result<client::SampleInfo> i = c.get().Describe(id);
            if (!i.ok()) RaiseStatus(i.status());
            py::dict d;
            d["path"] = i->path;
            d["offset"] = i->offset;
            d["length"] = i->length;
            d["label"] = i->label;
            return d;
          },
          py::arg("sample_id"), "where a sample lives: path, offset, length, label")
      .def_property_readonly("info", [](ClientHolder& c) {
        const client::ServiceInfo& i = c.get().info();
        py::dict d;
        d["version"] = i.version;
        d["job_id"] = i.job_id;
        d["ranks"] = i.ranks;
        d["first_rank"] = i.first_rank;
        d["local_ranks"] = i.local_ranks;
        return d;
      });

  m.def(
      "connect",
      [](std::optional<std::string> socket, double timeout) {
        client::ConnectOptions o;
        o.socket_path = socket.value_or("");
        o.timeout = ToMs(timeout);
        Result<std::unique_ptr<client::Client>> c = Status::Internal("unset");
        {
          py::gil_scoped_release nogil;
          c = client::Client::Connect(o);
        }
        if (!c.ok()) {
          // No socket or nobody listening: the service is not there.
          if (c.status().code() == StatusCode::kInvalidArgument ||
              c.status().code() == StatusCode::kNotFound) {
            Raise(g_unavailable, c.status().message());
          }
          RaiseStatus(c.status());
        }
        return std::make_shared<ClientHolder>(std::move(*c));
      },
      py::arg("socket") = py::none(), py::arg("timeout") = 30.0,
      "connects to nopfsd at `socket` (None: $NOPFS_SOCKET)");

  m.def(
      "epoch_order",
      [](uint64_t seed, uint64_t samples, uint32_t ranks, uint64_t batch, const std::string& scheme,
         bool drop_last, uint32_t rank, uint32_t epoch, uint64_t step) {
        if (epoch == UINT32_MAX) throw py::value_error("nopfs: epoch is out of range");
        policy::JobSpec j = MakeJob(seed, samples, epoch + 1, ranks, batch, scheme, drop_last, 0);
        CheckRank(j, rank);
        if (Status st = policy::ValidateStreamPoint(j, {epoch, step}); !st.ok()) {
          throw py::value_error("nopfs: " + st.message());
        }
        std::vector<uint32_t> ids;
        {
          py::gil_scoped_release nogil;
          ids.reserve(policy::RankEpochLength(j, rank));
          policy::RankStream s(j, rank, {epoch, step});
          policy::Access a;
          while (s.Next(&a) && a.epoch == epoch)
            ids.push_back(a.sample);
        }
        py::array_t<uint32_t> out(static_cast<py::ssize_t>(ids.size()));
        if (!ids.empty())
          std::memcpy(out.mutable_data(), ids.data(), ids.size() * sizeof(uint32_t));
        return out;
      },
      py::arg("seed"), py::arg("samples"), py::arg("ranks"), py::arg("batch"), py::arg("scheme"),
      py::arg("drop_last"), py::arg("rank"), py::arg("epoch"), py::arg("step") = 0,
      "the sample ids rank reads in `epoch` from `step` on, in order: the planner's order, what "
      "`nopfs stream` prints and what the service delivers");

  m.def(
      "steps_per_epoch",
      [](uint64_t seed, uint64_t samples, uint32_t ranks, uint64_t batch, const std::string& scheme,
         bool drop_last) {
        return policy::StepsPerEpoch(MakeJob(seed, samples, 1, ranks, batch, scheme, drop_last, 0));
      },
      py::arg("seed"), py::arg("samples"), py::arg("ranks"), py::arg("batch"), py::arg("scheme"),
      py::arg("drop_last"));

  m.def(
      "rank_epoch_length",
      [](uint64_t samples, uint32_t ranks, uint64_t batch, const std::string& scheme,
         bool drop_last, uint32_t rank) {
        policy::JobSpec j = MakeJob(0, samples, 1, ranks, batch, scheme, drop_last, 0);
        CheckRank(j, rank);
        return policy::RankEpochLength(j, rank);
      },
      py::arg("samples"), py::arg("ranks"), py::arg("batch"), py::arg("scheme"),
      py::arg("drop_last"), py::arg("rank"));

  m.def(
      "step_begin",
      [](uint64_t samples, uint32_t ranks, uint64_t batch, const std::string& scheme,
         bool drop_last, uint32_t rank, uint64_t step) {
        policy::JobSpec j = MakeJob(0, samples, 1, ranks, batch, scheme, drop_last, 0);
        CheckRank(j, rank);
        if (step >= policy::StepsPerEpoch(j)) {
          throw py::value_error("nopfs: step " + std::to_string(step) + " is past the epoch (" +
                                std::to_string(policy::StepsPerEpoch(j)) + " steps)");
        }
        return policy::RankStepEntries(j, rank, step).begin;
      },
      py::arg("samples"), py::arg("ranks"), py::arg("batch"), py::arg("scheme"),
      py::arg("drop_last"), py::arg("rank"), py::arg("step"),
      "the index in the rank's epoch list of step `step`'s first entry");
}
