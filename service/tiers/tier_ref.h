// TierRef: one storage class of the node as the reader, the peers and the daemon see it: its name
// and its tier (none for a class that holds nothing in this job). tier() is what every tier does
// (layout, slots, readiness, fill); `ram` or `ssd` is set for the kind it is, for what only that
// kind does (RAM: the mapping clients read in place and peers read by RMA; SSD: its files, kept
// at exit).
#pragma once

#include <string>

#include "service/tiers/ram_tier.h"
#include "service/tiers/ssd_tier.h"
#include "service/tiers/tier_layout.h"

namespace nopfs::service {

struct TierRef {
  std::string name;
  RamTier* ram = nullptr;  // set for a RAM class that holds samples in this job
  SsdTier* ssd = nullptr;  // set for an SSD class that holds samples in this job

  // The class's tier, whichever kind it is; null for an empty class.
  Tier* tier() const {
    if (ram != nullptr) return ram;
    return ssd;
  }
};

}  // namespace nopfs::service
