// The job flags shared by nopfsd and `nopfs stream`, `plan`, `simulate` and `run`: one definition
// so that every program spells and validates them the same way.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "policy/job.h"

namespace nopfs::launch {

struct JobFlags {
  policy::JobSpec job;
  std::string scheme = "strided";
};

// Adds --seed --samples --epochs --ranks --batch --scheme --drop-last --ranks-per-node to `app`.
// `samples_required` is false where the dataset can tell F instead.
void AddJobFlags(CLI::App* app, JobFlags* flags, bool samples_required);

// Parses the scheme into flags->job and validates the whole job; the message names the flag.
Status FinishJobFlags(JobFlags* flags);

}  // namespace nopfs::launch
