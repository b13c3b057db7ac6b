// `nopfs where DATASET` (the user): the nodes that the user's next job on DATASET prefers, as
// placement marks them in Slurm (docs/admin.md, "Placement"): the user's kept copy, the user's
// running job whose tiers serve the user's other jobs (the same mark), and, for a dataset the
// site shares, the node's shared copy (the dataset's shared mark). The user cannot compute a
// mark (the key is root's and SlurmUser's): a test job (`sbatch --test-only`, which submits
// nothing) asks slurmctld, whose job_submit.lua answers with the user's own mark (and the shared
// one), to that user alone; `sinfo` then lists the nodes carrying them. Which of a kept copy and
// a running job's tiers gave a node the user's mark is known on the node itself (the user's kept
// area and sibling registry), shown for the node the command runs on; of another node, `squeue
// --me` tells only whether a job of the user runs there.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterWhere(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
