#include "spank/hostlist.h"

#include "spank/options.h"

#include <cstdlib>
#include <memory>

extern "C" {
#include <slurm/slurm.h>
}

namespace nopfs::spank {
namespace {

struct HostlistCloser {
  void operator()(hostlist_t hl) const { slurm_hostlist_destroy(hl); }
};
using HostlistPtr = std::unique_ptr<std::remove_pointer_t<hostlist_t>, HostlistCloser>;

Status Bad(std::string_view list, const std::string& why) {
  return Status::InvalidArgument("host list '" + std::string(list.substr(0, 200)) +
                                 (list.size() > 200 ? "...'" : "'") + ": " + why);
}

}  // namespace

Result<std::vector<std::string>> ExpandHostlist(std::string_view list) {
  if (list.empty()) return Bad(list, "no names");
  if (list.find('\0') != std::string_view::npos) return Bad(list, "a NUL byte in the list");
  const std::string text(list);
  HostlistPtr hl(slurm_hostlist_create(text.c_str()));
  if (!hl) return Bad(list, "Slurm cannot parse it");
  const int count = slurm_hostlist_count(hl.get());
  if (count <= 0) return Bad(list, "no names");
  if (static_cast<size_t>(count) > kMaxHostlistNames) {
    return Bad(list,
               std::to_string(count) + " names, more than " + std::to_string(kMaxHostlistNames));
  }
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(count));
  while (char* host = slurm_hostlist_shift(hl.get())) {
    out.emplace_back(host);
    std::free(host);  // slurm_hostlist_shift's string is the caller's, to free()
    // A name becomes part of paths and peer addresses: a host name, nothing else.
    if (Status s = CheckComponent("node name", out.back()); !s.ok()) return Bad(list, s.message());
  }
  if (out.size() != static_cast<size_t>(count)) {
    return Bad(list, "Slurm counted " + std::to_string(count) + " names and gave " +
                         std::to_string(out.size()));
  }
  return out;
}

Result<uint32_t> NodeIndex(std::string_view list, std::string_view node) {
  Result<std::vector<std::string>> names = ExpandHostlist(list);
  if (!names.ok()) return names.status();
  for (size_t i = 0; i < names->size(); ++i) {
    if ((*names)[i] == node) return static_cast<uint32_t>(i);
  }
  return Status::NotFound("node " + std::string(node) + " is not in the job's node list " +
                          std::string(list.substr(0, 200)));
}

}  // namespace nopfs::spank
