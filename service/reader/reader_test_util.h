// Helpers shared by the reader's tests: a small dataset of one class whose sample k is file k,
// with deterministic bytes, and its catalog.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "common/status.h"
#include "service/catalog/catalog.h"
#include "service/env/env.h"

namespace nopfs::service::testing {

inline constexpr uint32_t kFiles = 24;

// The bytes of sample k: sizes from 1 to 9,000 bytes, content depending on k.
inline std::string Bytes(uint32_t k) {
  std::string s(1 + (k * 7919) % 9000, '\0');
  for (size_t i = 0; i < s.size(); ++i)
    s[i] = static_cast<char>((k * 131 + i * 17) & 0xff);
  return s;
}

// Writes kFiles files <dir>/data/c/img000.bin ... (names sort in k order, so sample id k is file
// k) and opens their catalog with work directory <dir>/work.
inline Result<std::unique_ptr<Catalog>> MakeDatasetAndCatalog(const std::string& dir) {
  const std::string data = dir + "/data";
  std::filesystem::create_directories(data + "/c");
  for (uint32_t k = 0; k < kFiles; ++k) {
    char name[32];
    std::snprintf(name, sizeof name, "/c/img%03u.bin", k);
    std::ofstream(data + name, std::ios::binary) << Bytes(k);
  }
  CatalogOptions o;
  o.dataset = data;
  o.work_dir = dir + "/work";
  o.scan_threads = 2;
  return Catalog::Open(o, Env::Default());
}

}  // namespace nopfs::service::testing
