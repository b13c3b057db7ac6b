// What the files of the nopfs._client extension share (python/bind_*.cc): the module's exception
// types and how errors are raised, the client and stream holders every Python object refers to,
// the waits in slices, and the function that binds each part of the module. Private to python/.
#pragma once

#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "client/client.h"
#include "common/mutex.h"
#include "common/status.h"

namespace nopfs::python {

namespace py = pybind11;

// The module's exception types (created by BindErrors; they live as long as the module).
extern PyObject* g_error;         // nopfs.Error(RuntimeError)
extern PyObject* g_sample_error;  // nopfs.SampleError(Error): one sample could not be read
extern PyObject* g_unavailable;   // nopfs.UnavailableError(Error): no service, or it went away
extern PyObject* g_timeout;       // nopfs.TimeoutError(Error, TimeoutError)

[[noreturn]] void Raise(PyObject* type, const std::string& message);
// A status as Python sees it: Unavailable and TimedOut as their own types, the rest as Error.
[[noreturn]] void RaiseStatus(const Status& st);

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
  // Part of a held sample's bytes to dst, the same way.
  void CopyOut(const client::Sample& s, uint64_t offset, uint64_t size, std::byte* dst) const {
    stream_->CopyOut(s, offset, size, dst);
  }
  // Whether the stream was opened read_once (its samples are read by copies, CopyOut).
  bool read_once() const { return stream_->read_once(); }
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

// A stream's failure as Python sees it: a sample the service could not read is a SampleError
// naming it (the stream goes on after it), the rest RaiseStatus's.
[[noreturn]] void RaiseStreamError(StreamHolder& stream, const Status& st);

// Whether a buffer's bytes lie back to back in C order (dimensions of one element aside).
inline bool IsContiguous(const py::buffer_info& info) {
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    const auto u = static_cast<size_t>(d);
    if (info.shape[u] > 1 && info.strides[u] != expect) return false;
    expect *= info.shape[u];
  }
  return true;
}

// A timeout in seconds from Python; ValueError when negative.
std::chrono::milliseconds ToMs(double seconds);

// Waits are cut into slices, so that Ctrl-C (and other signals) reach Python.
inline constexpr std::chrono::milliseconds kSlice{100};

inline std::chrono::steady_clock::time_point DeadlineOf(std::optional<double> timeout) {
  return timeout ? std::chrono::steady_clock::now() + ToMs(*timeout)
                 : std::chrono::steady_clock::time_point::max();
}

// The next wait slice before `deadline`.
inline std::chrono::milliseconds SliceBefore(std::chrono::steady_clock::time_point deadline) {
  if (deadline == std::chrono::steady_clock::time_point::max()) return kSlice;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::clamp(left, std::chrono::milliseconds(0), kSlice);
}

// A stream's reads (bind_sample.cc, bind_batch.cc), bound as Stream's methods by BindClient.
py::object NextSample(const std::shared_ptr<StreamHolder>& stream, std::optional<double> timeout);
py::object NextBatch(const std::shared_ptr<StreamHolder>& stream, size_t n,
                     std::optional<double> timeout);
py::tuple NextBatchInto(const std::shared_ptr<StreamHolder>& stream, size_t n,
                        const py::buffer& out, std::optional<double> timeout);

// One JPEG for DecodeJpegsRgb: `size` bytes, either in memory at `data`, or (data null) read in
// pieces, as the decode needs them, by read(offset, n, dst), which may run without the GIL.
struct JpegInput {
  const std::byte* data = nullptr;
  uint64_t size = 0;
  std::function<void(uint64_t offset, uint64_t n, std::byte* dst)> read;
};

// decode_jpeg_rgb of each input, without the GIL but to make the pixels' bytes objects: a list
// with ((width, height), RGB bytes) or None (decode it with PIL) per input. A JPEG read in pieces
// is read up to about its end, not to the end of the input (python/bind_jpeg.cc).
py::list DecodeJpegsRgb(const std::vector<JpegInput>& inputs, uint64_t max_pixels);

// The parts of the module, in the order PYBIND11_MODULE binds them.
void BindErrors(py::module_& m);  // Error, SampleError, UnavailableError, TimeoutError
void BindSample(py::module_& m);  // Sample (and its buffer exporter)
void BindBatch(py::module_& m);   // Batch (and its samples' buffer exporter)
void BindClient(py::module_& m);  // Stream, Client, connect()
void BindPlan(py::module_& m);    // epoch_order(), steps_per_epoch(), rank_epoch_length(), ...
void BindJpeg(py::module_& m);    // use_libjpeg_of(), decode_jpeg_rgb()

}  // namespace nopfs::python
