# refit_module(NAME name SOURCES ... DEPS ... [TESTS ...])
#
# Declares one layer of the library as a static target `refit_<name>` that
# may use exactly the targets listed in DEPS (see README.md, Layout).
# Unit tests listed in TESTS sit next to the code and are linked into one
# test binary per module.
#
# src/ is a private include path: a layer's own sources and tests see it, a
# program linking the layers (or refit::refit) sees include/ alone. Code
# outside the library that still needs private headers (the command-line
# tool, the Python module, benchmarks, fuzzers, tests) links refit_internal,
# which says so.
add_library(refit_internal INTERFACE)
target_include_directories(refit_internal INTERFACE ${PROJECT_SOURCE_DIR}/src)

function(refit_module)
  cmake_parse_arguments(M "" "NAME" "SOURCES;DEPS;TESTS" ${ARGN})
  set(target refit_${M_NAME})
  add_library(${target} STATIC ${M_SOURCES})
  target_include_directories(${target}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${target} PUBLIC ${M_DEPS})
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(REFIT_BUILD_TESTS AND M_TESTS)
    add_executable(${target}_test ${M_TESTS})
    target_link_libraries(${target}_test PRIVATE ${target} refit_internal refit_testing
                          GTest::gtest GTest::gtest_main GTest::gmock)
    gtest_discover_tests(${target}_test DISCOVERY_TIMEOUT 60 TEST_PREFIX "${M_NAME}."
      PROPERTIES ENVIRONMENT "REFIT_FIXTURES_DIR=${REFIT_FIXTURES_DIR}"
                 TIMEOUT 300)
  endif()
endfunction()
