# Installation: the libraries, the public headers, a relocatable CMake package and a pkg-config
# file. `cmake --install build --prefix P` then find_package(arcpool CONFIG REQUIRED) with
# CMAKE_PREFIX_PATH=P.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS arcpool arcpool_static
  EXPORT arcpoolTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/arcpool DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT arcpoolTargets
  NAMESPACE arcpool::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/arcpool)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/arcpoolConfig.cmake.in
  ${PROJECT_BINARY_DIR}/arcpoolConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/arcpool)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/arcpoolConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/arcpoolConfig.cmake
              ${PROJECT_BINARY_DIR}/arcpoolConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/arcpool)
# Newer CMake may give several include directories: one -I each.
list(JOIN CUDAToolkit_INCLUDE_DIRS " -I" ARCPOOL_PC_CUDA_INCLUDES)
configure_file(${PROJECT_SOURCE_DIR}/cmake/arcpool.pc.in ${PROJECT_BINARY_DIR}/arcpool.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/arcpool.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
