#include "common/json.h"

#include <cstdint>

namespace nopfs {
namespace {

// A string that is not well-formed UTF-8 (or holds a NUL) travels through the library as this
// marker around the hex of its bytes; DumpJson replaces the marker, as the library wrote it, with
// the escaped bytes. The marker begins and ends with NUL, which no string that reaches the
// library by JsonBytes holds otherwise, so no string can pass for one.
constexpr std::string_view kMarkerBegin = std::string_view("\0\1nopfs-bytes\1", 14);
constexpr std::string_view kMarkerEnd = std::string_view("\0", 1);
// The same as the library writes them (control characters as \u00XX, lowercase hex).
constexpr std::string_view kDumpedBegin = "\\u0000\\u0001nopfs-bytes\\u0001";
constexpr std::string_view kDumpedEnd = "\\u0000";

constexpr char kHex[] = "0123456789abcdef";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The length of the well-formed UTF-8 sequence at s[i], or 0 when s[i] does not start one.
size_t SequenceAt(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  const size_t left = s.size() - i;
  if (c < 0x80) return 1;
  const auto cont = [&](size_t k) { return (b(k) & 0xc0) == 0x80; };
  if (c >= 0xc2 && c <= 0xdf) return left >= 2 && cont(i + 1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    if (left < 3 || !cont(i + 1) || !cont(i + 2)) return 0;
    if (c == 0xe0 && b(i + 1) < 0xa0) return 0;   // overlong
    if (c == 0xed && b(i + 1) >= 0xa0) return 0;  // a surrogate
    return 3;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    if (left < 4 || !cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    if (c == 0xf0 && b(i + 1) < 0x90) return 0;   // overlong
    if (c == 0xf4 && b(i + 1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;  // a continuation byte, 0xc0, 0xc1 or 0xf5 and above
}

// "\u" and four lowercase hex digits, as the library writes an escape.
void AppendEscape(std::string* out, uint16_t code) {
  *out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4)
    *out += kHex[(code >> shift) & 0xf];
}

}  // namespace

bool IsUtf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = SequenceAt(bytes, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string JsonStringBody(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = SequenceAt(bytes, i);
    const auto c = static_cast<uint8_t>(bytes[i]);
    if (n == 0) {
      AppendEscape(&out, static_cast<uint16_t>(0xdc00 | c));
      ++i;
      continue;
    }
    if (n == 1) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (c < 0x20) {
            AppendEscape(&out, c);
          } else {
            out += static_cast<char>(c);
          }
      }
    } else {
      out.append(bytes.substr(i, n));
    }
    i += n;
  }
  return out;
}

Json JsonBytes(std::string_view bytes) {
  if (bytes.find('\0') == std::string_view::npos && IsUtf8(bytes)) return Json(std::string(bytes));
  std::string marked(kMarkerBegin);
  for (const char ch : bytes) {
    const auto c = static_cast<uint8_t>(ch);
    marked += kHex[c >> 4];
    marked += kHex[c & 0xf];
  }
  marked += kMarkerEnd;
  return Json(std::move(marked));
}

std::string DumpJson(const Json& value, int indent) {
  const std::string text =
      value.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::strict);
  std::string out;
  out.reserve(text.size());
  size_t at = 0;
  for (;;) {
    const size_t begin = text.find(kDumpedBegin, at);
    if (begin == std::string::npos) break;
    const size_t hex = begin + kDumpedBegin.size();
    const size_t end = text.find(kDumpedEnd, hex);
    std::string bytes;
    bool ok = end != std::string::npos && (end - hex) % 2 == 0;
    for (size_t i = hex; ok && i < end; i += 2) {
      const int hi = HexValue(text[i]);
      const int lo = HexValue(text[i + 1]);
      ok = hi >= 0 && lo >= 0;
      bytes += static_cast<char>(hi * 16 + lo);
    }
    if (!ok) {  // not a marker after all: copied as it is
      out.append(text, at, hex - at);
      at = hex;
      continue;
    }
    out.append(text, at, begin - at);
    out += JsonStringBody(bytes);
    at = end + kDumpedEnd.size();
  }
  out.append(text, at, std::string::npos);
  return out;
}

}  // namespace nopfs
