# service/env.cmake: nopfsd's view of the PFS, and a fault-injecting one for tests (library nopfs_env).
# Included by service/CMakeLists.txt.
add_library(nopfs_env STATIC ${CMAKE_CURRENT_LIST_DIR}/env.cc)
nopfs_target_defaults(nopfs_env)
set_target_properties(nopfs_env PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(nopfs_env PUBLIC nopfs_common Threads::Threads)

nopfs_test(NAME env_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/env_test.cc LIBS nopfs_env)
