// TierRef: one storage class of the node as the reader, the peers and the daemon see it: its name
// and its tier (none for a class that holds nothing in this job). `tier` is what every tier does
// (layout, slots, readiness, fill); `ram` and `ssd` are set for the kind it is, for what only that
// kind does (RAM: the mapping clients read in place and peers read by RMA; SSD: its files, kept
// at exit).
#pragma once

#include <string>
#include <utility>

#include "service/tiers/ram_tier.h"
#include "service/tiers/ssd_tier.h"
#include "service/tiers/tier_layout.h"

namespace nopfs::service {

struct TierRef {
  std::string name;
  Tier* tier = nullptr;  // null for an empty class
  RamTier* ram = nullptr;
  SsdTier* ssd = nullptr;

  static TierRef Empty(std::string name) {
    return TierRef{std::move(name), nullptr, nullptr, nullptr};
  }
  static TierRef Of(std::string name, RamTier* t) {
    return TierRef{std::move(name), t, t, nullptr};
  }
  static TierRef Of(std::string name, SsdTier* t) {
    return TierRef{std::move(name), t, nullptr, t};
  }
};

}  // namespace nopfs::service
