// `nopfs status [--json] [--watch [--interval S]]`: asks the local nopfsd for its structured
// status (docs/wire.md, "Structured status") and prints it as prose (the lines docs/service.md,
// "Status", lists), as one JSON object (the schema there), or, with --watch, refreshed every
// interval until the service goes away: per tier a progress line (a bar on a terminal), or one
// JSON object per line with --json.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterStatus(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
