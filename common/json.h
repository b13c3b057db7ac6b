// JSON, written and read with nlohmann/json (Debian's nlohmann-json3-dev), and the one rule for
// strings that are bytes rather than text.
//
// Every JSON nopfs writes (`nopfs status --json`, the status report, `nopfs cache ls --json`,
// `nopfs simulate --format json`) is a Json value made with the library and turned into text by
// DumpJson; nothing writes JSON by hand.
//
// Bytes that are not UTF-8. A path on Linux is bytes, and a dataset's may not be UTF-8
// (`bad\xffname`). JSON text is Unicode, so such a string cannot be written as it is; it is
// neither dropped nor replaced by U+FFFD. The rule (PEP 383's "surrogateescape", what Python
// does with such a path): every byte that is not part of a well-formed UTF-8 sequence (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF) is written as the escape \udcXX, XX
// being the byte (80 to ff). The text follows RFC 8259's grammar; Python's json and JavaScript's
// JSON.parse read such a string exactly (in Python, os.fsencode(json.loads(text)[...]) gives back
// the bytes), parsers that insist on paired surrogates (nlohmann/json itself, Rust's serde_json)
// refuse it, and some (jq, Go) read U+FFFD in its place. Well-formed UTF-8 is written as it is;
// a NUL byte is written as \u0000. Strings go into a Json
// value through JsonBytes, which applies the rule; a plain std::string of well-formed UTF-8 without
// NUL may be put in directly.
//
// Thread safety: reentrant.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace nopfs {

// Objects keep the order their members were added in (the order docs/ shows).
using Json = nlohmann::ordered_json;

// `bytes` as a Json string under the rule above.
Json JsonBytes(std::string_view bytes);

// The text of `value`: compact (indent < 0: no white space at all) or indented by `indent`
// spaces per level. Never throws for a value made of JsonBytes strings and numbers.
std::string DumpJson(const Json& value, int indent = -1);

// Whether `bytes` is well-formed UTF-8 (RFC 3629).
bool IsUtf8(std::string_view bytes);

// The body of a JSON string (without the quotes) holding `bytes` under the rule above: `"` and
// `\` escaped, control characters as \b \f \n \r \t or \u00XX, stray bytes as \udcXX.
std::string JsonStringBody(std::string_view bytes);

}  // namespace nopfs
