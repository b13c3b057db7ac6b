// ReadSmallFile: the one way nopfs reads a small file that someone else could have replaced (a
// user's run directory, the kept area, the node's ledger, /proc): opened without following a link
// in its last component, without blocking on a FIFO and without becoming a controlling terminal,
// then checked through its descriptor (a regular file, not larger than a cap, optionally of a
// given owner) and read whole, at most the cap even when it grows meanwhile.
//
// Thread safety: reentrant.
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace nopfs {

struct SmallFileRules {
  uint64_t max_bytes = 64 * 1024;  // a larger file is refused; at most this much is read
  std::optional<uid_t> owner;      // set: the file must belong to this uid
};

// The bytes of the regular file `name` in the directory `dir_fd` (AT_FDCWD: `name` is a path).
// Each error says what was wrong, naming `name`:
//   NotFound          "<name> does not exist"
//   PermissionDenied  "<name> is a symbolic link; not reading it"
//                     "<name> is a FIFO|a directory|a socket|a device|not a regular file; ..."
//                     "<name> belongs to uid U, not O; not reading it"
//                     "<name> holds N bytes, more than M; not reading it"
//   other             "open|stat|read <name>: <strerror>" (Status::FromErrno)
Result<std::string> ReadSmallFileAt(int dir_fd, const std::string& name,
                                    const SmallFileRules& rules);
inline Result<std::string> ReadSmallFile(const std::string& path, const SmallFileRules& rules) {
  return ReadSmallFileAt(AT_FDCWD, path, rules);
}

// What a file of mode `mode` is, for messages: "a symbolic link", "a FIFO", "a directory",
// "a socket", "a device" or "not a regular file".
std::string FileKind(mode_t mode);

}  // namespace nopfs
