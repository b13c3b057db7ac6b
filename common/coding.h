// Byte coding for nopfs's hand-written formats: the client/service wire (protocol/wire.cc), the
// peer protocol (fabric/peer_protocol.cc), the catalog's RocksDB records
// (service/catalog/catalog_codec.cc) and the directory exchange (service/peers/directory_wire.cc).
//
// - Fixed-width integers are little-endian (StoreLe/LoadLe on raw bytes; Writer::U8..U64 append
//   them). BigEndian32 exists for RocksDB keys, whose byte order must be the numeric order.
// - Varints are LEB128 (7 bits a byte, low group first, high bit set on every byte but the last),
//   as protobuf and LevelDB write them.
// - A string or byte run is "length-prefixed" as a le32 byte count followed by the bytes.
// - Reader is bounds-checked: every read either consumes exactly the bytes it names or fails,
//   consuming nothing, and records why (error()). A failed Reader stays failed.
//
// Writers append to a std::vector<std::byte> (Writer) or a std::string (StringWriter, for RocksDB
// values); Reader reads either.
//
// Thread safety: a Writer or Reader is used by one thread at a time; the free functions are pure.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace nopfs::coding {

// Writes the low `n` bytes of `v` at `p`, least significant first.
inline void StoreLe(std::byte* p, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i)
    p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

// Reads `n` (at most 8) little-endian bytes at `p`.
inline uint64_t LoadLe(const std::byte* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i)
    v |= uint64_t{std::to_integer<uint8_t>(p[i])} << (8 * i);
  return v;
}

inline void StoreLe64(std::span<std::byte> b, size_t at, uint64_t v) {
  StoreLe(b.data() + at, v, 8);
}
inline uint64_t LoadLe64(std::span<const std::byte> b, size_t at) {
  return LoadLe(b.data() + at, 8);
}
inline uint32_t LoadLe32(const std::byte* p) {
  return static_cast<uint32_t>(LoadLe(p, 4));
}
inline uint16_t LoadLe16(const std::byte* p) {
  return static_cast<uint16_t>(LoadLe(p, 2));
}

// The most bytes a varint of a 32-bit and of a 64-bit value takes.
inline constexpr size_t kMaxVarint32Bytes = 5;
inline constexpr size_t kMaxVarint64Bytes = 10;

// Appends to `Buffer`, a std::vector<std::byte> or a std::string.
template <typename Buffer>
class BasicWriter {
 public:
  using Byte = typename Buffer::value_type;
  static_assert(std::is_same_v<Byte, std::byte> || std::is_same_v<Byte, char>);

  BasicWriter() = default;
  explicit BasicWriter(Buffer start) : out_(std::move(start)) {}

  void U8(uint8_t v) { out_.push_back(static_cast<Byte>(v)); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void U64(uint64_t v) { Le(v, 8); }
  void BigEndian32(uint32_t v) {
    for (int i = 3; i >= 0; --i)
      U8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      U8(static_cast<uint8_t>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    U8(static_cast<uint8_t>(v));
  }
  // The bytes as they are, without a length.
  void Bytes(std::span<const std::byte> b) {
    if constexpr (std::is_same_v<Byte, char>) {
      out_.append(reinterpret_cast<const char*>(b.data()), b.size());
    } else {
      out_.insert(out_.end(), b.begin(), b.end());
    }
  }
  void Bytes(std::span<const uint8_t> b) { Bytes(std::as_bytes(b)); }
  void Bytes(std::string_view s) { Bytes(std::as_bytes(std::span(s.data(), s.size()))); }
  // A le32 length, then the bytes. The caller keeps strings under 4 GiB (every format here caps
  // its messages far below that).
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Bytes(s);
  }
  // Overwrites 4 bytes at `at` (a length known only after the body was written).
  void PatchU32(size_t at, uint32_t v) {
    for (size_t i = 0; i < 4; ++i)
      out_[at + i] = static_cast<Byte>((v >> (8 * i)) & 0xff);
  }
  void Reserve(size_t n) { out_.reserve(out_.size() + n); }

  size_t size() const { return out_.size(); }
  Buffer& bytes() { return out_; }
  Buffer Take() { return std::move(out_); }

 private:
  void Le(uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i)
      U8(static_cast<uint8_t>(v >> (8 * i)));
  }
  Buffer out_;
};

using Writer = BasicWriter<std::vector<std::byte>>;
using StringWriter = BasicWriter<std::string>;

// A bounds-checked cursor over bytes it does not own.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  explicit Reader(std::string_view in) : in_(std::as_bytes(std::span(in.data(), in.size()))) {}

  bool U8(uint8_t* v) { return Le(v, 1); }
  bool U16(uint16_t* v) { return Le(v, 2); }
  bool U32(uint32_t* v) { return Le(v, 4); }
  bool U64(uint64_t* v) { return Le(v, 8); }
  bool BigEndian32(uint32_t* v) {
    if (!Need(4)) return false;
    uint32_t x = 0;
    for (size_t i = 0; i < 4; ++i)
      x = (x << 8) | std::to_integer<uint8_t>(in_[pos_ + i]);
    pos_ += 4;
    *v = x;
    return true;
  }
  // At most 5 bytes and a value below 2^32.
  bool Varint32(uint32_t* v) {
    uint64_t x = 0;
    if (!VarintBytes(&x, kMaxVarint32Bytes)) return false;
    if (x > 0xFFFFFFFFull) return Fail("varint above 32 bits");
    *v = static_cast<uint32_t>(x);
    return true;
  }
  // At most 10 bytes and a value below 2^64.
  bool Varint64(uint64_t* v) { return VarintBytes(v, kMaxVarint64Bytes); }
  // The next `n` bytes, without copying.
  bool Bytes(size_t n, std::span<const std::byte>* out) {
    if (!Need(n)) return false;
    *out = in_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  template <size_t N>
  bool Array(std::array<uint8_t, N>* a) {
    if (!Need(N)) return false;
    for (size_t i = 0; i < N; ++i)
      (*a)[i] = std::to_integer<uint8_t>(in_[pos_ + i]);
    pos_ += N;
    return true;
  }
  bool Skip(size_t n) {
    if (!Need(n)) return false;
    pos_ += n;
    return true;
  }
  // A le32 length, then that many bytes.
  bool Str(std::string* s) {
    const size_t start = pos_;
    uint32_t n = 0;
    if (!U32(&n)) return false;
    if (remaining() < n) {
      pos_ = start;
      return Fail("string length runs past the end");
    }
    s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  // Everything not yet read; the Reader is then at its end.
  std::span<const std::byte> Rest() {
    std::span<const std::byte> rest = in_.subspan(pos_);
    pos_ = in_.size();
    return rest;
  }

  bool ok() const { return error_ == nullptr; }
  // Why the first failed read failed ("truncated", "varint longer than 5 bytes", ...), or "".
  const char* error() const { return error_ == nullptr ? "" : error_; }
  bool done() const { return pos_ == in_.size(); }
  size_t pos() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }
  size_t size() const { return in_.size(); }

 private:
  bool Need(size_t n) {
    if (error_ != nullptr) return false;
    if (in_.size() - pos_ < n) return Fail("truncated");
    return true;
  }
  bool Fail(const char* why) {
    if (error_ == nullptr) error_ = why;
    return false;
  }
  template <typename T>
  bool Le(T* v, size_t n) {
    if (!Need(n)) return false;
    *v = static_cast<T>(LoadLe(in_.data() + pos_, n));
    pos_ += n;
    return true;
  }
  bool VarintBytes(uint64_t* v, size_t max) {
    if (error_ != nullptr) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < max; ++i) {
      if (pos_ + i >= in_.size()) return Fail("truncated");
      const uint8_t b = std::to_integer<uint8_t>(in_[pos_ + i]);
      if (i == kMaxVarint64Bytes - 1 && b > 1) return Fail("varint above 64 bits");
      x |= uint64_t{b & 0x7fu} << (7 * i);
      if ((b & 0x80) == 0) {
        pos_ += i + 1;
        *v = x;
        return true;
      }
    }
    return Fail(max == kMaxVarint32Bytes ? "varint longer than 5 bytes"
                                         : "varint longer than 10 bytes");
  }

  std::span<const std::byte> in_;
  size_t pos_ = 0;
  const char* error_ = nullptr;
};

}  // namespace nopfs::coding
