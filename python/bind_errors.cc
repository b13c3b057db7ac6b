// nopfs._client's exception types, and how a Status becomes one of them.
#include <optional>
#include <string>
#include <string_view>

#include "python/binding.h"

namespace nopfs::python {

PyObject* g_error = nullptr;
PyObject* g_sample_error = nullptr;
PyObject* g_unavailable = nullptr;
PyObject* g_timeout = nullptr;

[[noreturn]] void Raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

[[noreturn]] void RaiseStatus(const Status& st) {
  if (st.code() == StatusCode::kUnavailable) Raise(g_unavailable, st.message());
  if (st.code() == StatusCode::kTimedOut) Raise(g_timeout, st.message());
  Raise(g_error, st.message());
}

namespace {

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

}  // namespace

void RaiseStreamError(StreamHolder& stream, const Status& st) {
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

std::chrono::milliseconds ToMs(double seconds) {
  if (seconds < 0) throw py::value_error("nopfs: a timeout must be >= 0 seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

void BindErrors(py::module_& m) {
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
}

}  // namespace nopfs::python
