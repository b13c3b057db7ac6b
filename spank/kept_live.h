// The jobs of the node's ledger as the kept area's rules see them (kept/node.h LiveJob): their
// SSD directories are counted in their reservations, never as a user's kept bytes or strays.
//
// Thread safety: reentrant.
#pragma once

#include <string>
#include <vector>

#include "kept/node.h"
#include "spank/ledger.h"

namespace nopfs::spank {

kept::LiveJob LiveJobOf(const LedgerEntry& e);
// Every job the ledger in `ledger_dir` holds (taking its lock for the read); none when there is
// no ledger or it cannot be read (*error then says why).
std::vector<kept::LiveJob> LiveJobs(const std::string& ledger_dir, std::string* error);

}  // namespace nopfs::spank
