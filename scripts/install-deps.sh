#!/usr/bin/env bash
# Installs every Debian package nopfs needs to build, test and run the demo. Idempotent: packages
# already present are not fetched again, and `apt-get update` runs only when something is missing.
# Every other entry point (scripts/build.sh, scripts/test.sh, scripts/demo.sh) calls this first.
set -euo pipefail

PACKAGES=(
  # toolchain
  g++ cmake make pkg-config clang-format git
  # clang: the thread-safety analysis (scripts/thread_safety.py) and the fuzz tree
  # (scripts/fuzz.sh), with its libFuzzer, ASan and UBSan runtimes
  clang libclang-rt-14-dev
  # libraries (spdlog's headers use fmt's)
  librocksdb-dev libspdlog-dev libfmt-dev liblua5.4-dev libfabric-dev
  libgtest-dev libgmock-dev libcli11-dev libxxhash-dev nlohmann-json3-dev libssl-dev
  # Slurm and MUNGE for the local cluster
  slurmctld slurmd slurm-client munge libslurm-dev
  # the Python client (libjpeg's header: pil_decode's decode calls the libjpeg PIL loaded)
  python3 python3-dev python3-torch python3-numpy python3-pytest pybind11-dev python3-torchvision
  libjpeg62-turbo-dev
  # the wheel (python/pyproject.toml), built offline, and the venv it is tested in
  python3-pip python3-setuptools python3-wheel python3-venv
  # tools used by tests and benchmarks (the metrics test parses with prometheus_client's parser)
  procps iproute2 util-linux iperf3 python3-prometheus-client
  # the emulated PFS (bench/pfsemu, a FUSE 3 file system) and the end-to-end benchmark's plots
  libfuse3-dev fuse3 gnuplot-nox
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "nopfs: install-deps: missing packages: ${missing[*]}" >&2
  echo "nopfs: install-deps: run this script as root (or install them with apt-get)" >&2
  exit 1
fi

echo "nopfs: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt (unattended upgrades, a second install) rather than failing on its lock.
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
