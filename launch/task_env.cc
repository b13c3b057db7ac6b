#include "launch/task_env.h"

namespace nopfs::launch {

std::vector<std::pair<std::string, std::string>> TaskEnv::Variables() const {
  std::vector<std::pair<std::string, std::string>> v;
  if (!socket.empty()) v.emplace_back("NOPFS_SOCKET", socket);
  v.emplace_back("NOPFS_RUN_DIR", run_dir);
  v.emplace_back("NOPFS_DATASET", dataset);
  v.emplace_back("NOPFS_RANK", std::to_string(rank()));
  v.emplace_back("NOPFS_LOCAL_RANK", std::to_string(local_rank));
  v.emplace_back("NOPFS_RANKS", std::to_string(ranks));
  v.emplace_back("NOPFS_RANKS_PER_NODE", std::to_string(ranks_per_node));
  v.emplace_back("NOPFS_NODE", std::to_string(node));
  v.emplace_back("NOPFS_NODES", std::to_string(nodes));
  v.emplace_back("NOPFS_SEED", std::to_string(seed));
  v.emplace_back("NOPFS_EPOCHS", std::to_string(epochs));
  v.emplace_back("NOPFS_BATCH", std::to_string(batch));
  v.emplace_back("NOPFS_SCHEME", scheme);
  v.emplace_back("NOPFS_DROP_LAST", drop_last ? "1" : "0");
  if (samples != 0) v.emplace_back("NOPFS_SAMPLES", std::to_string(samples));
  return v;
}

}  // namespace nopfs::launch
