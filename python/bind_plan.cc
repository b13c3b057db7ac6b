// nopfs._client's view of the planner (policy/partition.h): a rank's order in an epoch and the
// epoch's steps, as the service delivers them (the fallback reader and nopfs.torch's sampler).
#include <cstring>
#include <string>

#include "policy/job.h"
#include "policy/partition.h"
#include "python/binding.h"

namespace nopfs::python {
namespace {

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

void BindPlan(py::module_& m) {
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

}  // namespace nopfs::python
