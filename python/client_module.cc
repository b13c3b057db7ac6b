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

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "client/client.h"
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
    std::shared_lock lock(mu_);
    if (closed_) return Status::FailedPrecondition("nopfs: next() on a closed stream");
    return stream_->Next(timeout);
  }
  Status Release(const client::Sample& s) {
    std::shared_lock lock(mu_);
    if (closed_) return Status::Ok();  // the ring is gone with the stream: nothing to give back
    return stream_->Release(s);
  }
  Status Close() {
    std::unique_lock lock(mu_);
    if (closed_) return Status::Ok();
    closed_ = true;
    return stream_->Close();
  }
  client::Stats stats() const { return stream_->stats(); }
  uint64_t id() const { return stream_->id(); }
  bool closed() const {
    std::shared_lock lock(mu_);
    return closed_;
  }
  ClientHolder& client() { return *client_; }

 private:
  std::shared_ptr<ClientHolder> client_;
  mutable std::shared_mutex mu_;
  bool closed_ = false;  // GUARDED_BY(mu_)
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

// Waits for the next sample in slices, so that Ctrl-C (and other signals) reach Python.
py::object NextSample(const std::shared_ptr<StreamHolder>& stream, std::optional<double> timeout) {
  constexpr std::chrono::milliseconds kSlice{100};
  const auto deadline = timeout ? std::chrono::steady_clock::now() + ToMs(*timeout)
                                : std::chrono::steady_clock::time_point::max();
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
    if (std::optional<uint32_t> id = FailedSampleId(st.message())) {
      // A sample the service could not read: the stream goes on after it.
      py::object path = py::none();
      Result<client::SampleInfo> info = stream->client().get().Describe(*id);
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

  py::class_<StreamHolder, std::shared_ptr<StreamHolder>>(m, "Stream",
                                                          "One rank's samples, in stream order")
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
             uint32_t worker, uint32_t workers, uint64_t batch, uint32_t epochs, uint32_t owner) {
            client::OpenOptions o;
            o.owner_pid = owner;
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
          "opens rank's stream at (epoch, step); worker/workers/batch: only batches worker, "
          "worker+workers, ... of each epoch; epochs: how many epochs (0: to the end); owner: "
          "a DataLoader worker's share of the rank process `owner` reads (0: this process's)")
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
