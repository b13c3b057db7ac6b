// nopfs._client's Sample: one sample of a stream, its bytes a view of the ring's shared memory
// until release(); and Stream.next().
#include <string>

#include "python/binding.h"

namespace nopfs::python {
namespace {

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

}  // namespace

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

void BindSample(py::module_& m) {
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
}

}  // namespace nopfs::python
