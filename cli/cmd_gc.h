// `nopfs gc` (root): applies the site's rules to every user's kept datasets on this node
// (kept/space.h): removes incomplete entries that no live nopfsd holds, datasets past
// their user's lifetime, and the least recently used ones of a user over quota, with the
// quotas and lifetimes of the policy's keep hook (lua/admit.h); prints what it removed. For a
// timer or the epilog; the prolog does the same before every job.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterGc(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
