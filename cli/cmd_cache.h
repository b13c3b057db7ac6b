// `nopfs cache ls|rm`: the user's kept datasets on this machine (kept/area.h), as the
// user: `ls [--json]` lists key, dataset, size, age and last use; `rm KEY...|--all` removes.
// The kept area is found under the SSD classes of the node config (--config, default the
// installed /etc/nopfs/nopfs.conf.lua), in the caller's own <path>/nopfs-<uid>/kept.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterCache(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
