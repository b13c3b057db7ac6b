#include "fabric/peer_protocol.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/coding.h"

namespace nopfs::fabric {
namespace {

using coding::Reader;
using coding::Writer;

Status Bad(const std::string& why) {
  return Status::Corruption("peer message rejected: " + why);
}

// The bytes of a sealed type's fixed fields, before its authentication block.
uint64_t FixedBytes(PeerType type) {
  switch (type) {
    case PeerType::kAuthResult:
    case PeerType::kClassDone:
    case PeerType::kLeave:
    case PeerType::kLeaveAck:
      return 4;
    case PeerType::kReadRequest:
      return 24;
    case PeerType::kReadReply:
      return 32;
    case PeerType::kExchange:
    case PeerType::kPush:
      return 16;
    case PeerType::kRemoteReply:
      return 48;
    default:
      return 0;
  }
}

constexpr uint64_t kRemoteKeyOffset = kPeerHeaderBytes + 32;  // RemoteReply's key field

}  // namespace

uint64_t RemoteKeyMask(SessionKey& key, uint64_t seq) {
  std::array<std::byte, 21> in{};
  constexpr std::string_view kLabel = "nopfs-rma-key";
  std::memcpy(in.data(), kLabel.data(), kLabel.size());
  coding::StoreLe64(in, kLabel.size(), seq);
  const SealMac m = key.Compute(in);
  uint64_t v = 0;
  std::memcpy(&v, m.data(), sizeof v);
  return v;
}

namespace {

// A ReadReply's fixed fields and (empty) authentication block, for `data_len` bytes of data.
void ReplyFields(Writer& body, const ReadReply& p, uint64_t data_len) {
  if (data_len > kMaxSampleBytes) throw std::invalid_argument("peer reply data too large");
  if (p.status != ReadStatus::kOk && data_len != 0) {
    throw std::invalid_argument("peer reply carries data with a non-ok status");
  }
  if (data_len == 0 && p.xxh3 != 0) throw std::invalid_argument("a checksum without data");
  body.U64(p.request_id);
  body.U64(p.sample);
  body.U32(static_cast<uint32_t>(p.status));
  body.U32(0);
  body.U64(p.xxh3);
  body.U64(0);  // the authentication block, filled by Seal
  body.U64(0);
  body.U64(0);
}

}  // namespace

std::vector<std::byte> Encode(const PeerMessage& m) {
  // The header first, its body length patched at the end: the body (a sample's bytes, up to
  // 64 MiB) is written once, into the message itself.
  Writer out;
  out.Reserve(kPeerHeaderBytes + 80);
  out.U32(kPeerMagic);
  out.U8(kPeerVersion);
  const size_t type_at = out.size();
  out.U8(0);  // the type, below
  out.U16(0);
  const size_t body_len_at = out.size();
  out.U32(0);  // the body length, below
  out.U32(0);
  Writer& body = out;
  PeerType type{};
  if (const auto* h = std::get_if<Hello>(&m)) {
    type = PeerType::kHello;
    body.U32(h->node);
    body.Bytes(h->client_nonce);
  } else if (const auto* c = std::get_if<Challenge>(&m)) {
    type = PeerType::kChallenge;
    body.Bytes(c->server_nonce);
    body.Bytes(c->server_mac);
  } else if (const auto* a = std::get_if<Auth>(&m)) {
    type = PeerType::kAuth;
    body.Bytes(a->client_nonce);
    body.Bytes(a->server_nonce);
    body.Bytes(a->client_mac);
  } else if (const auto* r = std::get_if<AuthResult>(&m)) {
    type = PeerType::kAuthResult;
    body.U32(r->accepted ? 1 : 0);
  } else if (const auto* q = std::get_if<ReadRequest>(&m)) {
    if ((q->flags & ~kAcceptsRemoteRead) != 0) throw std::invalid_argument("unknown read flags");
    type = PeerType::kReadRequest;
    body.U64(q->request_id);
    body.U64(q->sample);
    body.U32(q->flags);
    body.U32(0);
  } else if (const auto* v = std::get_if<RemoteReply>(&m)) {
    if (v->length > kMaxSampleBytes) throw std::invalid_argument("remote reply too long");
    type = PeerType::kRemoteReply;
    body.U64(v->request_id);
    body.U64(v->sample);
    body.U64(v->length);
    body.U64(v->addr);
    body.U64(v->key);
    body.U64(v->xxh3);
  } else if (const auto* d = std::get_if<ClassDone>(&m)) {
    if (d->cls > 0xFFFF) throw std::invalid_argument("class above 65535");
    type = PeerType::kClassDone;
    body.U32(d->cls);
  } else if (std::holds_alternative<Leave>(m)) {
    type = PeerType::kLeave;
    body.U32(0);
  } else if (std::holds_alternative<LeaveAck>(m)) {
    type = PeerType::kLeaveAck;
    body.U32(0);
  } else if (const auto* u = std::get_if<PushSample>(&m)) {
    if (u->data.size() > kMaxSampleBytes) throw std::invalid_argument("pushed sample too large");
    type = PeerType::kPush;
    body.Reserve(40 + u->data.size());
    body.U64(u->sample);
    body.U64(u->xxh3);
    body.U64(0);  // the authentication block, filled by Seal
    body.U64(0);
    body.U64(0);
    body.Bytes(u->data);
  } else if (const auto* x = std::get_if<ExchangeData>(&m)) {
    if (x->data.size() > kMaxSampleBytes) throw std::invalid_argument("exchange data too large");
    type = PeerType::kExchange;
    body.Reserve(40 + x->data.size());
    body.U64(x->round);
    body.U64(x->xxh3);
    body.U64(0);  // the authentication block, filled by Seal
    body.U64(0);
    body.U64(0);
    body.Bytes(x->data);
  } else {
    const auto& p = std::get<ReadReply>(m);
    type = PeerType::kReadReply;
    body.Reserve(56 + p.data.size());
    ReplyFields(body, p, p.data.size());
    body.Bytes(p.data);
  }
  if (type == PeerType::kAuthResult || type == PeerType::kReadRequest ||
      type == PeerType::kRemoteReply || type == PeerType::kClassDone || type == PeerType::kLeave ||
      type == PeerType::kLeaveAck) {
    for (int i = 0; i < 3; ++i)
      body.U64(0);  // the authentication block, filled by Seal
  }
  std::vector<std::byte>& bytes = out.bytes();
  bytes[type_at] = static_cast<std::byte>(type);
  out.PatchU32(body_len_at, static_cast<uint32_t>(bytes.size() - kPeerHeaderBytes));
  return out.Take();
}

std::vector<std::byte> EncodeReplyHead(const ReadReply& head, uint64_t data_len) {
  if (!head.data.empty()) throw std::invalid_argument("EncodeReplyHead: the data goes apart");
  Writer out;
  out.Reserve(kPeerHeaderBytes + 56);
  out.U32(kPeerMagic);
  out.U8(kPeerVersion);
  out.U8(static_cast<uint8_t>(PeerType::kReadReply));
  out.U16(0);
  const size_t body_len_at = out.size();
  out.U32(0);
  out.U32(0);
  ReplyFields(out, head, data_len);
  out.PatchU32(body_len_at, static_cast<uint32_t>(out.size() - kPeerHeaderBytes + data_len));
  return out.Take();
}

Result<PeerMessage> Decode(std::span<const std::byte> buf) {
  return Decode(buf, nullptr);
}

Result<PeerMessage> Decode(std::span<const std::byte> buf, std::span<const std::byte>* reply_data) {
  if (buf.size() < kPeerHeaderBytes) return Bad("shorter than the 16-byte header");
  Reader r(buf);
  uint32_t magic = 0;
  uint8_t version = 0;
  uint8_t type = 0;
  uint16_t reserved16 = 0;
  uint32_t body_len = 0;
  uint32_t reserved32 = 0;
  if (!(r.U32(&magic) && r.U8(&version) && r.U8(&type) && r.U16(&reserved16) && r.U32(&body_len) &&
        r.U32(&reserved32))) {
    return Bad("shorter than the 16-byte header");
  }
  if (magic != kPeerMagic) return Bad("bad magic");
  if (version != kPeerVersion) return Bad("version " + std::to_string(version) + " unsupported");
  if (reserved16 != 0) return Bad("reserved header field not zero");
  if (reserved32 != 0) return Bad("reserved header field not zero");
  if (body_len != buf.size() - kPeerHeaderBytes) {
    return Bad("body length " + std::to_string(body_len) + " but " +
               std::to_string(buf.size() - kPeerHeaderBytes) + " bytes follow the header");
  }
  auto expect = [&](uint64_t n) -> Status {
    if (body_len != n) {
      return Bad("type " + std::to_string(type) + " needs " + std::to_string(n) +
                 " body bytes, got " + std::to_string(body_len));
    }
    return Status::Ok();
  };
  // Each case checks the body's length before reading it, so a read that fails is a bug here.
  auto truncated = [&]() { return Bad("type " + std::to_string(type) + ": " + r.error()); };
  switch (static_cast<PeerType>(type)) {
    case PeerType::kHello: {
      NOPFS_RETURN_IF_ERROR(expect(36));
      Hello h;
      if (!(r.U32(&h.node) && r.Array(&h.client_nonce))) return truncated();
      return PeerMessage(h);
    }
    case PeerType::kChallenge: {
      NOPFS_RETURN_IF_ERROR(expect(64));
      Challenge c;
      if (!(r.Array(&c.server_nonce) && r.Array(&c.server_mac))) return truncated();
      return PeerMessage(c);
    }
    case PeerType::kAuth: {
      NOPFS_RETURN_IF_ERROR(expect(96));
      Auth a;
      if (!(r.Array(&a.client_nonce) && r.Array(&a.server_nonce) && r.Array(&a.client_mac))) {
        return truncated();
      }
      return PeerMessage(a);
    }
    case PeerType::kAuthResult: {
      NOPFS_RETURN_IF_ERROR(expect(4 + kAuthBlockBytes));
      uint32_t v = 0;
      if (!r.U32(&v)) return truncated();
      if (v > 1) return Bad("auth result " + std::to_string(v));
      return PeerMessage(AuthResult{v == 1});
    }
    case PeerType::kReadRequest: {
      NOPFS_RETURN_IF_ERROR(expect(24 + kAuthBlockBytes));
      ReadRequest q;
      uint32_t reserved = 0;
      if (!(r.U64(&q.request_id) && r.U64(&q.sample) && r.U32(&q.flags) && r.U32(&reserved))) {
        return truncated();
      }
      if ((q.flags & ~kAcceptsRemoteRead) != 0) {
        return Bad("unknown read request flags " + std::to_string(q.flags));
      }
      if (reserved != 0) return Bad("reserved request field not zero");
      return PeerMessage(q);
    }
    case PeerType::kRemoteReply: {
      NOPFS_RETURN_IF_ERROR(expect(48 + kAuthBlockBytes));
      RemoteReply v;
      if (!(r.U64(&v.request_id) && r.U64(&v.sample) && r.U64(&v.length) && r.U64(&v.addr) &&
            r.U64(&v.key) && r.U64(&v.xxh3))) {
        return truncated();
      }
      if (v.length > kMaxSampleBytes) return Bad("remote reply longer than the sample limit");
      return PeerMessage(v);
    }
    case PeerType::kReadReply: {
      if (body_len < 32 + kAuthBlockBytes) return Bad("read reply shorter than 56 bytes");
      if (body_len - 32 - kAuthBlockBytes > kMaxSampleBytes) {
        return Bad("read reply data over the sample limit");
      }
      ReadReply p;
      uint32_t status = 0;
      uint32_t reserved = 0;
      if (!(r.U64(&p.request_id) && r.U64(&p.sample) && r.U32(&status) && r.U32(&reserved) &&
            r.U64(&p.xxh3) && r.Skip(kAuthBlockBytes))) {  // Unseal checks the block
        return truncated();
      }
      if (status > static_cast<uint32_t>(ReadStatus::kError)) {
        return Bad("read reply status " + std::to_string(status));
      }
      p.status = static_cast<ReadStatus>(status);
      if (reserved != 0) return Bad("reserved reply field not zero");
      auto rest = r.Rest();
      if (p.status != ReadStatus::kOk && !rest.empty()) return Bad("data with a non-ok status");
      if (rest.empty() && p.xxh3 != 0) return Bad("a checksum without data");
      if (reply_data != nullptr) {
        *reply_data = rest;
      } else {
        p.data.assign(rest.begin(), rest.end());
      }
      return PeerMessage(std::move(p));
    }
    case PeerType::kClassDone: {
      NOPFS_RETURN_IF_ERROR(expect(4 + kAuthBlockBytes));
      uint32_t cls = 0;
      if (!r.U32(&cls)) return truncated();
      if (cls > 0xFFFF) return Bad("class " + std::to_string(cls) + " above 65535");
      return PeerMessage(ClassDone{cls});
    }
    case PeerType::kLeave:
    case PeerType::kLeaveAck: {
      NOPFS_RETURN_IF_ERROR(expect(4 + kAuthBlockBytes));
      uint32_t reserved = 0;
      if (!r.U32(&reserved)) return truncated();
      if (reserved != 0) return Bad("reserved leave field not zero");
      if (static_cast<PeerType>(type) == PeerType::kLeave) return PeerMessage(Leave{});
      return PeerMessage(LeaveAck{});
    }
    case PeerType::kPush: {
      if (body_len < 16 + kAuthBlockBytes) return Bad("push shorter than 40 bytes");
      if (body_len - 16 - kAuthBlockBytes > kMaxSampleBytes) {
        return Bad("pushed data over the sample limit");
      }
      PushSample u;
      if (!(r.U64(&u.sample) && r.U64(&u.xxh3) && r.Skip(kAuthBlockBytes))) return truncated();
      auto rest = r.Rest();
      u.data.assign(rest.begin(), rest.end());
      return PeerMessage(std::move(u));
    }
    case PeerType::kExchange: {
      if (body_len < 16 + kAuthBlockBytes) return Bad("exchange shorter than 40 bytes");
      if (body_len - 16 - kAuthBlockBytes > kMaxSampleBytes) {
        return Bad("exchange data over the limit");
      }
      ExchangeData x;
      if (!(r.U64(&x.round) && r.U64(&x.xxh3) && r.Skip(kAuthBlockBytes))) return truncated();
      auto rest = r.Rest();
      x.data.assign(rest.begin(), rest.end());
      return PeerMessage(std::move(x));
    }
  }
  return Bad("unknown type " + std::to_string(type));
}

Result<Secret> ReadSecretFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::FromErrno(errno, "peer secret " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "peer secret " + path);
  }
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0) {
    ::close(fd);
    return Status::PermissionDenied("peer secret " + path +
                                    " must be a regular file with mode 0600 (chmod 600 it)");
  }
  if (st.st_size != 32) {
    ::close(fd);
    return Status::InvalidArgument("peer secret " + path + " must hold exactly 32 bytes, has " +
                                   std::to_string(st.st_size));
  }
  Secret s{};
  ssize_t n = ::pread(fd, s.data(), s.size(), 0);
  int err = errno;
  ::close(fd);
  if (n != 32) return Status::FromErrno(n < 0 ? err : EIO, "reading peer secret " + path);
  return s;
}

Status WriteSecretFile(const std::string& path) {
  Secret s{};
  if (RAND_bytes(s.data(), static_cast<int>(s.size())) != 1) {
    return Status::Internal("OpenSSL RAND_bytes failed");
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "creating peer secret " + path);
  ssize_t n = ::write(fd, s.data(), s.size());
  int err = errno;
  OPENSSL_cleanse(s.data(), s.size());
  if (n != 32 || ::fsync(fd) != 0) {
    if (n == 32) err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::FromErrno(n < 0 || n == 32 ? err : EIO, "writing peer secret " + path);
  }
  if (::close(fd) != 0) return Status::FromErrno(errno, "closing peer secret " + path);
  return Status::Ok();
}

Nonce RandomNonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    throw std::runtime_error("OpenSSL RAND_bytes failed");  // no entropy: a broken system
  }
  return n;
}

Mac PeerMac(const Secret& secret, std::string_view label, const Nonce& client_nonce,
            const Nonce& server_nonce, uint32_t client_node, uint32_t server_node) {
  std::vector<uint8_t> msg(label.begin(), label.end());
  msg.insert(msg.end(), client_nonce.begin(), client_nonce.end());
  msg.insert(msg.end(), server_nonce.begin(), server_nonce.end());
  for (uint32_t v : {client_node, server_node}) {
    for (int i = 0; i < 4; ++i)
      msg.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  Mac mac{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(), msg.size(),
           mac.data(), &len) == nullptr ||
      len != mac.size()) {
    throw std::runtime_error("OpenSSL HMAC-SHA256 failed");
  }
  return mac;
}

Mac SessionKeyOf(const Secret& secret, const Nonce& client_nonce, const Nonce& server_nonce,
                 uint32_t client_node, uint32_t server_node) {
  return PeerMac(secret, "nopfs-peer-session", client_nonce, server_nonce, client_node,
                 server_node);
}

// One EVP_MAC context keyed once; each Compute re-initialises it with the same key, which costs
// no key schedule (OpenSSL keeps the keyed inner and outer digests).
struct SessionKey::Impl {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* ctx = nullptr;
};

SessionKey::SessionKey(const Mac& key) : impl_(std::make_unique<Impl>()) {
  impl_->mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (impl_->mac != nullptr) impl_->ctx = EVP_MAC_CTX_new(impl_->mac);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  if (impl_->ctx == nullptr || EVP_MAC_init(impl_->ctx, key.data(), key.size(), params) != 1) {
    EVP_MAC_CTX_free(impl_->ctx);
    EVP_MAC_free(impl_->mac);
    throw std::runtime_error("OpenSSL HMAC-SHA256 unavailable");
  }
}

SessionKey::~SessionKey() {
  EVP_MAC_CTX_free(impl_->ctx);
  EVP_MAC_free(impl_->mac);
}

SealMac SessionKey::Compute(std::span<const std::byte> bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t len = 0;
  if (EVP_MAC_init(impl_->ctx, nullptr, 0, nullptr) != 1 ||
      EVP_MAC_update(impl_->ctx, reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size()) != 1 ||
      EVP_MAC_final(impl_->ctx, out, &len, sizeof out) != 1 || len < 16) {
    throw std::runtime_error("OpenSSL HMAC-SHA256 failed");
  }
  SealMac m{};
  std::memcpy(m.data(), out, m.size());
  return m;
}

bool IsSealed(PeerType type) {
  return type != PeerType::kHello && type != PeerType::kChallenge && type != PeerType::kAuth;
}

std::optional<PeerType> TypeOf(std::span<const std::byte> buf) {
  if (buf.size() < kPeerHeaderBytes) return std::nullopt;
  return static_cast<PeerType>(std::to_integer<uint8_t>(buf[5]));
}

void Seal(std::span<std::byte> msg, uint64_t seq, SessionKey& key) {
  const PeerType type = *TypeOf(msg);
  const uint64_t at = kPeerHeaderBytes + FixedBytes(type);
  if (!IsSealed(type) || msg.size() < at + kAuthBlockBytes) {
    throw std::invalid_argument("Seal: not an encoded sealed message");
  }
  if (type == PeerType::kRemoteReply) {
    coding::StoreLe64(msg, kRemoteKeyOffset,
                      coding::LoadLe64(msg, kRemoteKeyOffset) ^ RemoteKeyMask(key, seq));
  }
  coding::StoreLe64(msg, at, seq);
  const SealMac m = key.Compute(msg.first(at + 8));
  std::memcpy(msg.data() + at + 8, m.data(), m.size());
}

Result<uint64_t> Unseal(std::span<const std::byte> msg, SessionKey& key) {
  const std::optional<PeerType> type = TypeOf(msg);
  if (!type || !IsSealed(*type) || FixedBytes(*type) == 0) return Bad("not a sealed type");
  const uint64_t at = kPeerHeaderBytes + FixedBytes(*type);
  if (msg.size() < at + kAuthBlockBytes) return Bad("too short for its authentication block");
  const SealMac m = key.Compute(msg.first(at + 8));
  if (CRYPTO_memcmp(m.data(), msg.data() + at + 8, m.size()) != 0) {
    return Status::PermissionDenied("peer message rejected: its MAC does not verify");
  }
  return coding::LoadLe64(msg, at);
}

bool ReplayWindow::Accept(uint64_t seq) {
  if (seq == 0) return false;
  if (seq > top_) {
    const uint64_t shift = seq - top_;
    if (shift >= kReplayWindow) {
      seen_.fill(0);
    } else {
      for (uint64_t s = top_ + 1; s <= seq; ++s)
        seen_[(s / 64) % seen_.size()] &= ~(uint64_t{1} << (s % 64));
    }
    top_ = seq;
  } else if (top_ - seq >= kReplayWindow) {
    return false;
  }
  uint64_t& word = seen_[(seq / 64) % seen_.size()];
  const uint64_t bit = uint64_t{1} << (seq % 64);
  if ((word & bit) != 0) return false;
  word |= bit;
  return true;
}

bool MacEqual(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace nopfs::fabric
