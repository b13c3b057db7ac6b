// What asking the share service ahead of the reads (share/ahead.h) saves a job's first epoch on a
// shared dataset, against one request per file at its read (as nopfsd asked before): a real
// share service (share/server.h) on its own thread, a dataset of --files files of --size bytes in
// a directory (the page cache: what is measured is the asking, not a PFS), and --threads readers
// taking the files in order (as the prefetchers and staging streams do), each read's bytes
// checked. Per round, interleaved: "alone" and "ahead", both over a warm copy (a later job on the
// node) and a cold one (the store removed first: the service fills each file at its first ask).
// Prints each round's seconds and the ratio alone / ahead; never passes or fails.
//
//   nopfs_share_ahead_bench [--files N] [--size BYTES] [--threads T] [--rounds R]
//                           [--batch B] [--ask-threads A] [--dir DIR]
// (--batch and --ask-threads: the asking's largest request and its threads; 128 and 2 here, as
// nopfsd under a 1,024 open-file limit.)
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "share/ahead.h"
#include "share/client.h"
#include "share/server.h"

namespace {

namespace fs = std::filesystem;
using nopfs::share::AheadReader;
using nopfs::share::Server;
using nopfs::share::ServerOptions;
using nopfs::share::ShareClient;

struct Args {
  size_t files = 4096;
  size_t size = 16 * 1024;
  unsigned threads = 4;
  int rounds = 3;
  size_t batch = 128;
  unsigned ask_threads = 2;
  std::string dir = "/var/tmp";
};

char Byte(size_t file, size_t i) {
  return static_cast<char>((file * 131 + i) % 251);
}

// Seconds to read every file once with `threads` readers in order; exits on a wrong byte.
double ReadAll(const Args& a, const std::string& socket, const std::string& root,
               const std::vector<std::string>& rels, bool ahead) {
  ShareClient client(socket, root, std::chrono::seconds(60));
  AheadReader reader(client, std::vector<std::string_view>(rels.begin(), rels.end()),
                     std::vector<uint32_t>(rels.size(), 1),
                     {.max_held = 256, .max_batch = a.batch, .threads = a.ask_threads});
  const auto t0 = std::chrono::steady_clock::now();
  if (ahead) reader.Start();
  std::atomic<size_t> next{0};
  std::atomic<size_t> wrong{0};
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < a.threads; ++t) {
    ts.emplace_back([&] {
      std::string buf(a.size, '\0');
      for (size_t f; (f = next.fetch_add(1)) < rels.size();) {
        const nopfs::Status s =
            ahead ? reader.Read(f, 0, std::as_writable_bytes(std::span(buf)))
                  : reader.ReadAlone(rels[f], 0, std::as_writable_bytes(std::span(buf)));
        if (!s.ok() || buf[0] != Byte(f, 0) || buf[a.size - 1] != Byte(f, a.size - 1)) {
          wrong.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : ts)
    t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  reader.Stop();
  if (wrong.load() != 0) {
    std::fprintf(stderr, "share_ahead_bench: %zu reads failed or were wrong\n", wrong.load());
    std::exit(1);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--files") {
      a.files = std::stoul(v);
    } else if (k == "--size") {
      a.size = std::stoul(v);
    } else if (k == "--threads") {
      a.threads = static_cast<unsigned>(std::stoul(v));
    } else if (k == "--rounds") {
      a.rounds = std::stoi(v);
    } else if (k == "--batch") {
      a.batch = std::stoul(v);
    } else if (k == "--ask-threads") {
      a.ask_threads = static_cast<unsigned>(std::stoul(v));
    } else if (k == "--dir") {
      a.dir = v;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--files N] [--size BYTES] [--threads T] [--rounds R] "
                   "[--batch B] [--ask-threads A] [--dir DIR]\n",
                   argv[0]);
      return 2;
    }
  }
  std::string tmpl = a.dir + "/share_ahead_bench.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string base = tmpl, root = base + "/pfs", store = base + "/ssd/.nopfs-shared";
  fs::create_directories(base + "/ssd");
  std::vector<std::string> rels;
  for (size_t f = 0; f < a.files; ++f) {
    rels.push_back("class" + std::to_string(f % 10) + "/" + std::to_string(f) + ".bin");
    fs::create_directories(fs::path(root + "/" + rels.back()).parent_path());
    std::string bytes(a.size, '\0');
    for (size_t i = 0; i < a.size; ++i)
      bytes[i] = Byte(f, i);
    std::ofstream(root + "/" + rels.back(), std::ios::binary) << bytes;
  }
  ServerOptions o;
  o.socket_path = base + "/share.sock";
  o.store_dir = store;
  o.datasets = {{root, uint64_t{1} << 40}};
  std::printf(
      "%zu files of %zu B, %u readers in order, batches of %zu by %u threads, %d rounds; "
      "load %.1f\n",
      a.files, a.size, a.threads, a.batch, a.ask_threads, a.rounds, [] {
        double l[1] = {0};
        return ::getloadavg(l, 1) == 1 ? l[0] : -1.0;
      }());
  std::printf("round  copy  alone_s  ahead_s  alone/ahead\n");
  for (int r = 1; r <= a.rounds; ++r) {
    for (const bool cold : {true, false}) {
      double t[2] = {0, 0};
      for (const bool ahead : {false, true}) {
        if (cold) fs::remove_all(store);
        fs::create_directories(store);
        fs::permissions(store, fs::perms::owner_all);
        auto server = Server::Start(o);
        if (!server.ok()) {
          std::fprintf(stderr, "share_ahead_bench: %s\n", server.status().message().c_str());
          return 1;
        }
        std::thread run([&] { (*server)->Run(); });
        if (!cold) (void)ReadAll(a, o.socket_path, root, rels, false);  // the copy made warm
        t[ahead ? 1 : 0] = ReadAll(a, o.socket_path, root, rels, ahead);
        (*server)->Stop();
        run.join();
      }
      std::printf("%5d  %4s  %7.3f  %7.3f  %11.2f\n", r, cold ? "cold" : "warm", t[0], t[1],
                  t[0] / t[1]);
    }
  }
  fs::remove_all(base);
  return 0;
}
