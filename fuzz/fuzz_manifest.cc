// Fuzz target: the manifest parser (service/catalog/catalog_scan.h, ScanManifest), which nopfsd
// runs as the job's user on a file the user wrote. The input is the manifest's text; the files it
// names exist in an in-memory Env (every path under the manifest's directory whose last component
// does not start with 'x' is a regular file of 4096 bytes; every ancestor is a directory), so the
// whole scan runs, not only the line parser.
// Properties: no read outside the text; an accepted manifest gives one sample per line that is
// neither empty nor a comment, each with a relative path inside the manifest's directory (no
// leading '/', no "..", "." or empty component), a byte range inside its file, samples sorted and
// each listed once; stamps for the manifest and the directories.
//
// The parser gets the text as the std::string that Env::ReadFile returns, whose terminating NUL
// would hide a one-byte over-read from ASan: ReadFile poisons that byte (a heap string's; a short
// one lives inside the string object, where ASan sees nothing either way), so that reading it is
// a use-after-poison report, as reading past libFuzzer's own exactly-sized copy of the input is.
#include <sanitizer/asan_interface.h>

#include <functional>
#include <set>
#include <string>
#include <tuple>

#include "fuzz/fuzz_check.h"
#include "service/catalog/catalog_scan.h"

namespace scan = nopfs::service::scan;
using nopfs::service::FileStat;

namespace {

constexpr std::string_view kManifest = "/data/set/list.txt";
constexpr uint64_t kFileBytes = 4096;

class MemEnv final : public nopfs::service::Env {
 public:
  explicit MemEnv(std::string_view text) : text_(text) {}
  nopfs::Result<FileStat> Stat(const std::string& path) override {
    FileStat st;
    st.inode = std::hash<std::string>()(path);
    st.device = 1;
    st.mtime_ns = 1;
    if (path == kManifest) {
      st.is_regular = true;
      st.size = text_.size();
      return st;
    }
    if (path == "/data/set") {
      st.is_dir = true;
      return st;
    }
    if (!path.starts_with("/data/set/")) return nopfs::Status::NotFound(path + ": no such file");
    // Below /data/set: a name with a '.' is a regular file (one starting with 'x' is missing), any
    // other a directory; a path through a file is not found (ENOTDIR).
    std::string_view rest = std::string_view(path).substr(10);
    for (size_t slash = rest.find('/'); slash != std::string_view::npos; slash = rest.find('/')) {
      if (rest.substr(0, slash).find('.') != std::string_view::npos) {
        return nopfs::Status::NotFound(path + ": not a directory");
      }
      rest.remove_prefix(slash + 1);
    }
    if (rest.find('.') == std::string_view::npos) {
      st.is_dir = true;
      return st;
    }
    if (!rest.empty() && rest[0] != 'x') {
      st.is_regular = true;
      st.size = kFileBytes;
      return st;
    }
    return nopfs::Status::NotFound(path + ": no such file");
  }
  nopfs::Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    return nopfs::Status::NotFound(dir + ": not listed by the manifest scan");
  }
  nopfs::Status ReadAt(const std::string& path, uint64_t, std::span<std::byte>) override {
    return nopfs::Status::NotFound(path + ": not read by the manifest scan");
  }
  nopfs::Result<std::string> ReadFile(const std::string& path) override {
    if (path != kManifest) return nopfs::Status::NotFound(path);
    std::string copy(text_);
    const auto* object = reinterpret_cast<const char*>(&copy);
    const bool on_heap = copy.data() < object || copy.data() >= object + sizeof copy;
    // Moving a heap string hands its buffer over untouched, so the poison goes with it to the
    // parser; the allocator unpoisons the buffer when it is freed.
    if (on_heap) ASAN_POISON_MEMORY_REGION(copy.data() + copy.size(), 1);
    return copy;
  }

 private:
  std::string_view text_;  // libFuzzer's input: exactly `size` bytes on the heap
};

bool Relative(std::string_view p) {
  if (p.empty() || p[0] == '/') return false;
  size_t start = 0;
  for (;;) {
    const size_t slash = p.find('/', start);
    const std::string_view part =
        p.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string_view::npos) return true;
    start = slash + 1;
  }
}

uint64_t SampleLines(std::string_view text) {
  uint64_t n = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty() && line[0] != '#') ++n;
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = nopfs::fuzz::AsText(data, size);
  MemEnv env(text);
  nopfs::Result<scan::ScanResult> r = scan::ScanManifest(std::string(kManifest), &env, 1);
  if (!r.ok()) {
    NOPFS_FUZZ_CHECK(!r.status().message().empty());
    return 0;
  }
  NOPFS_FUZZ_CHECK(r->root == "/data/set");
  NOPFS_FUZZ_CHECK(r->samples.size() == SampleLines(text));
  NOPFS_FUZZ_CHECK(!r->samples.empty());
  for (size_t i = 0; i < r->samples.size(); ++i) {
    const scan::Sample& s = r->samples[i];
    NOPFS_FUZZ_CHECK(Relative(s.relative_path));
    NOPFS_FUZZ_CHECK(s.label >= -1);
    const uint64_t file_bytes = s.relative_path == "list.txt" ? text.size() : kFileBytes;
    NOPFS_FUZZ_CHECK(s.length >= 1 && s.offset <= file_bytes && s.length <= file_bytes - s.offset);
    if (i > 0) {
      const scan::Sample& p = r->samples[i - 1];
      NOPFS_FUZZ_CHECK(std::tie(p.label, p.relative_path, p.offset, p.length) <
                       std::tie(s.label, s.relative_path, s.offset, s.length));
    }
  }
  std::set<std::string> stamped;
  for (const scan::StampEntry& e : r->stamps)
    stamped.insert(e.path);
  NOPFS_FUZZ_CHECK(stamped.contains(std::string(kManifest)));
  NOPFS_FUZZ_CHECK(stamped.size() == r->stamps.size());
  return 0;
}
