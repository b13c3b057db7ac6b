// The dataset scan behind Catalog::Open: ImageFolder walk and manifest parsing, both in parallel,
// producing the sorted sample list and the stamps that decide later reuse. Internal to the catalog
// (service/catalog/catalog.cc); docs/catalog.md describes the rules.
//
// Thread safety: the functions are reentrant; each call uses its own worker threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "service/catalog/catalog_codec.h"
#include "service/env/env.h"

namespace nopfs::service::scan {

struct Sample {
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
  int64_t label = -1;
};

struct StampEntry {
  std::string path;  // absolute
  codec::Stamp stamp;
};

struct ScanResult {
  codec::DatasetKind kind = codec::DatasetKind::kImageFolder;
  std::string root;                      // what relative paths are relative to
  std::vector<Sample> samples;           // sorted by (label, relative path, offset, length)
  std::vector<std::string> class_names;  // ImageFolder only
  std::vector<StampEntry> stamps;        // sorted by path
};

codec::Stamp ToStamp(const FileStat& st);

// Runs fn(0) .. fn(n-1) on up to `threads` threads (the caller's among them).
void ParallelFor(uint64_t n, uint32_t threads, const std::function<void(uint64_t)>& fn);

// Walks the ImageFolder tree at `root` (an absolute real path of a directory): the three steps
// below, on one node.
nopfs::Result<ScanResult> ScanImageFolder(const std::string& root, Env* env, uint32_t threads);

// The ImageFolder walk in steps that the nodes of a job share (one lists the root, each walks
// some classes, every node assembles the same result).
struct RootListing {
  codec::Stamp root_stamp;               // the root directory's
  std::vector<std::string> class_names;  // sorted bytewise; label = index
};
struct ClassesPart {
  std::vector<Sample> samples;     // in no particular order
  std::vector<StampEntry> stamps;  // the directories walked, in no particular order
};
// Opens and lists `root` (Env::OpenDir) for the class directories: the entries listed as
// directories, and those of the entries whose type the listing does not give (symbolic links)
// that stat as directories (stat'ed on up to `threads` threads).
nopfs::Result<RootListing> ListImageFolderRoot(const std::string& root, Env* env, uint32_t threads);
// Walks the class directories of `labels` (indexes into listing.class_names).
nopfs::Result<ClassesPart> WalkClasses(const std::string& root, const RootListing& listing,
                                       const std::vector<uint32_t>& labels, Env* env,
                                       uint32_t threads);
// The scan result of the parts that together walked every class once, sorted on up to `threads`
// threads. InvalidArgument if a sample's label is not a class of the listing.
nopfs::Result<ScanResult> AssembleImageFolder(const std::string& root, RootListing listing,
                                              std::vector<ClassesPart> parts, uint32_t threads);
// Parses the manifest at `manifest` (an absolute real path of a file) and stats what it names.
nopfs::Result<ScanResult> ScanManifest(const std::string& manifest, Env* env, uint32_t threads);

}  // namespace nopfs::service::scan
