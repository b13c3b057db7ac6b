// The directory's wire encoding and the owner's side (directory_wire.h).
#include "service/peers/directory_wire.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/coding.h"

namespace nopfs::service::dir::wire {
namespace {

constexpr size_t kHeaderBytes = 4;

coding::Writer Header(Round round, size_t reserve) {
  coding::Writer out;
  out.Reserve(kHeaderBytes + coding::kMaxVarint32Bytes + reserve);
  out.U8('N');
  out.U8('D');
  out.U8(kVersion);
  out.U8(static_cast<uint8_t>(round));
  return out;
}

const char* RoundName(Round r) {
  switch (r) {
    case Round::kPublish:
      return "publish";
    case Round::kQuery:
      return "query";
    case Round::kAnswer:
      return "answer";
  }
  return "?";
}

// A strict cursor over a peer's buffer.
class Reader {
 public:
  Reader(std::span<const std::byte> buf, Round round) : in_(buf), round_(round) {}

  Status Header() {
    // Read on a copy, so that an error names byte 0.
    coding::Reader probe = in_;
    std::span<const std::byte> buf;
    if (!probe.Bytes(kHeaderBytes, &buf)) return Error("shorter than its header");
    if (buf[0] != std::byte{'N'} || buf[1] != std::byte{'D'}) return Error("bad magic");
    if (buf[2] != std::byte{kVersion}) {
      return Error("format version " + std::to_string(static_cast<int>(buf[2])) +
                   ", this build reads version " + std::to_string(kVersion));
    }
    if (buf[3] != static_cast<std::byte>(round_)) {
      return Error("round " + std::to_string(static_cast<int>(buf[3])) + " instead of " +
                   std::to_string(static_cast<int>(round_)));
    }
    in_ = probe;
    return Status::Ok();
  }

  // At most 5 bytes and a value below 2^32.
  Status Varint(uint32_t* v) {
    if (!in_.Varint32(v)) return Error(in_.error());
    return Status::Ok();
  }

  // The entry count, checked against what the remaining bytes can hold.
  Status Count(size_t min_entry_bytes, uint32_t* count) {
    NOPFS_RETURN_IF_ERROR(Varint(count));
    if (static_cast<uint64_t>(*count) * min_entry_bytes > remaining()) {
      return Error("count " + std::to_string(*count) + " exceeds the buffer");
    }
    return Status::Ok();
  }

  // The next owned id: q = previous q + delta (first absolute), sample = q * nodes + owner.
  Status NextId(uint32_t owner, uint32_t nodes, bool first, uint64_t* q, uint32_t* sample) {
    uint32_t d = 0;
    NOPFS_RETURN_IF_ERROR(Varint(&d));
    if (!first && d == 0) return Error("ids not strictly ascending");
    const uint64_t next = first ? d : *q + d;
    const uint64_t s = next * nodes + owner;
    if (s > 0xFFFFFFFFull) return Error("sample id above 32 bits");
    *q = next;
    *sample = static_cast<uint32_t>(s);
    return Status::Ok();
  }

  Status End() const {
    if (!in_.done()) return Error("trailing bytes");
    return Status::Ok();
  }

  size_t remaining() const { return in_.remaining(); }

  Status Error(const std::string& what) const {
    return Status::Corruption(std::string("directory ") + RoundName(round_) + " buffer: " + what +
                              " (at byte " + std::to_string(in_.pos()) + " of " +
                              std::to_string(in_.size()) + ")");
  }

 private:
  coding::Reader in_;
  Round round_;
};

void CheckOwned(uint32_t sample, uint32_t owner, uint32_t nodes, bool first, uint32_t prev) {
  if (nodes == 0 || sample % nodes != owner) {
    throw std::invalid_argument("directory: sample not owned by the destination");
  }
  if (!first && sample <= prev) {
    throw std::invalid_argument("directory: ids not strictly ascending");
  }
}

}  // namespace

std::vector<std::byte> EncodePublish(std::span<const Holding> held, uint32_t owner,
                                     uint32_t nodes) {
  auto out = Header(Round::kPublish, held.size() * 5);
  out.Varint(held.size());
  uint32_t prev_q = 0;
  for (size_t i = 0; i < held.size(); ++i) {
    const Holding& h = held[i];
    CheckOwned(h.sample, owner, nodes, i == 0, i == 0 ? 0 : held[i - 1].sample);
    const uint32_t q = h.sample / nodes;
    out.Varint(i == 0 ? q : q - prev_q);
    out.Varint(h.cls);
    out.Varint(h.position);
    prev_q = q;
  }
  return out.Take();
}

Status DecodePublish(std::span<const std::byte> buf, uint32_t owner, uint32_t nodes,
                     std::vector<Holding>* out) {
  Reader r(buf, Round::kPublish);
  NOPFS_RETURN_IF_ERROR(r.Header());
  uint32_t count = 0;
  NOPFS_RETURN_IF_ERROR(r.Count(3, &count));
  out->reserve(out->size() + count);
  uint64_t q = 0;
  for (uint32_t i = 0; i < count; ++i) {
    Holding h;
    uint32_t cls = 0;
    NOPFS_RETURN_IF_ERROR(r.NextId(owner, nodes, i == 0, &q, &h.sample));
    NOPFS_RETURN_IF_ERROR(r.Varint(&cls));
    if (cls > 0xFFFF) return r.Error("class above 65535");
    h.cls = static_cast<uint16_t>(cls);
    NOPFS_RETURN_IF_ERROR(r.Varint(&h.position));
    out->push_back(h);
  }
  return r.End();
}

std::vector<std::byte> EncodeQuery(std::span<const uint32_t> ids, uint32_t owner, uint32_t nodes) {
  auto out = Header(Round::kQuery, ids.size() * 2);
  out.Varint(ids.size());
  uint32_t prev_q = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    CheckOwned(ids[i], owner, nodes, i == 0, i == 0 ? 0 : ids[i - 1]);
    const uint32_t q = ids[i] / nodes;
    out.Varint(i == 0 ? q : q - prev_q);
    prev_q = q;
  }
  return out.Take();
}

Status DecodeQuery(std::span<const std::byte> buf, uint32_t owner, uint32_t nodes,
                   std::vector<uint32_t>* out) {
  Reader r(buf, Round::kQuery);
  NOPFS_RETURN_IF_ERROR(r.Header());
  uint32_t count = 0;
  NOPFS_RETURN_IF_ERROR(r.Count(1, &count));
  out->reserve(out->size() + count);
  uint64_t q = 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t s = 0;
    NOPFS_RETURN_IF_ERROR(r.NextId(owner, nodes, i == 0, &q, &s));
    out->push_back(s);
  }
  return r.End();
}

std::vector<std::byte> EncodeAnswer(std::span<const Location> answers,
                                    std::span<const Location> copies, uint32_t owner,
                                    uint32_t nodes) {
  auto out = Header(Round::kAnswer, answers.size() * 4 + copies.size() * 5 + 5);
  out.Varint(answers.size());
  for (const Location& a : answers) {
    if (a.node == kNoHolder) {
      out.Varint(0);
      continue;
    }
    out.Varint(static_cast<uint64_t>(a.node) + 1);
    out.Varint(a.cls);
    out.Varint(a.position);
  }
  out.Varint(copies.size());
  uint32_t prev_q = 0;
  for (size_t i = 0; i < copies.size(); ++i) {
    const Location& c = copies[i];
    CheckOwned(c.sample, owner, nodes, i == 0, i == 0 ? 0 : copies[i - 1].sample);
    const uint32_t q = c.sample / nodes;
    out.Varint(i == 0 ? q : q - prev_q);
    out.Varint(static_cast<uint64_t>(c.node) + 1);
    out.Varint(c.cls);
    out.Varint(c.position);
    prev_q = q;
  }
  return out.Take();
}

Status DecodeAnswer(std::span<const std::byte> buf, std::span<const uint32_t> queried,
                    uint32_t self, uint32_t owner, uint32_t nodes, std::vector<Location>* out,
                    std::vector<Location>* copies) {
  Reader r(buf, Round::kAnswer);
  NOPFS_RETURN_IF_ERROR(r.Header());
  uint32_t count = 0;
  NOPFS_RETURN_IF_ERROR(r.Count(1, &count));
  if (count != queried.size()) {
    return r.Error(std::to_string(count) + " answers to " + std::to_string(queried.size()) +
                   " queries");
  }
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t holder = 0;
    NOPFS_RETURN_IF_ERROR(r.Varint(&holder));
    if (holder == 0) continue;
    const uint64_t node = static_cast<uint64_t>(holder) - 1;
    if (node >= nodes) return r.Error("holder " + std::to_string(node) + " outside the job");
    if (node == self) return r.Error("the requester named as holder");
    Location loc;
    loc.sample = queried[i];
    loc.node = static_cast<uint32_t>(node);
    uint32_t cls = 0;
    NOPFS_RETURN_IF_ERROR(r.Varint(&cls));
    if (cls > 0xFFFF) return r.Error("class above 65535");
    loc.cls = static_cast<uint16_t>(cls);
    NOPFS_RETURN_IF_ERROR(r.Varint(&loc.position));
    out->push_back(loc);
  }
  NOPFS_RETURN_IF_ERROR(r.Count(4, &count));
  copies->reserve(copies->size() + count);
  uint64_t q = 0;
  for (uint32_t i = 0; i < count; ++i) {
    Location c;
    NOPFS_RETURN_IF_ERROR(r.NextId(owner, nodes, i == 0, &q, &c.sample));
    uint32_t filler = 0;
    NOPFS_RETURN_IF_ERROR(r.Varint(&filler));
    if (filler == 0 || filler - 1 >= nodes) return r.Error("filler outside the job");
    if (filler - 1 == self) return r.Error("the requester named as filler");
    c.node = filler - 1;
    uint32_t cls = 0;
    NOPFS_RETURN_IF_ERROR(r.Varint(&cls));
    if (cls > 0xFFFF) return r.Error("class above 65535");
    c.cls = static_cast<uint16_t>(cls);
    NOPFS_RETURN_IF_ERROR(r.Varint(&c.position));
    copies->push_back(c);
  }
  return r.End();
}

size_t ChooseHolder(uint64_t rank, uint32_t sample, uint32_t nodes, size_t holders) {
  return static_cast<size_t>((rank + sample / nodes) % holders);
}

Status OwnerTable::AddPublished(uint32_t from, std::span<const std::byte> buf) {
  scratch_.clear();
  NOPFS_RETURN_IF_ERROR(DecodePublish(buf, owner_, nodes_, &scratch_));
  entries_.reserve(entries_.size() + scratch_.size());
  for (const Holding& h : scratch_)
    entries_.push_back({h.sample, from, h.position, h.cls});
  return Status::Ok();
}

void OwnerTable::Seal() {
  std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    return a.sample != b.sample ? a.sample < b.sample : a.node < b.node;
  });
  entries_.shrink_to_fit();
  served_.assign(entries_.size(), 0);
  scratch_ = {};
  // Fillers: in each sample's run of holders, the first to reach it in its fill order.
  copies_.clear();
  for (size_t b = 0; b < entries_.size();) {
    size_t e = b + 1;
    while (e < entries_.size() && entries_[e].sample == entries_[b].sample)
      ++e;
    if (e - b > 1) {
      size_t filler = b;
      for (size_t i = b + 1; i < e; ++i) {
        if (entries_[i].position < entries_[filler].position) filler = i;  // ties: lower node
      }
      for (size_t i = b; i < e; ++i) {
        if (i != filler) {
          copies_.push_back({entries_[i].node, entries_[i].sample, static_cast<uint32_t>(filler)});
        }
      }
    }
    b = e;
  }
  std::sort(copies_.begin(), copies_.end(), [](const Copy& a, const Copy& b) {
    return a.node != b.node ? a.node < b.node : a.sample < b.sample;
  });
  copies_.shrink_to_fit();
  copies_cursor_ = 0;
}

Result<std::vector<std::byte>> OwnerTable::Answer(uint32_t requester,
                                                  std::span<const std::byte> query) {
  if (static_cast<int64_t>(requester) <= last_requester_ || served_.size() != entries_.size()) {
    throw std::invalid_argument("directory: OwnerTable::Answer out of order or before Seal");
  }
  last_requester_ = requester;
  std::vector<uint32_t> ids;
  NOPFS_RETURN_IF_ERROR(DecodeQuery(query, owner_, nodes_, &ids));
  std::vector<Location> answers(ids.size());
  std::vector<const Entry*> holders;
  auto it = entries_.begin();
  for (size_t i = 0; i < ids.size(); ++i) {
    // Queries ascend, so the search resumes where the last one ended.
    it = std::lower_bound(it, entries_.end(), ids[i],
                          [](const Entry& e, uint32_t s) { return e.sample < s; });
    const auto group = static_cast<size_t>(it - entries_.begin());
    holders.clear();
    for (; it != entries_.end() && it->sample == ids[i]; ++it) {
      if (it->node != requester) holders.push_back(&*it);
    }
    Location& a = answers[i];
    a.sample = ids[i];
    if (holders.empty()) {
      a.node = kNoHolder;
      continue;
    }
    const Entry* e = holders[ChooseHolder(served_[group]++, ids[i], nodes_, holders.size())];
    a.node = e->node;
    a.cls = e->cls;
    a.position = e->position;
  }
  // The requester's copies: copies_ is by node, and requesters come in ascending order.
  while (copies_cursor_ < copies_.size() && copies_[copies_cursor_].node < requester)
    ++copies_cursor_;
  std::vector<Location> copies;
  for (; copies_cursor_ < copies_.size() && copies_[copies_cursor_].node == requester;
       ++copies_cursor_) {
    const Entry& f = entries_[copies_[copies_cursor_].filler];
    copies.push_back({f.sample, f.node, f.cls, f.position});
  }
  return EncodeAnswer(answers, copies, owner_, nodes_);
}

}  // namespace nopfs::service::dir::wire
