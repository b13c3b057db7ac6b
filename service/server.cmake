# service/server.cmake: the local UNIX-socket server (library nopfs_server). Included by
# service/CMakeLists.txt. nopfs_wire and nopfs_client are defined in client/CMakeLists.txt, which
# is added after service/; CMake resolves target names at generate time, so naming them here works.
find_package(spdlog CONFIG REQUIRED)

add_library(nopfs_server STATIC ${CMAKE_CURRENT_LIST_DIR}/local_server.cc)
nopfs_target_defaults(nopfs_server)
set_target_properties(nopfs_server PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(nopfs_server
  PUBLIC nopfs_wire nopfs_common Threads::Threads
  PRIVATE spdlog::spdlog)

nopfs_test(NAME local_server_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/local_server_test.cc
  LIBS nopfs_server nopfs_client)
if(TARGET local_server_test)
  # The end-to-end test runs the C API program against a live server.
  add_dependencies(local_server_test nopfs_c_api_test)
endif()
