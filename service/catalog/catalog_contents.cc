#include "service/catalog/catalog_contents.h"

#include <xxhash.h>

#include <new>

namespace nopfs::service::store {

void Contents::Reserve(uint64_t n) {
  path_end.reserve(n);
  offsets.reserve(n);
  lengths.reserve(n);
  labels.reserve(n);
}

void Contents::Add(std::string_view rel, uint64_t offset, uint64_t length, int64_t label) {
  arena.append(rel);
  path_end.push_back(arena.size());
  offsets.push_back(offset);
  lengths.push_back(length);
  labels.push_back(label);
}

uint64_t ComputeFingerprint(const Contents& c) {
  XXH3_state_t* st = XXH3_createState();
  if (st == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(st);
  auto put = [st](uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i)
      b[i] = static_cast<unsigned char>(v >> (8 * i));
    XXH3_64bits_update(st, b, 8);
  };
  auto put_str = [&](std::string_view s) {
    put(s.size());
    XXH3_64bits_update(st, s.data(), s.size());
  };
  put_str(c.root);
  put(c.classes.size());
  for (const auto& name : c.classes)
    put_str(name);
  put(c.lengths.size());
  uint64_t begin = 0;
  for (size_t i = 0; i < c.lengths.size(); ++i) {
    put_str(std::string_view(c.arena).substr(begin, c.path_end[i] - begin));
    begin = c.path_end[i];
    put(c.offsets[i]);
    put(c.lengths[i]);
    put(static_cast<uint64_t>(c.labels[i]));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace nopfs::service::store
