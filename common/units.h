// Byte sizes and bandwidths as people write them: "110KB", "8 GiB", "1.5GB/s", "800 MB/s".
//
// Units are case-insensitive. SI (k/KB = 1000, MB, GB, TB, PB) and IEC (KiB = 1024, MiB, GiB, TiB,
// PiB); a bare number is bytes (bytes/s for bandwidths, unless a caller says otherwise). Fractions
// are allowed ("1.5GB"); the result is rounded to the nearest byte.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace nopfs {

// Parses a size; the error message quotes the input and says what to write instead.
Result<uint64_t> ParseSize(std::string_view text);

// Parses a bandwidth ("1.2GB/s", "800MB/s", "10 GiB/s"); returns bytes per second. The "/s" may be
// omitted. A bare number is taken as `bare_unit` bytes per second (e.g. 1e6 for MB/s).
Result<double> ParseBandwidth(std::string_view text, double bare_unit = 1.0);

// "1.50 GB", "110 KB", "512 B": SI units with three significant digits, for people.
std::string FormatBytes(double bytes);

}  // namespace nopfs
