// BuildDirectory and PeerDirectory (directory.h): three all-to-all rounds over the wire encoding of
// directory_wire.h.
#include "service/peers/directory.h"

#include <algorithm>
#include <string>

#include "service/peers/directory_wire.h"

namespace nopfs::service::dir {
namespace {

using Buffers = std::vector<std::vector<std::byte>>;

uint64_t BuffersBytes(const Buffers& b) {
  uint64_t n = b.capacity() * sizeof(std::vector<std::byte>);
  for (const auto& v : b)
    n += v.capacity();
  return n;
}

// Runs one round: checks the shape of the answer and counts the bytes that crossed the network.
Result<Buffers> RunRound(const Exchange& exchange, Buffers out, uint32_t node, uint32_t nodes,
                         const char* round, DirectoryStats* stats) {
  for (uint32_t k = 0; k < nodes; ++k) {
    if (k != node) stats->bytes_sent += out[k].size();
  }
  auto in = exchange(std::move(out));
  if (!in.ok()) {
    return in.status().WithContext(std::string("directory: ") + round + " round");
  }
  if (in->size() != nodes) {
    return Status::Corruption(std::string("directory: ") + round +
                              " round: the exchange returned " + std::to_string(in->size()) +
                              " buffers for " + std::to_string(nodes) + " nodes");
  }
  for (uint32_t k = 0; k < nodes; ++k) {
    if (k != node) stats->bytes_received += (*in)[k].size();
  }
  return in;
}

// `sorted` (ids ascending) split by owner: parts[o] holds, still ascending, the elements with
// id % nodes == o. Each part is reserved to its exact size (one counting pass first).
template <typename T, typename Id>
std::vector<std::vector<T>> SplitByOwner(std::span<const T> sorted, uint32_t nodes, Id id) {
  std::vector<size_t> counts(nodes, 0);
  for (const T& x : sorted) {
    ++counts[id(x) % nodes];
  }
  std::vector<std::vector<T>> parts(nodes);
  for (uint32_t o = 0; o < nodes; ++o) {
    parts[o].reserve(counts[o]);
  }
  for (const T& x : sorted) {
    parts[id(x) % nodes].push_back(x);
  }
  return parts;
}

}  // namespace

namespace {
std::optional<Location> FindIn(const std::vector<Location>& sorted, uint32_t sample) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), sample,
                             [](const Location& l, uint32_t s) { return l.sample < s; });
  if (it == sorted.end() || it->sample != sample) return std::nullopt;
  return *it;
}
}  // namespace

std::optional<Location> PeerDirectory::Find(uint32_t sample) const {
  return FindIn(entries_, sample);
}

std::optional<Location> PeerDirectory::FindCopy(uint32_t sample) const {
  return FindIn(copies_, sample);
}

uint64_t PeerDirectory::memory_bytes() const {
  return (entries_.capacity() + copies_.capacity()) * sizeof(Location);
}

Result<PeerDirectory> BuildDirectory(uint32_t node, uint32_t nodes, std::span<const Holding> held,
                                     std::span<const uint32_t> needs, const Exchange& exchange,
                                     DirectoryStats* stats) {
  DirectoryStats local_stats;
  DirectoryStats& st = stats != nullptr ? *stats : local_stats;
  st = DirectoryStats{};
  if (nodes == 0) return Status::InvalidArgument("directory: a job has at least one node");
  if (node >= nodes) {
    return Status::InvalidArgument("directory: node " + std::to_string(node) + " of a job of " +
                                   std::to_string(nodes) + " nodes");
  }
  if (!exchange) return Status::InvalidArgument("directory: no exchange given");
  uint64_t held_ids_bytes = 0;  // alive through every round
  auto note = [&](uint64_t bytes) {
    st.peak_bytes = std::max(st.peak_bytes, bytes + held_ids_bytes);
  };

  // Round 1: publish our holdings to their owners.
  std::vector<Holding> mine(held.begin(), held.end());
  std::sort(mine.begin(), mine.end(),
            [](const Holding& a, const Holding& b) { return a.sample < b.sample; });
  for (size_t i = 1; i < mine.size(); ++i) {
    if (mine[i].sample == mine[i - 1].sample) {
      return Status::InvalidArgument("directory: sample " + std::to_string(mine[i].sample) +
                                     " is held twice");
    }
  }
  // What we hold, to check the copies part of the answers against.
  std::vector<uint32_t> held_ids(mine.size());
  for (size_t i = 0; i < mine.size(); ++i)
    held_ids[i] = mine[i].sample;
  held_ids_bytes = held_ids.capacity() * sizeof(uint32_t);
  Buffers out(nodes);
  {
    auto parts = SplitByOwner<Holding>(mine, nodes, [](const Holding& h) { return h.sample; });
    mine = {};
    for (uint32_t o = 0; o < nodes; ++o) {
      out[o] = wire::EncodePublish(parts[o], o, nodes);
      parts[o] = {};
    }
  }
  // While encoding: the sorted copy, its split and the buffers were alive together.
  note(2 * held.size() * sizeof(Holding) + BuffersBytes(out));
  auto published = RunRound(exchange, std::move(out), node, nodes, "publish", &st);
  if (!published.ok()) return published.status();
  note(BuffersBytes(*published));
  wire::OwnerTable table(node, nodes);
  for (uint32_t k = 0; k < nodes; ++k) {
    auto s = table.AddPublished(k, (*published)[k]);
    if (!s.ok()) return s.WithContext("directory: from node " + std::to_string(k));
    (*published)[k] = {};
  }
  published = Buffers{};
  table.Seal();
  st.owned_entries = table.entries();
  const uint64_t table_bytes = table.memory_bytes();

  // Round 2: ask each owner for the samples we need, each once.
  std::vector<uint32_t> want(needs.begin(), needs.end());
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  auto queries = SplitByOwner<uint32_t>(want, nodes, [](uint32_t s) { return s; });
  want = {};
  uint64_t query_bytes = nodes * sizeof(std::vector<uint32_t>);
  for (const auto& q : queries)
    query_bytes += q.capacity() * sizeof(uint32_t);
  out = Buffers(nodes);
  for (uint32_t o = 0; o < nodes; ++o)
    out[o] = wire::EncodeQuery(queries[o], o, nodes);
  note(table_bytes + query_bytes + BuffersBytes(out));
  auto asked = RunRound(exchange, std::move(out), node, nodes, "query", &st);
  if (!asked.ok()) return asked.status();
  note(table_bytes + query_bytes + BuffersBytes(*asked));

  // Round 3: answer every node's queries from our table, then read the answers to ours.
  const uint64_t asked_bytes = BuffersBytes(*asked);
  out = Buffers(nodes);
  for (uint32_t k = 0; k < nodes; ++k) {
    auto answer = table.Answer(k, (*asked)[k]);
    if (!answer.ok())
      return answer.status().WithContext("directory: from node " + std::to_string(k));
    out[k] = std::move(answer).value();
    (*asked)[k] = {};
  }
  note(table_bytes + query_bytes + asked_bytes + BuffersBytes(out));
  asked = Buffers{};
  table = wire::OwnerTable(node, nodes);
  auto answered = RunRound(exchange, std::move(out), node, nodes, "answer", &st);
  if (!answered.ok()) return answered.status();
  note(query_bytes + BuffersBytes(*answered));

  PeerDirectory dir;
  size_t found_max = 0;
  for (const auto& q : queries)
    found_max += q.size();
  dir.entries_.reserve(found_max);
  note(query_bytes + BuffersBytes(*answered) + found_max * sizeof(Location));
  for (uint32_t o = 0; o < nodes; ++o) {
    const size_t first_copy = dir.copies_.size();
    auto s =
        wire::DecodeAnswer((*answered)[o], queries[o], node, o, nodes, &dir.entries_, &dir.copies_);
    if (!s.ok()) return s.WithContext("directory: from node " + std::to_string(o));
    for (size_t i = first_copy; i < dir.copies_.size(); ++i) {
      if (!std::binary_search(held_ids.begin(), held_ids.end(), dir.copies_[i].sample)) {
        return Status::Corruption("directory: from node " + std::to_string(o) +
                                  ": a filler for sample " + std::to_string(dir.copies_[i].sample) +
                                  ", which this node does not hold");
      }
    }
    (*answered)[o] = {};
    queries[o] = {};
  }
  const auto by_sample = [](const Location& a, const Location& b) { return a.sample < b.sample; };
  std::sort(dir.entries_.begin(), dir.entries_.end(), by_sample);
  dir.entries_.shrink_to_fit();
  std::sort(dir.copies_.begin(), dir.copies_.end(), by_sample);
  dir.copies_.shrink_to_fit();
  st.copies = dir.copies_.size();
  return dir;
}

}  // namespace nopfs::service::dir
