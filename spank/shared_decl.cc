#include "spank/shared_decl.h"

#include "spank/placement.h"

namespace nopfs::spank {

const lua::SharedDecl* SharedDeclFor(const lua::NodeConfig& config, std::string_view dataset) {
  if (dataset.empty() || dataset.front() != '/') return nullptr;
  const std::string d = MarkPath(dataset);
  for (const lua::SharedDecl& s : config.shared())
    if (MarkPath(s.path) == d) return &s;
  return nullptr;
}

}  // namespace nopfs::spank
