// The share service: one per node, run by root (nopfs-job share-serve, docs/admin.md "Shared
// datasets"), that keeps one copy of each dataset the node config declares shared and hands it,
// read-only, to every job whose user proves that they may read each file (docs/security.md,
// "Shared datasets"). No byte a user's process produced ever enters a copy: the service reads the
// PFS itself, hashes what it read, and hands out descriptors of files only it can write.
//
// It listens on a SOCK_SEQPACKET socket (the caller makes its directory, root's, 0755; the socket
// is 0666: anyone may ask, a proof decides). Each connection has its own thread; connections are
// bounded in all and per uid. Each request is checked (share/wire.h) and each proof descriptor
// must be a regular file opened for reading (not O_PATH) whose fstat identity the store then
// matches (share/store.h). Every descriptor received is closed once the request is answered.
//
// Thread safety: Run on one thread; Stop and the accessors from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "share/store.h"
#include "share/wire.h"

namespace nopfs::share {

struct SharedDataset {
  std::string path;    // the declared directory, absolute (what jobs name with --nopfs=)
  uint64_t quota = 0;  // bytes of SSD its copy may take on this node
};

// <store_dir>/<16 hex digits of the xxh3 of the path>: one dataset's store directory.
std::string StoreDirOf(const std::string& store_dir, const std::string& dataset);

struct ServerOptions {
  std::string socket_path;  // bound here, mode 0666 (an old socket there is replaced)
  std::string store_dir;    // <ssd>/.nopfs-shared: made 0700 when missing, must be this euid's
  std::vector<SharedDataset> datasets;
  size_t max_connections = 512;
  size_t max_per_uid = 64;
  // Run returns after this long without a connection (0: never).
  std::chrono::milliseconds idle_exit{0};
  std::chrono::milliseconds save_every{2000};   // manifests written at most this often
  std::function<void(const std::string&)> log;  // one line each; user bytes made printable
};

class Server {
 public:
  // Makes the store directory and binds the socket; the stores are opened at their first request.
  static Result<std::unique_ptr<Server>> Start(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Accepts and serves until Stop, or until idle_exit passes without a connection.
  void Run();
  // Ends Run and every connection (their sockets shut down), writes the manifests.
  void Stop();

  // The store of a declared dataset (opened if need be), for `nopfs share` and tests.
  Result<Store*> StoreOf(const std::string& dataset);
  uint64_t refused() const {
    return refused_.load();
  }  // malformed requests and over-limit connections

 private:
  struct Conn {
    UniqueFd fd;
    uid_t uid = 0;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  explicit Server(ServerOptions o, UniqueFd listen)
      : o_(std::move(o)), listen_(std::move(listen)) {}
  void Serve(Conn* c);
  // One request: its reply and the descriptors to send with it.
  std::vector<std::byte> Answer(const Request& r, std::vector<UniqueFd>& proofs,
                                std::vector<UniqueFd>* copies, uid_t uid);
  void Reap(bool all);
  void Log(const std::string& line) const;

  const ServerOptions o_;
  const UniqueFd listen_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  Mutex mu_;
  std::vector<std::unique_ptr<Conn>> conns_ GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Store>> stores_ GUARDED_BY(mu_);
  std::map<std::string, std::string> broken_ GUARDED_BY(mu_);  // dataset: why its store failed
};

}  // namespace nopfs::share
