// Which declared shared dataset (lua/config.h, `shared`) a job's dataset is, for the prolog
// (docs/admin.md, "Shared datasets"). The job's path is the user's text: root compares it
// lexically and never touches the file system with it, so no link of the user's decides sharing.
// nopfsd, as the user, compares the canonical paths again before it uses the copy.
//
// Thread safety: reentrant.
#pragma once

#include <string_view>

#include "lua/config.h"

namespace nopfs::spank {

// The declaration whose path is the dataset's, both normalized as placement names datasets
// (MarkPath: empty and "." components dropped, so "/pfs/data/", "/pfs//data" and "/pfs/./data"
// are "/pfs/data"; ".." is kept, since only the file system knows where it leads); null when
// none is.
const lua::SharedDecl* SharedDeclFor(const lua::NodeConfig& config, std::string_view dataset);

}  // namespace nopfs::spank
