#include "kept/node.h"

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <ctime>
#include <optional>

#include "common/units.h"

namespace nopfs::kept {
namespace {

std::string Canonical(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) != nullptr ? std::string(buf) : path;
}

std::function<KeepLimits(uint32_t)> LimitsOf(lua::KeepGrants* grants) {
  return [grants](uint32_t uid) {
    const lua::KeepGrant g = grants->For(uid);
    return KeepLimits{g.quota, g.lifetime};
  };
}

// Whether kept dataset `k` holds `dataset` (as given, or its canonical path).
bool Holds(const KeptEntry& k, const std::string& dataset, const std::string& canonical) {
  return k.Complete() && !k.stray && (k.data.dataset == dataset || k.data.dataset == canonical);
}

ScanOptions RootScan(std::optional<uint32_t> only_uid, const std::vector<LiveJob>& live) {
  ScanOptions o;
  o.only_uid = only_uid;
  o.root = true;
  o.live = LiveDirs(live);
  return o;
}

void Append(std::string* out, const std::string& what) {
  if (!what.empty()) *out += (out->empty() ? "" : "; ") + what;
}

}  // namespace

std::function<bool(uint32_t, const std::string&)> LiveDirs(std::vector<LiveJob> live) {
  return [live = std::move(live)](uint32_t uid, const std::string& name) {
    return std::any_of(live.begin(), live.end(), [&](const LiveJob& j) {
      return j.uid == uid && IsJobDir(name, j.job_id, j.index);
    });
  };
}

NodeKept::NodeKept(KeepJob job, const lua::NodeConfig& config,
                   const std::vector<std::string>& ssd_paths, const std::vector<LiveJob>& live,
                   lua::NodeState* ns)
    : job_(std::move(job)),
      kept_(KeptNode::Scan(ssd_paths, RootScan(std::nullopt, live))),
      grants_(job_.policy, config, WithKept(*ns)) {
  removed_ = kept_.Sweep(LimitsOf(&grants_), ::time(nullptr));
  *ns = WithKept(*ns);
}

lua::NodeState NodeKept::WithKept(lua::NodeState ns) const {
  // What is in use (a live process holds it) cannot be evicted: it counts as reserved.
  ns.ssd_kept = kept_.Bytes() - kept_.HeldBytes();
  ns.ssd_reserved += kept_.HeldBytes();
  return ns;
}

KeepPlan NodeKept::Admitted(const lua::NodeState& ns, const lua::Admission& adm) {
  const std::string canonical = Canonical(job_.dataset);
  auto adoptable = [&](const KeptEntry& k) {
    return k.uid == job_.uid && Holds(k, job_.dataset, canonical);
  };
  uint64_t own = 0;
  for (const KeptEntry& k : kept_.entries()) {
    if (adoptable(k)) own += k.data.bytes;
  }
  KeepPlan plan;
  const lua::KeepGrant g = grants_.For(job_.uid);
  const bool keeps = job_.keep && !grants_.Failed(job_.uid) && g.quota != 0 && adm.ssd != 0;
  // A job that keeps takes its own copies: their disk is freed as its SSD tier fills, so they
  // count within its grant. One that keeps nothing reads them and leaves them kept: they stay
  // beside its tier.
  const uint64_t used = ns.ssd_reserved + adm.ssd;
  const uint64_t room = (ns.ssd_total > used ? ns.ssd_total - used : 0) +
                        (keeps ? std::min<uint64_t>(own, adm.ssd) : 0);
  for (Removal& r : kept_.MakeRoom(room, adoptable))
    removed_.push_back(std::move(r));

  if (!job_.keep) {
    plan.note = "keeps nothing (--nopfs-keep=no)";
  } else if (grants_.Failed(job_.uid)) {
    plan.note = "keeps nothing (the policy's keep failed)";
  } else if (g.quota == 0) {
    // The site keeps nothing for this user: nothing worth saying.
  } else if (adm.ssd == 0) {
    plan.note = "keeps nothing (no SSD tier)";
  } else {
    plan.keep = keeps;
    plan.max_bytes = std::min<uint64_t>(g.quota, adm.ssd);
    plan.note = "keeps up to " + FormatBytes(static_cast<double>(plan.max_bytes));
    if (own != 0) plan.note += ", adopts " + FormatBytes(static_cast<double>(own)) + " kept";
  }
  if (!keeps && own != 0) {
    Append(&plan.note,
           "reads " + FormatBytes(static_cast<double>(own)) + " kept and leaves it kept");
  }
  for (const std::string& e : grants_.errors())
    Append(&plan.note, e);
  for (const std::string& e : kept_.errors())
    Append(&plan.note, e);
  if (!removed_.empty()) {
    Append(&plan.note, "kept datasets removed: " + DescribeRemovals(removed_));
  }
  return plan;
}

std::string AfterJob(const std::string& policy, const lua::NodeConfig& config,
                     const std::string& node, const std::vector<std::string>& ssd_paths,
                     uint32_t uid, const std::string& dataset, const std::vector<LiveJob>& live) {
  lua::NodeState ns;
  ns.name = node;
  ns.ram_total = config.CapacityOf(policy::ClassKind::kRam);
  ns.ssd_total = config.SsdForJobs();
  KeptNode kept = KeptNode::Scan(ssd_paths, RootScan(uid, live));
  const std::string canonical = Canonical(dataset);
  kept.MarkUsed(uid, [&](const KeptEntry& k) { return Holds(k, dataset, canonical); });
  ns.ssd_kept = kept.Bytes() - kept.HeldBytes();
  lua::KeepGrants grants(policy, config, ns);
  const std::vector<Removal> removed = kept.Sweep(LimitsOf(&grants), ::time(nullptr));
  std::string notes;
  for (const std::string& e : grants.errors())
    notes += e + "; ";
  for (const std::string& e : kept.errors())
    notes += e + "; ";
  if (!removed.empty()) notes += "kept datasets removed: " + DescribeRemovals(removed) + "; ";
  if (kept.BytesOf(uid) != 0) {
    notes += "kept " + FormatBytes(static_cast<double>(kept.BytesOf(uid))) + "; ";
  }
  return notes;
}

}  // namespace nopfs::kept
