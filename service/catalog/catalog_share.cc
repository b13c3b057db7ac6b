// One dataset scan per job (see catalog_share.h and docs/catalog.md, "One scan per job").
#include "service/catalog/catalog_share.h"

#include <algorithm>
#include <utility>

#include "common/coding.h"

namespace nopfs::service::share {
namespace {

using coding::Reader;
using coding::Writer;

void PutStamp(Writer& w, const codec::Stamp& s) {
  w.U64(static_cast<uint64_t>(s.mtime_ns));
  w.U64(s.inode);
  w.U64(s.device);
  w.U64(s.size);
}

bool GetStamp(Reader& r, codec::Stamp* s) {
  uint64_t mtime = 0;
  if (!r.U64(&mtime) || !r.U64(&s->inode) || !r.U64(&s->device) || !r.U64(&s->size)) return false;
  s->mtime_ns = static_cast<int64_t>(mtime);
  return true;
}

void PutSample(Writer& w, std::string_view rel, uint64_t offset, uint64_t length, int64_t label) {
  w.Str(rel);
  w.Varint(offset);
  w.Varint(length);
  w.Varint(static_cast<uint64_t>(label));
}

bool GetSample(Reader& r, scan::Sample* s) {
  uint64_t label = 0;
  if (!r.Str(&s->relative_path) || !r.Varint64(&s->offset) || !r.Varint64(&s->length) ||
      !r.Varint64(&label)) {
    return false;
  }
  s->label = static_cast<int64_t>(label);
  return true;
}

void PutSamples(Writer& w, const std::vector<scan::Sample>& samples) {
  w.Varint(samples.size());
  for (const scan::Sample& s : samples)
    PutSample(w, s.relative_path, s.offset, s.length, s.label);
}

void PutStamps(Writer& w, const std::vector<scan::StampEntry>& stamps) {
  w.Varint(stamps.size());
  for (const scan::StampEntry& s : stamps) {
    w.Str(s.path);
    PutStamp(w, s.stamp);
  }
}

void PutStrings(Writer& w, const std::vector<std::string>& v) {
  w.Varint(v.size());
  for (const std::string& s : v)
    w.Str(s);
}

// A count read from the input, bounded by what the remaining bytes can hold (each item takes at
// least `min_item` bytes), so a forged count cannot make us reserve memory.
bool GetCount(Reader& r, size_t min_item, uint64_t* n) {
  if (!r.Varint64(n)) return false;
  return *n <= r.remaining() / std::max<size_t>(1, min_item);
}

bool GetSamples(Reader& r, std::vector<scan::Sample>* out) {
  uint64_t n = 0;
  if (!GetCount(r, 7, &n)) return false;
  out->resize(n);
  for (scan::Sample& s : *out) {
    if (!GetSample(r, &s)) return false;
  }
  return true;
}

bool GetStamps(Reader& r, std::vector<scan::StampEntry>* out) {
  uint64_t n = 0;
  if (!GetCount(r, 36, &n)) return false;
  out->resize(n);
  for (scan::StampEntry& s : *out) {
    if (!r.Str(&s.path) || !GetStamp(r, &s.stamp)) return false;
  }
  return true;
}

bool GetStrings(Reader& r, std::vector<std::string>* out) {
  uint64_t n = 0;
  if (!GetCount(r, 4, &n)) return false;
  out->resize(n);
  for (std::string& s : *out) {
    if (!r.Str(&s)) return false;
  }
  return true;
}

Status Malformed(const char* what, const Reader& r) {
  return Status::InvalidArgument(std::string("catalog share: malformed ") + what + " (" +
                                 (r.ok() ? "trailing bytes or bad count" : r.error()) + ")");
}

}  // namespace

Result<std::vector<std::vector<std::byte>>> AllGather(const Exchange& exchange, uint32_t nodes,
                                                      uint64_t* round, std::vector<std::byte> mine,
                                                      size_t chunk_bytes) {
  // Round 0 carries each node's chunk count and first chunk; the rest follow, as many rounds as
  // the largest message needs, so that every node runs the same rounds.
  const uint64_t chunks = std::max<uint64_t>(1, (mine.size() + chunk_bytes - 1) / chunk_bytes);
  auto chunk = [&](uint64_t c) {
    const size_t begin = std::min(mine.size(), static_cast<size_t>(c * chunk_bytes));
    const size_t end = std::min(mine.size(), begin + chunk_bytes);
    return std::vector<std::byte>(mine.begin() + static_cast<std::ptrdiff_t>(begin),
                                  mine.begin() + static_cast<std::ptrdiff_t>(end));
  };
  std::vector<std::byte> first;
  {
    Writer w;
    w.U64(chunks);
    w.Bytes(std::span<const std::byte>(chunk(0)));
    first = w.Take();
  }
  std::vector<std::vector<std::byte>> out(nodes, first);
  Result<std::vector<std::vector<std::byte>>> in = exchange((*round)++, std::move(out));
  if (!in.ok()) return in.status();
  if (in->size() != nodes) return Status::Internal("catalog share: exchange returned wrong size");
  std::vector<uint64_t> counts(nodes);
  std::vector<std::vector<std::byte>> got(nodes);
  uint64_t most = 0;
  for (uint32_t k = 0; k < nodes; ++k) {
    const std::vector<std::byte>& b = (*in)[k];
    if (b.size() < 8) return Status::InvalidArgument("catalog share: short buffer from a node");
    counts[k] = coding::LoadLe64(b, 0);
    if (counts[k] == 0 || counts[k] > (uint64_t{1} << 20)) {
      return Status::InvalidArgument("catalog share: bad chunk count from node " +
                                     std::to_string(k));
    }
    got[k].assign(b.begin() + 8, b.end());
    most = std::max(most, counts[k]);
  }
  for (uint64_t c = 1; c < most; ++c) {
    std::vector<std::vector<std::byte>> more(nodes,
                                             c < chunks ? chunk(c) : std::vector<std::byte>());
    in = exchange((*round)++, std::move(more));
    if (!in.ok()) return in.status();
    if (in->size() != nodes) return Status::Internal("catalog share: exchange returned wrong size");
    for (uint32_t k = 0; k < nodes; ++k) {
      if (c < counts[k]) got[k].insert(got[k].end(), (*in)[k].begin(), (*in)[k].end());
    }
  }
  return got;
}

std::vector<std::byte> EncodeLead(const Lead& lead) {
  Writer w;
  w.U8(kShareVersion);
  w.U8(static_cast<uint8_t>(lead.kind));
  w.Str(lead.reason);
  switch (lead.kind) {
    case LeadKind::kHit: {
      const store::Contents& c = lead.contents;
      w.Str(c.root);
      PutStrings(w, c.classes);
      w.Varint(c.lengths.size());
      uint64_t begin = 0;
      for (size_t i = 0; i < c.lengths.size(); ++i) {
        PutSample(w, std::string_view(c.arena).substr(begin, c.path_end[i] - begin), c.offsets[i],
                  c.lengths[i], c.labels[i]);
        begin = c.path_end[i];
      }
      break;
    }
    case LeadKind::kMiss:
      PutStamp(w, lead.listing.root_stamp);
      PutStrings(w, lead.listing.class_names);
      break;
    case LeadKind::kScanned:
      w.U8(static_cast<uint8_t>(lead.scanned.kind));
      w.Str(lead.scanned.root);
      PutStrings(w, lead.scanned.class_names);
      PutSamples(w, lead.scanned.samples);
      PutStamps(w, lead.scanned.stamps);
      break;
  }
  return w.Take();
}

Result<Lead> DecodeLead(std::span<const std::byte> in) {
  Reader r(in);
  uint8_t version = 0;
  uint8_t kind = 0;
  Lead lead;
  if (!r.U8(&version) || !r.U8(&kind) || !r.Str(&lead.reason)) return Malformed("lead", r);
  if (version != kShareVersion) {
    return Status::InvalidArgument(
        "catalog share: version " + std::to_string(version) + " from node 0, this nopfsd speaks " +
        std::to_string(kShareVersion) + "; run the same nopfs on every node");
  }
  switch (kind) {
    case static_cast<uint8_t>(LeadKind::kHit): {
      lead.kind = LeadKind::kHit;
      uint64_t n = 0;
      if (!r.Str(&lead.contents.root) || !GetStrings(r, &lead.contents.classes) ||
          !GetCount(r, 7, &n)) {
        return Malformed("cached catalog", r);
      }
      lead.contents.Reserve(n);
      scan::Sample s;
      for (uint64_t i = 0; i < n; ++i) {
        if (!GetSample(r, &s)) return Malformed("cached catalog", r);
        lead.contents.Add(s.relative_path, s.offset, s.length, s.label);
      }
      break;
    }
    case static_cast<uint8_t>(LeadKind::kMiss):
      lead.kind = LeadKind::kMiss;
      if (!GetStamp(r, &lead.listing.root_stamp) || !GetStrings(r, &lead.listing.class_names)) {
        return Malformed("root listing", r);
      }
      break;
    case static_cast<uint8_t>(LeadKind::kScanned): {
      lead.kind = LeadKind::kScanned;
      uint8_t k = 0;
      if (!r.U8(&k) || (k != 1 && k != 2) || !r.Str(&lead.scanned.root) ||
          !GetStrings(r, &lead.scanned.class_names) || !GetSamples(r, &lead.scanned.samples) ||
          !GetStamps(r, &lead.scanned.stamps)) {
        return Malformed("scan", r);
      }
      lead.scanned.kind = static_cast<codec::DatasetKind>(k);
      break;
    }
    default:
      return Status::InvalidArgument("catalog share: unknown lead kind " + std::to_string(kind));
  }
  if (!r.done()) return Malformed("lead", r);
  return lead;
}

std::vector<std::byte> EncodePart(const scan::ClassesPart& part) {
  Writer w;
  w.U8(kShareVersion);
  PutSamples(w, part.samples);
  PutStamps(w, part.stamps);
  return w.Take();
}

Result<scan::ClassesPart> DecodePart(std::span<const std::byte> in) {
  Reader r(in);
  uint8_t version = 0;
  scan::ClassesPart part;
  if (!r.U8(&version) || version != kShareVersion || !GetSamples(r, &part.samples) ||
      !GetStamps(r, &part.stamps) || !r.done()) {
    return Malformed("scan part", r);
  }
  return part;
}

std::vector<uint32_t> ClassesOf(uint32_t node, uint32_t nodes, size_t classes) {
  std::vector<uint32_t> mine;
  for (size_t c = node; c < classes; c += nodes)
    mine.push_back(static_cast<uint32_t>(c));
  return mine;
}

}  // namespace nopfs::service::share
