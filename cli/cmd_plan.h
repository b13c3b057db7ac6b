// `nopfs plan`: prints one node's plan for a job, a dataset and a node config: per class the
// samples and bytes it holds, the fraction of the node's reads expected from each source, and the
// model's predicted stall against a compute rate.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterPlan(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
