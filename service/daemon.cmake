# service/daemon.cmake: nopfsd itself — the sample reader, staging streams, the daemon that puts
# the parts together, the run directory, and the nopfsd program. Included by
# service/CMakeLists.txt.
find_package(spdlog CONFIG REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

add_library(nopfs_rundir STATIC ${CMAKE_CURRENT_LIST_DIR}/run_dir.cc)
nopfs_target_defaults(nopfs_rundir)
target_link_libraries(nopfs_rundir PUBLIC nopfs_launch nopfs_common)

add_library(nopfs_daemon STATIC
  ${CMAKE_CURRENT_LIST_DIR}/sample_reader.cc
  ${CMAKE_CURRENT_LIST_DIR}/staging.cc
  ${CMAKE_CURRENT_LIST_DIR}/daemon.cc
  ${CMAKE_CURRENT_LIST_DIR}/peers.cc
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cc
)
nopfs_target_defaults(nopfs_daemon)
target_link_libraries(nopfs_daemon
  PUBLIC nopfs_catalog nopfs_tiers nopfs_server nopfs_wire nopfs_lua nopfs_policy nopfs_rundir
         nopfs_fabric nopfs_directory
         nopfs_common spdlog::spdlog
  PRIVATE PkgConfig::XXHASH)

add_executable(nopfsd ${CMAKE_CURRENT_LIST_DIR}/nopfsd_main.cc)
nopfs_target_defaults(nopfsd)
target_link_libraries(nopfsd PRIVATE nopfs_daemon nopfs_launch_flags nopfs_launch)

nopfs_test(NAME sample_reader_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/sample_reader_test.cc
  LIBS nopfs_daemon)

if(NOPFS_BUILD_TESTS)
  # nopfsd end to end through `nopfs run` and `nopfs cat` (tests/service/service_test.py).
  add_test(NAME service_test
    COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/service/service_test.py
            ${PROJECT_BINARY_DIR}/bin)
  set_tests_properties(service_test PROPERTIES LABELS "integration;service" TIMEOUT 900)
  # Several nopfsd of one job serving each other over libfabric (tests/fabric/fabric_test.py).
  add_test(NAME fabric_test
    COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/fabric/fabric_test.py
            ${PROJECT_BINARY_DIR}/bin)
  set_tests_properties(fabric_test PROPERTIES LABELS "integration;fabric" TIMEOUT 600)
endif()
nopfs_test(NAME daemon_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/daemon_test.cc
  LIBS nopfs_daemon nopfs_client)

# The client's batch calls against a real nopfsd (here: client/ does not depend on service/).
nopfs_test(NAME client_batch_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/client_batch_test.cc
  LIBS nopfs_daemon nopfs_client LABELS integration)
