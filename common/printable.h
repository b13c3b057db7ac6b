// Printable: a string of foreign bytes (a name or path from a user's file or directory, a field of
// a user's record) made safe to print in a log line or a terminal that others read, root's above
// all: one line, nothing a terminal or a log reader interprets.
//
// The rule: printable ASCII (0x20 to 0x7e) stands as it is, but for the backslash, written "\\";
// every other byte (control characters, newline included, DEL, and every byte of 0x80 and above)
// is written "\xNN" with two lowercase hex digits. The result is unambiguous (the original bytes
// can be read back from it) and never holds a newline, so a user cannot add a line of their own
// to root's log or make one line read as another. Every string of foreign bytes that root logs or
// prints (the launcher's lines in slurmd's log, `nopfs gc`, `nopfs cache`) goes through it.
//
// Thread safety: reentrant.
#pragma once

#include <string>
#include <string_view>

namespace nopfs {

// At most `max_bytes` of `bytes` are shown; a longer input ends in "..." after them.
std::string Printable(std::string_view bytes, size_t max_bytes = std::string_view::npos);

}  // namespace nopfs
