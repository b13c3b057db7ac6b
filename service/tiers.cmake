# service/tiers.cmake: the RAM and SSD cache tiers and their prefetchers (library nopfs_tiers).
# Included by service/CMakeLists.txt.
find_package(spdlog CONFIG REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

add_library(nopfs_tiers STATIC
  ${CMAKE_CURRENT_LIST_DIR}/tier_layout.cc
  ${CMAKE_CURRENT_LIST_DIR}/ram_tier.cc
  ${CMAKE_CURRENT_LIST_DIR}/ssd_tier.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefetcher.cc
)
nopfs_target_defaults(nopfs_tiers)
target_link_libraries(nopfs_tiers
  PUBLIC nopfs_policy nopfs_common Threads::Threads
  PRIVATE nopfs_checksum spdlog::spdlog PkgConfig::XXHASH)

nopfs_test(NAME tiers_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/tier_layout_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/ram_tier_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/ssd_tier_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/prefetcher_test.cc
  LIBS nopfs_tiers PkgConfig::XXHASH)

if(NOPFS_BUILD_BENCH AND EXISTS ${PROJECT_SOURCE_DIR}/bench/tier_bench.cc)
  # SSD tier reads against a raw O_DIRECT pread loop (docs/tiers.md has figures).
  add_executable(nopfs_tier_bench ${PROJECT_SOURCE_DIR}/bench/tier_bench.cc)
  nopfs_target_defaults(nopfs_tier_bench)
  target_link_libraries(nopfs_tier_bench PRIVATE nopfs_tiers PkgConfig::XXHASH)
endif()
