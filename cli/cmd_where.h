// `nopfs where DATASET` (the user): the nodes that hold the user's kept copy of DATASET, as
// placement marks them in Slurm (docs/admin.md, "Placement"). The user cannot compute the mark
// (the key is root's and SlurmUser's): a test job (`sbatch --test-only`, which submits nothing)
// asks slurmctld, whose job_submit.lua answers with the user's own mark, to that user alone, and
// Slurm's answer says where a job on the dataset would start now; `sinfo` then lists the nodes
// carrying the mark. Size and last use are known on the node itself (the user's own kept area):
// they are shown for the node the command runs on.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterWhere(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
