#!/usr/bin/env bash
# Builds libhdmlp of NoPFS's own code (github.com/spcl/NoPFS, branch old-nopfs) for
# bench/nopfs_compare.py, outside nopfs, without changing a file of it:
#   git clone -b old-nopfs https://github.com/spcl/NoPFS DIR     (or git archive of that branch)
#   apt-get install libconfig++-dev libopenmpi-dev openmpi-bin libhdf5-dev \
#       libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev
#   bench/build_hdmlp.sh DIR            -> DIR/libhdmlp/build/libhdmlp.so
# Its CMakeLists wants OpenCV's CMake package (Debian ships it only with every OpenCV module's
# -dev package) and its sources rely on headers that older compilers pulled in transitively, so
# the build gets, from DIR/.build-shims: an OpenCVConfig.cmake naming the three modules it uses,
# an opencv2/opencv.hpp that includes those three, and a header of standard includes forced in
# front of every source (-include). NoPFS's deps are not nopfs's: they are not in
# scripts/install-deps.sh.
set -euo pipefail
dir=$(cd "${1:?usage: build_hdmlp.sh NOPFS_OLD_CHECKOUT}" && pwd)
[ -f "$dir/libhdmlp/CMakeLists.txt" ] || { echo "build_hdmlp.sh: $dir is not NoPFS's old-nopfs branch (no libhdmlp/CMakeLists.txt)" >&2; exit 2; }
shims=$dir/.build-shims
mkdir -p "$shims/cmake" "$shims/include/opencv2"
cat > "$shims/cmake/OpenCVConfig.cmake" <<EOF
set(OpenCV_FOUND TRUE)
set(OpenCV_INCLUDE_DIRS $shims/include /usr/include/opencv4)
set(OpenCV_LIBS opencv_core opencv_imgproc opencv_imgcodecs)
EOF
cat > "$shims/include/opencv2/opencv.hpp" <<'EOF'
#pragma once
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
EOF
{
  for h in algorithm atomic chrono cmath codecvt condition_variable cstring deque fstream \
      functional iostream list locale map memory mutex numeric queue random set sstream string \
      thread unordered_map unordered_set vector; do
    echo "#include <$h>"
  done
} > "$shims/std.h"
mpi=$(dirname "$(find /usr/lib -name 'libmpi_cxx.so' -print -quit)")
[ -n "$mpi" ] || { echo "build_hdmlp.sh: libmpi_cxx.so not found: apt-get install libopenmpi-dev" >&2; exit 2; }
mkdir -p "$dir/libhdmlp/build"
cd "$dir/libhdmlp/build"
cmake .. -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DENABLE_HDF5=ON \
  -DOpenCV_DIR="$shims/cmake" \
  "-DCMAKE_CXX_FLAGS=-include $shims/std.h -I/usr/include/hdf5/serial" \
  "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--no-as-needed -L$mpi -lmpi_cxx -lmpi" >/dev/null
cmake --build . -j"$(nproc)"
echo "built $dir/libhdmlp/build/libhdmlp.so"
