// A Slurm node list ("n[1-3,7],gpu[08-09],login") expanded by libslurm itself
// (slurm_hostlist_create and slurm_hostlist_shift), so that nopfs numbers a job's nodes exactly as
// Slurm does: node i of the job is the i-th name of SLURM_JOB_NODELIST.
//
// Where the functions come from: nopfs-job and the tests link libslurm.so; the SPANK plugin does
// not link it, and takes them from the process that loaded it (slurmd, slurmstepd, sbatch, srun
// and salloc all link libslurmfull.so, which exports the same slurm_hostlist_* symbols).
//
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace nopfs::spank {

// At most this many names: a longer list is refused rather than expanded.
inline constexpr size_t kMaxHostlistNames = 65536;

// The names of `list`, in order. InvalidArgument, naming the list, when libslurm cannot parse it,
// when it holds no name or more than kMaxHostlistNames, or a name that is not a host name
// (letters, digits, '.', '_', '-'; options.h CheckComponent).
Result<std::vector<std::string>> ExpandHostlist(std::string_view list);

// Index of `node` in the expanded list; NotFound when absent.
Result<uint32_t> NodeIndex(std::string_view list, std::string_view node);

}  // namespace nopfs::spank
