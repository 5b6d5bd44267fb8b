# arcpool_add_test(<name> SOURCES <files...> [LIBRARIES <targets...>] [LABELS <labels...>])
# One GoogleTest executable, registered with CTest test by test (gtest_discover_tests).
include(GoogleTest)

function(arcpool_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBRARIES;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE arcpool_test_support ${ARG_LIBRARIES})
  arcpool_target_flags(${name})
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT 120)
endfunction()
