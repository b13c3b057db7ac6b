// Phases: the wall time of a sequence of named steps, for one log line ("scan 1.20, store 0.05").
// nopfsd's start-up line (docs/service.md, "Start-up") and the catalog's part of it.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nopfs {

class Phases {
 public:
  using Clock = std::chrono::steady_clock;

  Phases() : last_(Clock::now()) {}

  // Ends the current phase as `name`: the time since the last Mark (or construction). A name
  // already marked adds to it, keeping its place.
  // `detail` is printed after the time, in brackets (a phase's own parts).
  void Mark(std::string_view name, std::string_view detail = {}) {
    const Clock::time_point now = Clock::now();
    Add(name, std::chrono::duration<double>(now - last_).count());
    if (!detail.empty()) details_[name_index(name)] = std::string(detail);
    last_ = now;
  }
  // Adds `seconds` measured elsewhere to `name` (the current phase's clock runs on).
  void Add(std::string_view name, double seconds) { phases_[name_index(name)].second += seconds; }
  // Restarts the current phase's clock (the time since the last Mark is not counted).
  void Skip() { last_ = Clock::now(); }

  double total() const {
    double t = 0;
    for (const auto& [n, s] : phases_)
      t += s;
    return t;
  }
  // "name 0.12, other 1.50": seconds, in the order the names were first marked.
  std::string ToString() const {
    std::string out;
    for (size_t i = 0; i < phases_.size(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " %.2f", phases_[i].second);
      if (!out.empty()) out += ", ";
      out += phases_[i].first;
      out += buf;
      if (!details_[i].empty()) out += " (" + details_[i] + ")";
    }
    return out;
  }

 private:
  size_t name_index(std::string_view name) {
    for (size_t i = 0; i < phases_.size(); ++i)
      if (phases_[i].first == name) return i;
    phases_.emplace_back(std::string(name), 0.0);
    details_.emplace_back();
    return phases_.size() - 1;
  }

  Clock::time_point last_;
  std::vector<std::pair<std::string, double>> phases_;
  std::vector<std::string> details_;  // by phase
};

}  // namespace nopfs
