#include "protocol/status_report.h"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>

#include "common/json.h"
#include "common/units.h"

namespace nopfs::report {
namespace {

std::string Line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Line(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return std::string(buf) + "\n";
}

std::string Bytes(uint64_t b) {
  return FormatBytes(static_cast<double>(b));
}

double Sec(uint64_t ns) {
  return static_cast<double>(ns) / 1e9;
}

const char* StateName(TierState s) {
  switch (s) {
    case TierState::kEmpty:
      return "empty";
    case TierState::kRunning:
      return "running";
    case TierState::kDone:
      return "done";
  }
  return "empty";
}

// A count that may be unknown (kUnknown): null in JSON.
Json CountOrNull(uint64_t v) {
  return v == kUnknown ? Json(nullptr) : Json(v);
}

std::string PeersText(const Peers& p) {
  std::string dead;
  for (uint32_t n : p.dead) {
    dead += dead.empty() ? "" : ",";
    dead += std::to_string(n);
  }
  std::string out;
  out += Line("peers: node %u of %u, %s", p.node, p.nodes, p.state.c_str());
  out += Line("peers served: %" PRIu64 " samples, %" PRIu64 " bytes, %" PRIu64 " not available",
              p.served_samples, p.served_bytes, p.served_not_available);
  out += Line("peers fetched: %" PRIu64 " samples, %" PRIu64 " bytes, %" PRIu64
              " not available, %" PRIu64 " timeouts, %" PRIu64 " refused, %" PRIu64
              " malformed; dead: %s",
              p.fetched_samples, p.fetched_bytes, p.fetch_not_available, p.timeouts, p.refused,
              p.malformed, dead.empty() ? "none" : dead.c_str());
  out += Line("peers done: %" PRIu64 " classes reported filled by the other nodes", p.done_reports);
  out +=
      Line("peers rma: %s; served %" PRIu64 " and fetched %" PRIu64
           " samples by RMA reads, %" PRIu64 " failed; served %" PRIu64 " in replies from memory",
           p.rma.c_str(), p.served_rma, p.fetched_rma, p.rma_failed, p.served_in_place);
  out += Line("peers pushed: %" PRIu64 " samples, %" PRIu64
              " bytes read from the PFS here before their holder had them (%" PRIu64
              " dropped); %" PRIu64 " received, %" PRIu64 " kept",
              p.pushes_sent, p.push_bytes_sent, p.pushes_dropped, p.pushes_received, p.pushes_kept);
  out += Line("peers copied: %" PRIu64 " samples, %" PRIu64
              " bytes prefetched from the node that read them from the PFS (%" PRIu64
              " deferred until it had them); %" PRIu64 " read from the PFS after all",
              p.copied_samples, p.copied_bytes, p.deferred, p.fill_gave_up);
  return out;
}

std::string SourceText(const Source& s) {
  if (s.zero_copy) {
    return Line("served %s: %" PRIu64 " samples, %" PRIu64 " bytes, %" PRIu64
                " of them in place (zero copy)",
                s.name.c_str(), s.samples, s.bytes, s.in_place);
  }
  return Line("served %s: %" PRIu64 " samples, %" PRIu64 " bytes", s.name.c_str(), s.samples,
              s.bytes);
}

double Percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? 100.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

}  // namespace

std::string FormatSeconds(double s) {
  char buf[64];
  if (s < 1e-6) {
    std::snprintf(buf, sizeof buf, "%.0f ns", s * 1e9);
  } else if (s < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  } else if (s < 1) {
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  }
  return buf;
}

std::string FormatEta(uint64_t ns) {
  if (ns == kUnknown) return "unknown";
  const uint64_t s = (ns + 500'000'000) / 1'000'000'000;
  char buf[64];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " s", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " min %" PRIu64 " s", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " h %" PRIu64 " min", s / 3600, s / 60 % 60);
  }
  return buf;
}

std::string RenderProgress(const StatusReport& r, bool bar) {
  std::string out;
  for (const Tier& t : r.tiers) {
    if (t.state == TierState::kEmpty) continue;
    const double pct = std::min(100.0, Percent(t.ready_bytes, t.planned_bytes));
    std::string head = "staging " + t.name + ":";
    if (bar) {
      const int filled = static_cast<int>(pct / 5);
      head += " [" + std::string(static_cast<size_t>(filled), '#') +
              std::string(static_cast<size_t>(20 - filled), '.') + "]";
    }
    const std::string eta =
        t.state == TierState::kDone ? std::string("done") : "ETA " + FormatEta(t.eta_ns);
    out += Line("%s %s of %s staged (%.0f%%), %s/s, %s", head.c_str(), Bytes(t.ready_bytes).c_str(),
                Bytes(t.planned_bytes).c_str(), pct, Bytes(t.rate).c_str(), eta.c_str());
  }
  return out;
}

std::string RenderPlanLine(const StatusReport& r) {
  std::string tiers;
  uint64_t planned = 0;
  for (const Tier& t : r.tiers) {
    tiers += tiers.empty() ? "" : ", ";
    tiers += t.name + " " + Bytes(t.planned_bytes) + " of " + Bytes(t.capacity) + " (" +
             std::to_string(t.planned_samples) + " samples)";
    planned += t.planned_bytes;
  }
  const std::string stall = r.predicted_stall_ns == kUnknown
                                ? std::string("unknown")
                                : FormatSeconds(Sec(r.predicted_stall_ns));
  return Line(
      "nopfs: plan: node %u of %u, dataset %s; tiers: %s; %s (%.0f%% of the dataset) to "
      "stage; predicted stall %s (a client that takes no time per sample)",
      r.node, r.nodes, Bytes(r.dataset_bytes).c_str(), tiers.empty() ? "none" : tiers.c_str(),
      Bytes(planned).c_str(), Percent(planned, r.dataset_bytes), stall.c_str());
}

std::string RenderText(const StatusReport& r) {
  std::string out;
  out += Line("nopfsd: job %s, node %u of %u, pid %u, up %.1f s", r.job_id.c_str(), r.node, r.nodes,
              r.pid, Sec(r.uptime_ns));
  out += Line("dataset: %s, %" PRIu64 " samples, %s", r.dataset.c_str(), r.dataset_samples,
              Bytes(r.dataset_bytes).c_str());
  for (const Tier& t : r.tiers) {
    if (t.state == TierState::kEmpty) {
      out += Line("tier %s: empty (capacity %s)", t.name.c_str(), Bytes(t.capacity).c_str());
      continue;
    }
    out +=
        Line("tier %s: %" PRIu64 " of %" PRIu64 " samples ready (%" PRIu64
             " kept from staging reads, %" PRIu64
             " pushed by peers), %s of %s (capacity %s), %" PRIu64 " failed, prefetch %s",
             t.name.c_str(), t.ready_samples, t.planned_samples, t.kept_on_read, t.pushed,
             Bytes(t.ready_bytes).c_str(), Bytes(t.planned_bytes).c_str(),
             Bytes(t.capacity).c_str(), t.failed, t.state == TierState::kDone ? "done" : "running");
  }
  out += RenderProgress(r, false);
  for (const Stream& s : r.streams) {
    out += Line("stream %" PRIu64 ": rank %u, %" PRIu64 " of %" PRIu64 " staged, %" PRIu64
                " errors, %" PRIu64 " read by the client",
                s.id, s.rank, s.staged, s.total, s.errors, s.read);
  }
  for (const Source& s : r.sources) {
    if (s.name == "pfs" && r.peers) out += PeersText(*r.peers);
    out += SourceText(s);
  }
  out += Line("pfs read: %" PRIu64 " bytes in all, prefetch included", r.pfs_bytes);
  out +=
      Line("corrupt: %" PRIu64 " tier reads failed their checksum and were refetched", r.corrupt);
  out += Line("changed: %" PRIu64 " PFS reads found a sample's file rewritten during the job",
              r.changed);
  if (r.kept) {
    out += Line("kept: %" PRIu64 " samples (%s) adopted from an earlier job's kept copy, %" PRIu64
                " of its samples rejected; %s kept at exit",
                r.kept->adopted_samples, Bytes(r.kept->adopted_bytes).c_str(),
                r.kept->adopt_rejected_samples, Bytes(r.kept->kept_bytes).c_str());
  }
  if (r.siblings) {
    const Siblings& s = *r.siblings;
    out += Line("siblings: read %" PRIu64 " samples (%s) through %s, %" PRIu64
                " failed; served %" PRIu64 " samples (%s) to this user's other jobs",
                s.read_samples, Bytes(s.read_bytes).c_str(),
                s.through.empty() ? "no job now" : ("job " + s.through + " now").c_str(),
                s.read_failed, s.served_samples, Bytes(s.served_bytes).c_str());
  }
  out += Line("stall: %" PRIu64 " reads, total %.6f s, median %.6f s, p99 %.6f s", r.stall.reads,
              Sec(r.stall.total_ns), Sec(r.stall.median_ns), Sec(r.stall.p99_ns));
  out += Line("owners: refused %" PRIu64 " opens of a rank another process had open",
              r.refusals.owners);
  out += Line("limits: %u streams per rank; refused %" PRIu64 " streams, %" PRIu64
              " connections (too many open); %" PRIu64 " connections timed out",
              r.refusals.streams_per_rank, r.refusals.streams, r.refusals.connections,
              r.refusals.timed_out);
  out += Line("cpu: user %.2f s, system %.2f s", Sec(r.cpu_user_ns), Sec(r.cpu_system_ns));
  return out;
}

std::string RenderJson(const StatusReport& r) {
  Json o;
  o["version"] = kReportVersion;
  o["job"] = JsonBytes(r.job_id);
  o["node"] = r.node;
  o["nodes"] = r.nodes;
  o["pid"] = r.pid;
  o["uptime_ns"] = r.uptime_ns;
  o["dataset"] = {
      {"path", JsonBytes(r.dataset)}, {"samples", r.dataset_samples}, {"bytes", r.dataset_bytes}};
  o["predicted_stall_ns"] = CountOrNull(r.predicted_stall_ns);
  Json& tiers = o["tiers"] = Json::array();
  for (const Tier& t : r.tiers) {
    tiers.push_back({{"name", JsonBytes(t.name)},
                     {"prefetch", StateName(t.state)},
                     {"capacity_bytes", t.capacity},
                     {"planned_samples", t.planned_samples},
                     {"planned_bytes", t.planned_bytes},
                     {"ready_samples", t.ready_samples},
                     {"ready_bytes", t.ready_bytes},
                     {"kept_on_read", t.kept_on_read},
                     {"pushed_by_peers", t.pushed},
                     {"failed", t.failed},
                     {"rate_bytes_per_s", t.rate},
                     {"eta_ns", CountOrNull(t.eta_ns)}});
  }
  Json& streams = o["streams"] = Json::array();
  for (const Stream& s : r.streams) {
    streams.push_back({{"id", s.id},
                       {"rank", s.rank},
                       {"staged", s.staged},
                       {"total", s.total},
                       {"errors", s.errors},
                       {"read", s.read}});
  }
  Json& sources = o["sources"] = Json::array();
  for (const Source& s : r.sources) {
    sources.push_back({{"name", JsonBytes(s.name)},
                       {"samples", s.samples},
                       {"bytes", s.bytes},
                       {"zero_copy", s.zero_copy},
                       {"in_place", s.in_place}});
  }
  o["pfs_bytes"] = r.pfs_bytes;
  o["corrupt"] = r.corrupt;
  o["changed"] = r.changed;
  const auto kept = [&r](uint64_t report::Kept::*field) {
    return r.kept ? Json((*r.kept).*field) : Json(nullptr);
  };
  o["kept_bytes"] = kept(&report::Kept::kept_bytes);
  o["adopted_bytes"] = kept(&report::Kept::adopted_bytes);
  o["adopted_samples"] = kept(&report::Kept::adopted_samples);
  o["adopt_rejected_samples"] = kept(&report::Kept::adopt_rejected_samples);
  if (r.siblings) {
    const Siblings& s = *r.siblings;
    o["siblings"] = {{"through", JsonBytes(s.through)},    {"read_samples", s.read_samples},
                     {"read_bytes", s.read_bytes},         {"read_failed", s.read_failed},
                     {"served_samples", s.served_samples}, {"served_bytes", s.served_bytes}};
  } else {
    o["siblings"] = nullptr;
  }
  o["stall"] = {{"reads", r.stall.reads},
                {"total_ns", r.stall.total_ns},
                {"median_ns", r.stall.median_ns},
                {"p99_ns", r.stall.p99_ns},
                {"histogram", r.stall.histogram}};
  o["refusals"] = {{"owners", r.refusals.owners},
                   {"streams_per_rank", r.refusals.streams_per_rank},
                   {"streams", r.refusals.streams},
                   {"connections", r.refusals.connections},
                   {"timed_out", r.refusals.timed_out}};
  o["cpu"] = {{"user_ns", r.cpu_user_ns}, {"system_ns", r.cpu_system_ns}};
  if (r.peers) {
    const Peers& p = *r.peers;
    o["peers"] = {{"node", p.node},
                  {"nodes", p.nodes},
                  {"state", JsonBytes(p.state)},
                  {"held_elsewhere", p.held_elsewhere},
                  {"needed", p.needed},
                  {"served_samples", p.served_samples},
                  {"served_bytes", p.served_bytes},
                  {"served_not_available", p.served_not_available},
                  {"fetched_samples", p.fetched_samples},
                  {"fetched_bytes", p.fetched_bytes},
                  {"fetch_not_available", p.fetch_not_available},
                  {"timeouts", p.timeouts},
                  {"refused", p.refused},
                  {"malformed", p.malformed},
                  {"dead", p.dead},
                  {"done_reports", p.done_reports},
                  {"rma", JsonBytes(p.rma)},
                  {"served_rma", p.served_rma},
                  {"fetched_rma", p.fetched_rma},
                  {"rma_failed", p.rma_failed},
                  {"served_in_place", p.served_in_place},
                  {"pushes_sent", p.pushes_sent},
                  {"push_bytes_sent", p.push_bytes_sent},
                  {"pushes_dropped", p.pushes_dropped},
                  {"pushes_received", p.pushes_received},
                  {"pushes_kept", p.pushes_kept},
                  {"copied_samples", p.copied_samples},
                  {"copied_bytes", p.copied_bytes},
                  {"deferred", p.deferred},
                  {"fill_gave_up", p.fill_gave_up}};
  } else {
    o["peers"] = nullptr;
  }
  return DumpJson(o);
}

std::string RenderRunSummary(const StatusReport& r) {
  std::string out = "source       samples        bytes\n";
  char buf[256];
  for (const Source& s : r.sources) {
    std::snprintf(buf, sizeof buf, "%-8s %11" PRIu64 " %12s\n", s.name.c_str(), s.samples,
                  Bytes(s.bytes).c_str());
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "pfs read in all (prefetch included): %s\n",
                Bytes(r.pfs_bytes).c_str());
  out += buf;
  if (r.kept && (r.kept->adopted_samples > 0 || r.kept->adopt_rejected_samples > 0)) {
    std::snprintf(buf, sizeof buf,
                  "adopted from the kept copy: %" PRIu64 " samples, %s (%" PRIu64 " rejected)\n",
                  r.kept->adopted_samples, Bytes(r.kept->adopted_bytes).c_str(),
                  r.kept->adopt_rejected_samples);
    out += buf;
  }
  if (r.siblings && (r.siblings->read_samples > 0 || r.siblings->served_samples > 0)) {
    std::snprintf(buf, sizeof buf,
                  "siblings: read %" PRIu64 " samples, %s; served %" PRIu64 " samples, %s\n",
                  r.siblings->read_samples, Bytes(r.siblings->read_bytes).c_str(),
                  r.siblings->served_samples, Bytes(r.siblings->served_bytes).c_str());
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "stall: total %s, median %s, p99 %s over %" PRIu64 " reads\n",
                FormatSeconds(Sec(r.stall.total_ns)).c_str(),
                FormatSeconds(Sec(r.stall.median_ns)).c_str(),
                FormatSeconds(Sec(r.stall.p99_ns)).c_str(), r.stall.reads);
  out += buf;
  return out;
}

}  // namespace nopfs::report
