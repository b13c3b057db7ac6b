// StatusReport: nopfsd's structured status, the figures of the counters it keeps, as STATUS_OK
// carries it (docs/wire.md, "Structured status") and `nopfs status --json` prints it (schema in
// docs/service.md, "Status"). The prose of `nopfs status`, `nopfs run`'s summary and the status
// text a client asks for are all rendered from this one struct.
//
// Units: bytes, samples, nanoseconds, bytes per second. Thread safety: values; the functions are
// reentrant.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nopfs::report {

// The report's own version, asked for by STATUS and echoed by STATUS_OK. A change to the fields
// makes a new one.
inline constexpr uint16_t kReportVersion = 2;
inline constexpr size_t kStallBuckets = 64;       // bucket 0 = 0 ns, bucket b = [2^(b-1), 2^b) ns
inline constexpr uint64_t kUnknown = UINT64_MAX;  // an ETA that cannot be told yet

enum class TierState : uint8_t { kEmpty = 0, kRunning = 1, kDone = 2 };
inline constexpr uint8_t kLastTierState = 2;

// One storage class of the node's plan and what its prefetcher has staged.
struct Tier {
  std::string name;  // the class's name in the node config ("ram", "ssd")
  TierState state = TierState::kEmpty;
  uint64_t capacity = 0;         // the class's bytes (capped by the job's grant)
  uint64_t planned_samples = 0;  // samples the plan puts here
  uint64_t planned_bytes = 0;
  uint64_t ready_samples = 0;  // slots holding their sample now
  uint64_t ready_bytes = 0;
  uint64_t kept_on_read = 0;   // samples kept from staging reads (of ready)
  uint64_t pushed = 0;         // samples pushed by peers and kept (of ready)
  uint64_t failed = 0;         // slots the prefetcher could not fill
  uint64_t rate = 0;           // bytes per second staged into the tier over the last seconds
  uint64_t eta_ns = kUnknown;  // until ready_bytes reaches planned_bytes at `rate`; 0 when done
  bool operator==(const Tier&) const = default;
};

// One open stream (a rank's ring).
struct Stream {
  uint64_t id = 0;
  uint32_t rank = 0;
  uint64_t staged = 0;  // samples published into the ring
  uint64_t total = 0;   // samples the stream will publish
  uint64_t errors = 0;
  uint64_t read = 0;  // samples the client took out of the ring
  bool operator==(const Stream&) const = default;
};

// Where the samples handed to clients came from: a class name, "peer" or "pfs".
struct Source {
  std::string name;
  uint64_t samples = 0;
  uint64_t bytes = 0;
  bool zero_copy = false;  // the class the clients map (its reads may be served in place)
  uint64_t in_place = 0;   // of samples: served in place (zero copy)
  bool operator==(const Source&) const = default;
};

// How long clients waited inside Next(), over every stream of the job (closed ones included).
struct Stall {
  uint64_t reads = 0;  // samples returned
  uint64_t total_ns = 0;
  uint64_t median_ns = 0;  // upper bound of the histogram bucket holding it
  uint64_t p99_ns = 0;
  std::array<uint64_t, kStallBuckets> histogram{};  // Next() calls per bucket
  bool operator==(const Stall&) const = default;
};

struct Refusals {
  uint64_t owners = 0;            // opens of a rank another process had open
  uint32_t streams_per_rank = 0;  // the limit
  uint64_t streams = 0;           // opens past streams_per_rank
  uint64_t connections = 0;       // connections past the service's limit
  uint64_t timed_out = 0;         // connections closed for not sending a whole message in time
  bool operator==(const Refusals&) const = default;
};

// The job's other nodes (docs/fabric.md); present only when the job has peers.
struct Peers {
  uint32_t node = 0;
  uint32_t nodes = 0;
  // The directory's state in words ("starting", "directory of ...", "directory failed ...").
  std::string state;
  uint64_t held_elsewhere = 0;  // samples the directory found on other nodes (0 until built)
  uint64_t needed = 0;          // samples this node reads and does not hold (0 until built)
  uint64_t served_samples = 0;
  uint64_t served_bytes = 0;
  uint64_t served_not_available = 0;
  uint64_t fetched_samples = 0;
  uint64_t fetched_bytes = 0;
  uint64_t fetch_not_available = 0;
  uint64_t timeouts = 0;
  uint64_t refused = 0;  // handshakes refused (wrong secret)
  uint64_t malformed = 0;
  std::vector<uint32_t> dead;  // nodes found dead
  uint64_t done_reports = 0;   // classes the other nodes reported filled
  std::string rma;             // how RAM tiers are served
  uint64_t served_rma = 0;
  uint64_t fetched_rma = 0;
  uint64_t rma_failed = 0;
  uint64_t served_in_place = 0;  // RAM-tier samples served in replies sent straight from the tier
  uint64_t pushes_sent = 0;
  uint64_t push_bytes_sent = 0;
  uint64_t pushes_dropped = 0;
  uint64_t pushes_received = 0;
  uint64_t pushes_kept = 0;
  uint64_t copied_samples = 0;  // prefetched from the node that read them from the PFS
  uint64_t copied_bytes = 0;
  uint64_t deferred = 0;      // copies deferred until that node had them
  uint64_t fill_gave_up = 0;  // read from the PFS after all
  bool operator==(const Peers&) const = default;
};

// The kept area (docs/tiers.md): disk bytes kept at exit (0 until nopfsd stops), samples and bytes
// taken from the copy an earlier job kept, and its samples dropped (file changed, bytes differ,
// not in the dataset any more).
struct Kept {
  uint64_t kept_bytes = 0;
  uint64_t adopted_bytes = 0;
  uint64_t adopted_samples = 0;
  uint64_t adopt_rejected_samples = 0;
  bool operator==(const Kept&) const = default;
};

// Sibling jobs (docs/tiers.md, "Sibling jobs"): what this job read through another running job of
// its user on the node and dataset, and what it served to such jobs.
struct Siblings {
  std::string through;        // the job read through now ("<job id>.<node>"; "" when none)
  uint64_t read_samples = 0;  // taken from a sibling (prefetches and staging reads)
  uint64_t read_bytes = 0;
  uint64_t read_failed = 0;     // sibling reads that failed (each then read from the PFS)
  uint64_t served_samples = 0;  // answered to siblings (READ_SAMPLE)
  uint64_t served_bytes = 0;
  bool operator==(const Siblings&) const = default;
};

struct StatusReport {
  std::string job_id;
  uint32_t node = 0;
  uint32_t nodes = 0;
  uint32_t pid = 0;
  uint64_t uptime_ns = 0;
  std::string dataset;
  uint64_t dataset_samples = 0;
  uint64_t dataset_bytes = 0;
  // The model's stall for this node over the job if the clients took no time per sample (its
  // reading time: the most the plan lets them wait); kUnknown if it could not be predicted.
  uint64_t predicted_stall_ns = kUnknown;
  std::vector<Tier> tiers;  // fastest first
  std::vector<Stream> streams;
  std::vector<Source> sources;       // the tiers, "peer", "shared", "sibling", "pfs"
  uint64_t pfs_bytes = 0;            // every byte read from the PFS, prefetch included
  uint64_t corrupt = 0;              // tier reads that failed their checksum and were refetched
  uint64_t changed = 0;              // PFS reads that found a sample's file rewritten
  std::optional<Kept> kept;          // nopfsd always sets it (an optional group of the wire format)
  std::optional<Siblings> siblings;  // likewise (the group after kept's)
  Stall stall;
  Refusals refusals;
  uint64_t cpu_user_ns = 0;
  uint64_t cpu_system_ns = 0;
  std::optional<Peers> peers;
  bool operator==(const StatusReport&) const = default;
};

// What `nopfs status` prints (docs/service.md, "Status" lists its lines).
std::string RenderText(const StatusReport& r);
// One JSON object (docs/service.md, "Status"), without a trailing newline.
std::string RenderJson(const StatusReport& r);
// The figures at the end of `nopfs run`: per source samples and bytes, PFS bytes, stall.
std::string RenderRunSummary(const StatusReport& r);
// One line per tier: "tier ram: 1.20 GB of 4.00 GB staged (30%), 250 MB/s, ETA 11 s" (`bar`: a
// 20-character progress bar after the name, for a terminal).
std::string RenderProgress(const StatusReport& r, bool bar);
// The plan line a job prints at start: tiers, planned bytes, capacity.
std::string RenderPlanLine(const StatusReport& r);
// "12 us", "1.20 ms", "0.123 s".
std::string FormatSeconds(double s);
// "45 s", "3 min 20 s", "2 h 5 min"; "unknown" for kUnknown.
std::string FormatEta(uint64_t ns);

}  // namespace nopfs::report
