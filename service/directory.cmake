# service/directory.cmake: the scalable peer directory (library nopfs_directory; directory.h,
# docs/algorithm.md §7). Included by service/CMakeLists.txt.
add_library(nopfs_directory STATIC ${CMAKE_CURRENT_LIST_DIR}/directory.cc
            ${CMAKE_CURRENT_LIST_DIR}/directory_wire.cc)
nopfs_target_defaults(nopfs_directory)
set_target_properties(nopfs_directory PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(nopfs_directory PUBLIC nopfs_common)

nopfs_test(NAME directory_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/directory_test.cc
           LIBS nopfs_directory Threads::Threads)

# dir::BuildDirectory over a real PeerLink::Exchange between nodes on loopback.
nopfs_test(NAME fabric_directory_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/directory_exchange_test.cc
           LIBS nopfs_fabric nopfs_directory TIMEOUT 120)
