// nopfs._client's Client (a connection to the node's nopfsd), its Streams, and connect().
#include <string>

#include "python/binding.h"

namespace nopfs::python {

void BindClient(py::module_& m) {
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
}

}  // namespace nopfs::python
