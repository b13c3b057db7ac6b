// nopfs._client's Batch: the samples of one next_batch() call, as arrays of their metadata and
// their bytes by one copy, as bytes objects or as views; and Stream.next_batch() and
// Stream.next_batch_into().
#include <string>

#include "python/binding.h"

namespace nopfs::python {
namespace {

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
  void CopyOut(size_t i, uint64_t offset, uint64_t size, std::byte* dst) const {
    stream_->CopyOut(samples_[i], offset, size, dst);
  }
  bool read_once() const { return stream_->read_once(); }

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
  if (!IsContiguous(info)) {
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
  // DecodeJpegsRgb of the samples: in place, or in a stream opened read_once by copies of the
  // parts the decodes read (CopyOut), as the stream's other copies are made.
  py::list DecodeJpegs(uint64_t max_pixels) const {
    CheckLive("decode_jpegs()");
    const auto& v = holder_->samples();
    std::vector<JpegInput> inputs(v.size());
    const bool copy = holder_->read_once();
    for (size_t i = 0; i < v.size(); ++i) {
      inputs[i].size = v[i].size;
      if (!copy) {
        inputs[i].data = v[i].data;
      } else {
        inputs[i].read = [h = holder_.get(), i](uint64_t offset, uint64_t n, std::byte* dst) {
          h->CopyOut(i, offset, n, dst);
        };
      }
    }
    return DecodeJpegsRgb(inputs, max_pixels);
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

}  // namespace

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

void BindBatch(py::module_& m) {
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
      .def("decode_jpegs", &PyBatch::DecodeJpegs, py::arg("max_pixels") = 0,
           "decode_jpeg_rgb() of each sample, in one call: a list with ((width, height), RGB "
           "bytes) or None (not a JPEG decoded here: decode it with PIL) per sample. In a stream "
           "opened read_once each decode copies only the part of its sample that it reads")
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
}

}  // namespace nopfs::python
