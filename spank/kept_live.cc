#include "spank/kept_live.h"

#include <sys/stat.h>

#include <chrono>

namespace nopfs::spank {

kept::LiveJob LiveJobOf(const LedgerEntry& e) {
  return kept::LiveJob{e.uid, e.job_id, e.node_index};
}

std::vector<kept::LiveJob> LiveJobs(const std::string& ledger_dir, std::string* error) {
  std::vector<kept::LiveJob> out;
  struct stat st {};
  if (::lstat(ledger_dir.c_str(), &st) != 0) return out;
  Result<Ledger> l = Ledger::Lock(ledger_dir, std::chrono::seconds(30));
  if (!l.ok()) {
    *error = l.status().message();
    return out;
  }
  Result<std::vector<LedgerEntry>> entries = l->Entries();
  if (!entries.ok()) {
    *error = entries.status().message();
    return out;
  }
  for (const LedgerEntry& e : *entries)
    out.push_back(LiveJobOf(e));
  return out;
}

}  // namespace nopfs::spank
