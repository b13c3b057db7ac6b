// Byte sizes and bandwidths as Slurm writes them (sbatch --mem): "16G", "512M", "250", "1.5T".
//
// One rule everywhere in nopfs (options, node config, policy, CLI, nopfsd):
//   - a bare number is MiB (2^20 bytes), as in --mem=250;
//   - the units K, M, G, T, P (case-insensitive) are powers of 1024, as in --mem=16G;
//   - "KB", "MB", "GB", "TB", "PB" mean the same as K, M, G, T, P (Slurm reads --mem=16GB as
//     16G), and so do "KiB", "MiB", "GiB", "TiB", "PiB"; there is no decimal (10^n) unit;
//   - "B" is bytes ("4096B");
//   - fractions are allowed ("1.5G"), rounded to the nearest byte; a space before the unit too.
// Printed sizes use the same binary units with the IEC spelling, three significant digits
// ("1.50 GiB", "110 KiB", "512 B"), which these parsers read back.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace nopfs {

inline constexpr uint64_t kKiB = uint64_t{1} << 10;
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// Parses a size; a bare number counts `bare_unit` bytes (MiB, as --mem; 1 where the text is a
// count of bytes, such as a sizes file). The error message quotes the input and says what to
// write instead.
Result<uint64_t> ParseSize(std::string_view text, uint64_t bare_unit = kMiB);

// Parses a bandwidth ("2G/s", "800M/s", "1.5GB/s", "250"): the units of ParseSize per second
// (powers of 1024); the "/s" may be omitted; a bare number is MiB/s. Returns bytes per second.
Result<double> ParseBandwidth(std::string_view text);

// "1.50 GiB", "110 KiB", "512 B": binary units with three significant digits, for people.
std::string FormatBytes(double bytes);

// The exact size in the largest unit that divides it, as an option value that ParseSize reads
// back: "16G", "1536M", "1300K", "1000B", "0".
std::string SizeArg(uint64_t bytes);

}  // namespace nopfs
