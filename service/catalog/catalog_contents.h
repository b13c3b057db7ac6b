// The catalog's in-memory form (store::Contents) and its fingerprint: what a load, a scan or the
// shared scan fills before the Catalog takes it. Apart from catalog_store.h so that code that only
// builds or exchanges contents (the shared scan's messages, their fuzz target) links without
// RocksDB.
//
// Thread safety: a Contents is owned by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nopfs::service::store {

// The catalog's in-memory form, filled by a load or a scan and then moved into the Catalog.
struct Contents {
  std::string root;
  std::vector<std::string> classes;
  std::string arena;  // relative paths back to back
  std::vector<uint64_t> path_end;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> lengths;
  std::vector<int64_t> labels;

  void Reserve(uint64_t n);
  void Add(std::string_view rel, uint64_t offset, uint64_t length, int64_t label);
};

// xxh3 over the root, the class names and every sample entry.
uint64_t ComputeFingerprint(const Contents& c);

}  // namespace nopfs::service::store
