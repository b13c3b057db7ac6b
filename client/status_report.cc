#include "client/status_report.h"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>

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

// JSON: a string with the escapes RFC 8259 requires.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Builds one JSON object, member by member.
class Obj {
 public:
  Obj& U(const char* key, uint64_t v) { return Raw(key, std::to_string(v)); }
  Obj& S(const char* key, const std::string& v) { return Raw(key, Quote(v)); }
  Obj& B(const char* key, bool v) { return Raw(key, v ? "true" : "false"); }
  Obj& Raw(const char* key, const std::string& json) {
    out_ += (out_.size() > 1 ? "," : "");
    out_ += Quote(key);
    out_ += ':';
    out_ += json;
    return *this;
  }
  std::string str() const { return out_ + "}"; }

 private:
  std::string out_ = "{";
};

template <typename T, typename F>
std::string Array(const std::vector<T>& items, F one) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    out += i ? "," : "";
    out += one(items[i]);
  }
  return out + "]";
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
  out += Line("peers rma: %s; served %" PRIu64 " and fetched %" PRIu64
              " samples by RMA reads, %" PRIu64 " failed",
              p.rma.c_str(), p.served_rma, p.fetched_rma, p.rma_failed);
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
  Obj o;
  o.U("version", kReportVersion)
      .S("job", r.job_id)
      .U("node", r.node)
      .U("nodes", r.nodes)
      .U("pid", r.pid)
      .U("uptime_ns", r.uptime_ns);
  o.Raw(
      "dataset",
      Obj().S("path", r.dataset).U("samples", r.dataset_samples).U("bytes", r.dataset_bytes).str());
  o.Raw("predicted_stall_ns",
        r.predicted_stall_ns == kUnknown ? "null" : std::to_string(r.predicted_stall_ns));
  o.Raw("tiers", Array(r.tiers, [](const Tier& t) {
          return Obj()
              .S("name", t.name)
              .S("prefetch", StateName(t.state))
              .U("capacity_bytes", t.capacity)
              .U("planned_samples", t.planned_samples)
              .U("planned_bytes", t.planned_bytes)
              .U("ready_samples", t.ready_samples)
              .U("ready_bytes", t.ready_bytes)
              .U("kept_on_read", t.kept_on_read)
              .U("pushed_by_peers", t.pushed)
              .U("failed", t.failed)
              .U("rate_bytes_per_s", t.rate)
              .Raw("eta_ns", t.eta_ns == kUnknown ? "null" : std::to_string(t.eta_ns))
              .str();
        }));
  o.Raw("streams", Array(r.streams, [](const Stream& s) {
          return Obj()
              .U("id", s.id)
              .U("rank", s.rank)
              .U("staged", s.staged)
              .U("total", s.total)
              .U("errors", s.errors)
              .U("read", s.read)
              .str();
        }));
  o.Raw("sources", Array(r.sources, [](const Source& s) {
          return Obj()
              .S("name", s.name)
              .U("samples", s.samples)
              .U("bytes", s.bytes)
              .B("zero_copy", s.zero_copy)
              .U("in_place", s.in_place)
              .str();
        }));
  o.U("pfs_bytes", r.pfs_bytes).U("corrupt", r.corrupt).U("changed", r.changed);
  const auto kept = [&r](uint64_t report::Kept::*field) {
    return r.kept ? std::to_string((*r.kept).*field) : std::string("null");
  };
  o.Raw("kept_bytes", kept(&report::Kept::kept_bytes))
      .Raw("adopted_bytes", kept(&report::Kept::adopted_bytes))
      .Raw("adopted_samples", kept(&report::Kept::adopted_samples))
      .Raw("adopt_rejected_samples", kept(&report::Kept::adopt_rejected_samples));
  if (r.siblings) {
    const Siblings& s = *r.siblings;
    o.Raw("siblings", Obj()
                          .S("through", s.through)
                          .U("read_samples", s.read_samples)
                          .U("read_bytes", s.read_bytes)
                          .U("read_failed", s.read_failed)
                          .U("served_samples", s.served_samples)
                          .U("served_bytes", s.served_bytes)
                          .str());
  } else {
    o.Raw("siblings", "null");
  }
  std::string hist = "[";
  for (size_t b = 0; b < kStallBuckets; ++b) {
    hist += b ? "," : "";
    hist += std::to_string(r.stall.histogram[b]);
  }
  o.Raw("stall", Obj()
                     .U("reads", r.stall.reads)
                     .U("total_ns", r.stall.total_ns)
                     .U("median_ns", r.stall.median_ns)
                     .U("p99_ns", r.stall.p99_ns)
                     .Raw("histogram", hist + "]")
                     .str());
  o.Raw("refusals", Obj()
                        .U("owners", r.refusals.owners)
                        .U("streams_per_rank", r.refusals.streams_per_rank)
                        .U("streams", r.refusals.streams)
                        .U("connections", r.refusals.connections)
                        .U("timed_out", r.refusals.timed_out)
                        .str());
  o.Raw("cpu", Obj().U("user_ns", r.cpu_user_ns).U("system_ns", r.cpu_system_ns).str());
  if (r.peers) {
    const Peers& p = *r.peers;
    std::string dead = "[";
    for (size_t i = 0; i < p.dead.size(); ++i) {
      dead += i ? "," : "";
      dead += std::to_string(p.dead[i]);
    }
    o.Raw("peers", Obj()
                       .U("node", p.node)
                       .U("nodes", p.nodes)
                       .S("state", p.state)
                       .U("held_elsewhere", p.held_elsewhere)
                       .U("needed", p.needed)
                       .U("served_samples", p.served_samples)
                       .U("served_bytes", p.served_bytes)
                       .U("served_not_available", p.served_not_available)
                       .U("fetched_samples", p.fetched_samples)
                       .U("fetched_bytes", p.fetched_bytes)
                       .U("fetch_not_available", p.fetch_not_available)
                       .U("timeouts", p.timeouts)
                       .U("refused", p.refused)
                       .U("malformed", p.malformed)
                       .Raw("dead", dead + "]")
                       .U("done_reports", p.done_reports)
                       .S("rma", p.rma)
                       .U("served_rma", p.served_rma)
                       .U("fetched_rma", p.fetched_rma)
                       .U("rma_failed", p.rma_failed)
                       .U("pushes_sent", p.pushes_sent)
                       .U("push_bytes_sent", p.push_bytes_sent)
                       .U("pushes_dropped", p.pushes_dropped)
                       .U("pushes_received", p.pushes_received)
                       .U("pushes_kept", p.pushes_kept)
                       .U("copied_samples", p.copied_samples)
                       .U("copied_bytes", p.copied_bytes)
                       .U("deferred", p.deferred)
                       .U("fill_gave_up", p.fill_gave_up)
                       .str());
  } else {
    o.Raw("peers", "null");
  }
  return o.str();
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
