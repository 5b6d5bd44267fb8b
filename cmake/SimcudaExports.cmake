# Fails the build when a binary imports a CUDA runtime symbol that simcuda does not export:
# runs tests/simcuda/check_exports.py over the build tree after every binary that links the
# runtime was built.

function(arcpool_collect_binaries dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  set(found "")
  foreach(t ${targets})
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "EXECUTABLE" OR type STREQUAL "SHARED_LIBRARY" OR type STREQUAL "MODULE_LIBRARY")
      if(NOT t STREQUAL "simcuda")
        list(APPEND found ${t})
      endif()
    endif()
  endforeach()
  foreach(sub ${subdirs})
    arcpool_collect_binaries(${sub} more)
    list(APPEND found ${more})
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

find_package(Python3 REQUIRED COMPONENTS Interpreter)
arcpool_collect_binaries(${PROJECT_SOURCE_DIR} arcpool_binaries)
add_custom_target(simcuda_exports ALL
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/simcuda/check_exports.py
    $<TARGET_FILE:simcuda> ${PROJECT_BINARY_DIR}
  COMMENT "Checking that simcuda exports every CUDA runtime symbol the binaries import"
  VERBATIM)
add_dependencies(simcuda_exports simcuda ${arcpool_binaries})
