// `nopfs admin` (root): turns the SPANK plugin on and off on a node. The package installs the
// plugin's plugstack line at /usr/share/nopfs/plugstack.conf, where Slurm does not read it:
// installing nopfs changes nothing until the admin runs `nopfs admin enable`, which checks what
// the plugin needs (the plugin itself, the node config, the policy, PrologFlags=Alloc in
// slurm.conf, the peer key if the line names one), says which is missing, and only when nothing
// is writes /etc/slurm/plugstack.conf.d/nopfs.conf. `disable` (and the package's removal) moves
// that file aside as nopfs.conf.disabled, keeping the admin's edits for the next `enable`, so
// that Slurm never reads a line naming a plugin that is gone. `status` says which it is.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterAdmin(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
