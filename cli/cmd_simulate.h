// `nopfs simulate`: runs the performance model as a discrete-event simulation (policy/simulate.h)
// for a job, a dataset and a node config, under each data-loading policy, and prints per policy
// the epoch times, the stall per batch (median, p99) and the bytes read from the PFS: as a table,
// as one `key=value` line per policy (--format kv) or as JSON (--format json). docs/simulate.md
// describes the model, the presets and the output.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterSimulate(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
