// Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/): valid messages built with
// the encoders, as the unit tests build them, one file per message. scripts/fuzz.sh --seeds runs
// it; the files are committed. Usage: nopfs_fuzz_seeds CORPUS_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "fabric/peer_protocol.h"
#include "protocol/wire.h"
#include "service/catalog/catalog_codec.h"
#include "service/catalog/catalog_share.h"
#include "service/peers/directory_wire.h"
#include "share/wire.h"

namespace fs = std::filesystem;
namespace fabric = nopfs::fabric;
namespace codec = nopfs::service::codec;
namespace dir = nopfs::service::dir;

namespace {

fs::path g_root;

void Write(const std::string& target, const std::string& name, std::string_view bytes) {
  fs::create_directories(g_root / target);
  std::ofstream(g_root / target / name, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
void Write(const std::string& target, const std::string& name, std::span<const std::byte> b) {
  Write(target, name, std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
}
void Wire() {
  namespace w = nopfs::wire;
  const std::pair<const char*, w::Message> messages[] = {
      {"hello", {1, w::Hello{w::kVersion, 4242}}},
      {"hello_ok", {1, w::HelloOk{w::kVersion, "1234", 8, 4, 4}}},
      {"open_stream", {2, w::OpenStream{3, 0, 0, std::nullopt, std::nullopt, std::nullopt}}},
      {"open_stream_share",
       {2, w::OpenStream{3, 1, 17, w::StreamShare{1, 4, 32, 1}, std::nullopt, std::nullopt}}},
      {"open_stream_flags",
       {2, w::OpenStream{3, 1, 17, w::StreamShare{}, w::kOpenAcceptRegion, std::nullopt}}},
      {"open_stream_owner",
       {2, w::OpenStream{3, 1, 17, w::StreamShare{2, 4, 32, 0}, w::kOpenAcceptRegion, 777}}},
      {"stream_ok", {2, w::StreamOk{9, 1 << 20, 64, std::nullopt}}},
      {"stream_ok_region", {2, w::StreamOk{9, 1 << 20, 64, uint64_t{1} << 30}}},
      {"status", {3, w::StatusRequest{}}},
      {"status_ok", {3, w::StatusOk{"job 1234: 8 ranks, staging 52%\n", std::nullopt}}},
      {"close_stream", {4, w::CloseStream{9}}},
      {"close_ok", {4, w::CloseOk{9}}},
      {"error", {5, w::Error{3, "rank 9 is not served by this node"}}},
      {"describe", {6, w::Describe{12}}},
      {"describe_ok", {6, w::DescribeOk{12, "/pfs/data/train/cat/001.jpg", 0, 4096, 3}}},
  };
  for (const auto& [name, m] : messages)
    Write("wire", name, *w::Encode(m));
}

void Peer() {
  fabric::Nonce a{}, b{};
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<uint8_t>(i);
    b[i] = static_cast<uint8_t>(255 - i);
  }
  const fabric::Secret secret = a;
  fabric::SessionKey key(fabric::SessionKeyOf(secret, a, b, 0, 1));
  const std::vector<std::byte> data = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}};
  const std::pair<const char*, fabric::PeerMessage> messages[] = {
      {"hello", fabric::Hello{0, a}},
      {"challenge", fabric::Challenge{b, fabric::PeerMac(secret, "nopfs-peer-server", a, b, 0, 1)}},
      {"auth", fabric::Auth{a, b, fabric::PeerMac(secret, "nopfs-peer-client", a, b, 0, 1)}},
      {"auth_result", fabric::AuthResult{true}},
      {"read_request", fabric::ReadRequest{7, 42, fabric::kAcceptsRemoteRead}},
      {"read_reply", fabric::ReadReply{7, 42, fabric::ReadStatus::kOk, 0x1234, data}},
      {"read_reply_missing", fabric::ReadReply{7, 42, fabric::ReadStatus::kNotAvailable, 0, {}}},
      {"exchange", fabric::ExchangeData{3, 0x99, data}},
      {"class_done", fabric::ClassDone{17}},
      {"remote_reply", fabric::RemoteReply{7, 42, 4096, 0x7f0000001000, 0xabcdef, 0x55}},
      {"push", fabric::PushSample{42, 0x77, data}},
      {"leave", fabric::Leave{}},
      {"leave_ack", fabric::LeaveAck{}},
  };
  uint64_t seq = 1;
  for (const auto& [name, m] : messages) {
    std::vector<std::byte> bytes = fabric::Encode(m);
    if (fabric::IsSealed(*fabric::TypeOf(bytes))) fabric::Seal(bytes, seq++, key);
    Write("peer", name, bytes);
  }
}

// The directory target reads its choices from the end of the input (FuzzedDataProvider), one
// byte each here (two for a length or the first queried id, high byte first): `consumed` in the
// order the target takes them, written reversed at the end of the file.
std::string Tail(std::vector<uint8_t> consumed) {
  return std::string(consumed.rbegin(), consumed.rend());
}

std::string Str(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

void Directory() {
  namespace w = dir::wire;
  const uint8_t nodes = 4, owner = 1, self = 2;
  const std::vector<dir::Holding> held = {{1, 0, 0}, {5, 0, 1}, {9, 2, 0}, {201, 7, 3}};
  const std::vector<uint32_t> ids = {1, 5, 13, 401};
  // round, nodes - 1, owner, self
  auto choices = [&](uint8_t round) { return std::vector<uint8_t>{round, nodes - 1, owner, self}; };
  Write("directory", "publish", Str(w::EncodePublish(held, owner, nodes)) + Tail(choices(0)));
  Write("directory", "query", Str(w::EncodeQuery(ids, owner, nodes)) + Tail(choices(1)));
  // An answer to the queried ids 1 and 5 (n = 2, first q = 0, gaps 0 and 0).
  std::vector<uint8_t> c = choices(2);
  c.insert(c.end(), {2, 0, 0, 0, 0});
  const std::vector<dir::Location> answers = {{1, 0, 0, 0}, {5, w::kNoHolder, 0, 0}};
  const std::vector<dir::Location> copies = {{9, 3, 2, 0}};
  Write("directory", "answer", Str(w::EncodeAnswer(answers, copies, owner, nodes)) + Tail(c));
  // The owner's side: nodes 0 and 1 publish, then requester 0 queries.
  const std::vector<dir::Holding> held1 = {{1, 1, 4}, {9, 2, 2}};
  const std::string p0 = Str(w::EncodePublish(held, owner, nodes));
  const std::string p1 = Str(w::EncodePublish(held1, owner, nodes));
  const std::string q0 = Str(w::EncodeQuery(ids, owner, nodes));
  c = choices(3);
  c.insert(c.end(), {1, 0, static_cast<uint8_t>(p0.size()), 1, 0, static_cast<uint8_t>(p1.size()),
                     0, 0, static_cast<uint8_t>(q0.size())});
  Write("directory", "owner", p0 + p1 + q0 + Tail(c));
}

void Catalog() {
  codec::CatalogMeta meta;
  meta.kind = codec::DatasetKind::kManifest;
  meta.reusable = true;
  meta.samples = 1000;
  meta.stamps = 12;
  meta.fingerprint = 0xfeedface;
  meta.dataset = "/pfs/data/train.manifest";
  meta.root = "/pfs/data";
  Write("catalog", "meta", std::string(1, '\0') + codec::EncodeCatalogMeta(meta));
  Write("catalog", "sample", "\x01" + codec::EncodeSampleValue(0, 4096, 3, "train/cat/001.jpg"));
  Write("catalog", "sample_nolabel", "\x01" + codec::EncodeSampleValue(4096, 100, -1, "big.bin"));
  Write("catalog", "stamp", "\x02" + codec::EncodeStamp({1700000000123456789, 77, 2049, 4096}));
  Write("catalog", "checksum_meta", "\x03" + codec::EncodeChecksumMeta({codec::kCatalogFormat, 9}));
  Write("catalog", "checksum", "\x04" + codec::EncodeChecksum(0x0123456789abcdef));
  Write("catalog", "sample_key", "\x05" + codec::SampleKey(1234));
  Write("catalog", "checksum_key", "\x06" + codec::ChecksumKey(1234));
  Write("catalog", "class_key", "\x07" + codec::ClassKey(3));
}

void CatalogShare() {
  namespace scan = nopfs::service::scan;
  namespace share = nopfs::service::share;
  auto with_selector = [](uint8_t selector, const std::vector<std::byte>& bytes) {
    std::string out(1, static_cast<char>(selector));
    out.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return out;
  };
  share::Lead hit;
  hit.kind = share::LeadKind::kHit;
  hit.contents.root = "/pfs/data";
  hit.contents.classes = {"cat", "dog"};
  hit.contents.Add("cat/001.jpg", 0, 4096, 0);
  hit.contents.Add("dog/002.jpg", 0, 100, 1);
  Write("catalog_share", "lead_hit", with_selector(0, share::EncodeLead(hit)));
  share::Lead miss;
  miss.kind = share::LeadKind::kMiss;
  miss.reason = "no catalog at /cache/1000/0123456789abcdef";
  miss.listing.root_stamp = {1700000000123456789, 77, 2049, 4096};
  miss.listing.class_names = {"cat", "dog", "eel"};
  Write("catalog_share", "lead_miss", with_selector(0, share::EncodeLead(miss)));
  share::Lead manifest;
  manifest.kind = share::LeadKind::kScanned;
  manifest.scanned.kind = codec::DatasetKind::kManifest;
  manifest.scanned.root = "/pfs/data";
  manifest.scanned.samples = {{"shards/big.bin", 0, 1000, 0}, {"shards/big.bin", 1000, 3096, 1}};
  manifest.scanned.stamps = {{"/pfs/data/train.manifest", {1700000000, 5, 2049, 120}}};
  Write("catalog_share", "lead_scanned", with_selector(0, share::EncodeLead(manifest)));
  scan::ClassesPart part;
  part.samples = {{"dog/002.jpg", 0, 100, 1}, {"dog/deep/003.jpg", 0, 7, 1}};
  part.stamps = {{"/pfs/data/dog", {1700000000, 9, 2049, 4096}}};
  Write("catalog_share", "part", with_selector(1, share::EncodePart(part)));
}

void Manifest() {
  Write("manifest", "paths", "train/cat/001.jpg\ntrain/dog/002.jpg\n");
  Write("manifest", "labels", "# path<TAB>label\n\na.bin\t0\nb/c.bin\t1\nd.bin\t-\r\n");
  Write("manifest", "ranges",
        "shards/big.bin\t0\t0\t1000\nshards/big.bin\t1\t1000\t3096\nshards/s2.bin\t2\t10\t20\n");
  Write("manifest", "mixed", "x/one.bin\t3\nrel/two.bin\ntwo.bin\t-\t5\t5\n");
}

void SpankOptions() {
  Write("spank_options", "user",
        std::string("\x00\x09", 2) +
            "nopfs=/pfs/datasets/imagenet\nnopfs-seed=42\nnopfs-epochs=90\n"
            "nopfs-batch=256\nnopfs-scheme=uniform\nnopfs-drop-last\n"
            "nopfs-ranks-per-node=4\nnopfs-ram=16GB\nnopfs-ssd=1TiB");
  Write("spank_options", "user_min", std::string("\x00\x01", 2) + "nopfs=/pfs/d");
  Write("spank_options", "plugin",
        std::string("\x01\x00", 2) +
            "config=/etc/nopfs/config.lua\npolicy=/etc/nopfs/admit.lua\nrundir=/run/nopfs\n"
            "on_refusal=run\nlauncher=/usr/libexec/nopfs/nopfs-job\nnopfsd=/usr/sbin/nopfsd\n"
            "timeout=120\ngrace=5\npeer_key=/etc/nopfs/peer.key\npeer_ports=600-630,640-987\n"
            "peer_host=127.0.0.1");
}

}  // namespace

// The share protocol: the selector byte is decoder | descriptors << 1 (| 0x80: a reply to an open).
void Share() {
  namespace sh = nopfs::share;
  auto with = [](uint8_t sel, const std::vector<std::byte>& m) {
    std::string s(1, static_cast<char>(sel));
    s.append(reinterpret_cast<const char*>(m.data()), m.size());
    return s;
  };
  Write("share", "ping", with(0, sh::EncodeRequest({sh::Op::kPing, "/pfs/imagenet", {}})));
  Write("share", "open",
        with(2 << 1, sh::EncodeRequest({sh::Op::kOpen,
                                        "/pfs/imagenet",
                                        {"n01440764/n01440764_10026.JPEG", "train/b/2.jpg"}})));
  Write("share", "warm",
        with(1 << 1, sh::EncodeRequest({sh::Op::kWarm, "/pfs/coco", {"val2017/000001.jpg"}})));
  Write("share", "reply_open",
        with(0x80 | 1 | (1 << 1), sh::EncodeReply({sh::ReplyStatus::kOk,
                                                   {{sh::Outcome::kReady, 110000, 0x1234},
                                                    {sh::Outcome::kDenied, 0, 0}}})));
  Write("share", "reply_warm",
        with(1, sh::EncodeReply({sh::ReplyStatus::kOk,
                                 {{sh::Outcome::kReady, 5, 7},
                                  {sh::Outcome::kNotStored, 0, 0},
                                  {sh::Outcome::kBusy, 0, 0}}})));
  Write("share", "reply_bad", with(1, sh::EncodeReply({sh::ReplyStatus::kBadRequest, {}})));
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: nopfs_fuzz_seeds CORPUS_DIR (e.g. fuzz/corpus)\n");
    return 2;
  }
  g_root = argv[1];
  Wire();
  Peer();
  Directory();
  Catalog();
  CatalogShare();
  Manifest();
  SpankOptions();
  Share();
  return 0;
}
