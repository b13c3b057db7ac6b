#include "common/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace nopfs {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

// Splits "  1.5 GiB" into 1.5 and "gib". Returns false if there is no leading number.
bool SplitNumber(std::string_view text, double* number, std::string* unit) {
  text = Trim(text);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' ||
                             text[i] == 'e' || text[i] == 'E' ||
                             ((text[i] == '+' || text[i] == '-') && i > 0 &&
                              (text[i - 1] == 'e' || text[i - 1] == 'E')))) {
    // Stop at an 'e' that starts a unit ("1EB" is not a unit we accept, but "1e3" is a number).
    if ((text[i] == 'e' || text[i] == 'E') &&
        (i + 1 >= text.size() || !(std::isdigit(static_cast<unsigned char>(text[i + 1])) ||
                                   text[i + 1] == '+' || text[i + 1] == '-'))) {
      break;
    }
    ++i;
  }
  if (i == 0) return false;
  std::string num(text.substr(0, i));
  char* end = nullptr;
  *number = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size()) return false;
  *unit = Lower(Trim(text.substr(i)));
  return true;
}

// The multiplier of `unit` (lower case, without the number), in units of `bare_unit` for "".
bool UnitMultiplier(const std::string& unit, double bare_unit, double* mult) {
  if (unit.empty()) {
    *mult = bare_unit;
    return true;
  }
  if (unit == "b") {
    *mult = 1;
    return true;
  }
  static constexpr char kPrefixes[] = "kmgtp";
  const char* p = unit.size() <= 3 ? std::strchr(kPrefixes, unit[0]) : nullptr;
  if (p == nullptr || *p == '\0') return false;
  // "g", "gb" (Slurm's --mem=16GB) and "gib" all mean 2^30.
  const std::string_view rest = std::string_view(unit).substr(1);
  if (!rest.empty() && rest != "b" && rest != "ib") return false;
  *mult = std::ldexp(1.0, 10 * static_cast<int>(p - kPrefixes + 1));
  return true;
}

// 'text', built by appending: "'" + std::string(text) inlines std::string::insert, in which
// GCC 12 at -O3 reports a -Wrestrict overlap that cannot happen (GCC bug 105329).
std::string Quoted(std::string_view text) {
  std::string q;
  q.reserve(text.size() + 2);
  q.push_back('\'');
  q.append(text);
  q.push_back('\'');
  return q;
}

}  // namespace

Result<uint64_t> ParseSize(std::string_view text, uint64_t bare_unit) {
  double number = 0;
  std::string unit;
  double mult = 1;
  if (!SplitNumber(text, &number, &unit) ||
      !UnitMultiplier(unit, static_cast<double>(bare_unit), &mult)) {
    return Status::InvalidArgument(
        Quoted(text) +
        (bare_unit == kMiB
             ? " is not a size: write a number of MiB or a number with a unit, as for Slurm's "
               "--mem: 512 (MiB), 512M, 16G, 2T (K, M, G, T are powers of 1024)"
             : " is not a size: write a number of bytes or a number with a unit: 4096, 110K, "
               "512M, 16G (K, M, G, T are powers of 1024)"));
  }
  const double bytes = std::round(number * mult);
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 18446744073709549568.0) {
    return Status::InvalidArgument(Quoted(text) +
                                   " is out of range: write a size between 0 and 16 EiB");
  }
  return static_cast<uint64_t>(bytes);
}

Result<double> ParseBandwidth(std::string_view text) {
  std::string_view t = Trim(text);
  std::string lower = Lower(t);
  if (lower.size() >= 2 && lower.compare(lower.size() - 2, 2, "/s") == 0) t.remove_suffix(2);
  double number = 0;
  std::string unit;
  double mult = 1;
  if (!SplitNumber(t, &number, &unit) || !UnitMultiplier(unit, static_cast<double>(kMiB), &mult)) {
    return Status::InvalidArgument(Quoted(text) +
                                   " is not a bandwidth: write a rate with a unit, e.g. "
                                   "800M/s or 2G/s (powers of 1024), or a number of MiB/s");
  }
  const double rate = number * mult;
  if (!std::isfinite(rate) || rate <= 0) {
    return Status::InvalidArgument(Quoted(text) +
                                   " is not a positive bandwidth: write e.g. 800M/s");
  }
  return rate;
}

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  } else {
    // Rounding may carry to 1024 ("1023.7 KiB" -> "1024 KiB"): print the next unit instead.
    if (std::fabs(bytes) >= 1023.5 && u < 6) {
      bytes /= 1024.0;
      ++u;
    }
    std::snprintf(buf, sizeof(buf),
                  std::fabs(bytes) >= 99.95   ? "%.0f %s"
                  : std::fabs(bytes) >= 9.995 ? "%.1f %s"
                                              : "%.2f %s",
                  bytes, kUnits[u]);
  }
  return buf;
}

std::string SizeArg(uint64_t bytes) {
  if (bytes == 0) return "0";
  static constexpr char kUnits[] = "KMGTP";
  int u = -1;
  while (u < 4 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  std::string out = std::to_string(bytes);
  out.push_back(u < 0 ? 'B' : kUnits[u]);
  return out;
}

}  // namespace nopfs
