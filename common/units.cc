#include "common/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

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

bool UnitMultiplier(const std::string& unit, double* mult) {
  struct U {
    const char* name;
    double mult;
  };
  static constexpr U kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1e3},
      {"kb", 1e3},
      {"m", 1e6},
      {"mb", 1e6},
      {"g", 1e9},
      {"gb", 1e9},
      {"t", 1e12},
      {"tb", 1e12},
      {"p", 1e15},
      {"pb", 1e15},
      {"kib", 1024.0},
      {"mib", 1048576.0},
      {"gib", 1073741824.0},
      {"tib", 1099511627776.0},
      {"pib", 1125899906842624.0},
  };
  for (const U& u : kUnits) {
    if (unit == u.name) {
      *mult = u.mult;
      return true;
    }
  }
  return false;
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

Result<uint64_t> ParseSize(std::string_view text) {
  double number = 0;
  std::string unit;
  double mult = 1;
  if (!SplitNumber(text, &number, &unit) || !UnitMultiplier(unit, &mult)) {
    return Status::InvalidArgument(Quoted(text) +
                                   " is not a size: write a number of bytes with an optional "
                                   "unit, e.g. 4096, 110KB, 512MiB or 8GiB");
  }
  const double bytes = std::round(number * mult);
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 18446744073709549568.0) {
    return Status::InvalidArgument(Quoted(text) +
                                   " is out of range: write a size between 0 and 16 EiB");
  }
  return static_cast<uint64_t>(bytes);
}

Result<double> ParseBandwidth(std::string_view text, double bare_unit) {
  std::string_view t = Trim(text);
  std::string lower = Lower(t);
  bool per_second = false;
  if (lower.size() >= 2 && lower.compare(lower.size() - 2, 2, "/s") == 0) {
    per_second = true;
    t.remove_suffix(2);
  }
  double number = 0;
  std::string unit;
  double mult = 1;
  if (!SplitNumber(t, &number, &unit) || !UnitMultiplier(unit, &mult)) {
    return Status::InvalidArgument(Quoted(text) +
                                   " is not a bandwidth: write a rate with a unit, e.g. "
                                   "800MB/s, 1.2GB/s or 10GiB/s");
  }
  if (unit.empty() && !per_second) mult = bare_unit;
  const double rate = number * mult;
  if (!std::isfinite(rate) || rate <= 0) {
    return Status::InvalidArgument(Quoted(text) +
                                   " is not a positive bandwidth: write e.g. 800MB/s");
  }
  return rate;
}

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  while (std::fabs(bytes) >= 1000.0 && u < 6) {
    bytes /= 1000.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  } else {
    std::snprintf(buf, sizeof(buf),
                  bytes >= 100  ? "%.0f %s"
                  : bytes >= 10 ? "%.1f %s"
                                : "%.2f %s",
                  bytes, kUnits[u]);
  }
  return buf;
}

}  // namespace nopfs
