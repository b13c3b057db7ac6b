// A path's lexical form: how placement and the shared datasets name a dataset (the text after
// --nopfs=), without asking the file system, so that no link is followed in deciding it.
//
// Thread safety: reentrant.
#pragma once

#include <string>
#include <string_view>

namespace nopfs {

// "/" and `path`'s components without empty and "." ones: "/pfs//ds/./" is "/pfs/ds", "" and
// "/" are "/". ".." is kept as a component (resolving it would need the file system).
inline std::string LexicalPath(std::string_view path) {
  std::string out;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string_view::npos) slash = path.size();
    const std::string_view part = path.substr(pos, slash - pos);
    if (!part.empty() && part != ".") {
      out += '/';
      out += part;
    }
    pos = slash + 1;
  }
  return out.empty() ? "/" : out;
}

}  // namespace nopfs
