# service/catalog.cmake: the dataset catalog, scanned once and kept in RocksDB (library
# nopfs_catalog). Included by service/CMakeLists.txt after env.cmake.
find_package(RocksDB CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

add_library(nopfs_catalog STATIC
  ${CMAKE_CURRENT_LIST_DIR}/catalog.cc
  ${CMAKE_CURRENT_LIST_DIR}/catalog_codec.cc
  ${CMAKE_CURRENT_LIST_DIR}/catalog_scan.cc
)
nopfs_target_defaults(nopfs_catalog)
set_target_properties(nopfs_catalog PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(nopfs_catalog
  PUBLIC nopfs_env nopfs_policy nopfs_common Threads::Threads
  PRIVATE RocksDB::rocksdb-shared PkgConfig::XXHASH spdlog::spdlog)

nopfs_test(NAME catalog_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/catalog_test.cc
  LIBS nopfs_catalog PkgConfig::XXHASH)
