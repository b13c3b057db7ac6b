# Compiler flags shared by every target, and nopfs_test(), the one way a test is registered.

set(NOPFS_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
    -Wunused -Woverloaded-virtual -Wdouble-promotion -Wformat=2
    -Wimplicit-fallthrough)
if(NOPFS_WERROR)
  list(APPEND NOPFS_WARNINGS -Werror)
endif()

if(NOPFS_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# Hardening, as Debian builds its packages (dpkg-buildflags with hardening=+all): stack protector
# (strong), _FORTIFY_SOURCE=2 where the code is optimized (glibc checks buffer sizes it can see),
# position-independent executables, and full RELRO (the relocations read-only after start, every
# symbol bound at load: -z relro -z now). The sanitizer and fuzz trees have their own
# instrumentation instead.
option(NOPFS_HARDEN "Build with the distribution's hardening flags (not in the sanitizer or fuzz tree)"
       ON)
if(NOPFS_HARDEN AND NOT NOPFS_SANITIZE AND NOT NOPFS_FUZZ)
  add_compile_options(-fstack-protector-strong
                      "$<$<NOT:$<CONFIG:Debug>>:-D_FORTIFY_SOURCE=2>")
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  include(CheckPIESupported)
  check_pie_supported()
  add_link_options(-Wl,-z,relro -Wl,-z,now)
endif()

find_package(Threads REQUIRED)

# nopfs_target_defaults(target): warnings and include root for a project target.
function(nopfs_target_defaults target)
  target_compile_options(${target} PRIVATE ${NOPFS_WARNINGS})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()

if(NOPFS_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
  include(GoogleTest)
endif()

# nopfs_test(NAME name SOURCES a_test.cc ... LIBS lib ... [LABELS unit|integration ...]
#            [TIMEOUT seconds])
# Builds one GoogleTest binary and registers each of its tests with ctest. Tests are labelled
# "unit" by default; ctest -L unit runs those alone (the sanitizer build does at least that).
function(nopfs_test)
  if(NOT NOPFS_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  nopfs_target_defaults(${T_NAME})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  gtest_discover_tests(${T_NAME}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "NOPFS_SOURCE_DIR=${PROJECT_SOURCE_DIR};NOPFS_BINARY_DIR=${PROJECT_BINARY_DIR}"
    DISCOVERY_TIMEOUT 60)
endfunction()
