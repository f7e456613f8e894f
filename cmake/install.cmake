# The installable library: one target, refit::refit, for programs that
# publish or receive versions (also from many trainer ranks) or use the
# file codec through the public headers (include/refit/*.h).
# `cmake --install <build> --component dev` puts the headers, the static
# layers behind them and a CMake package into the prefix, so that
#
#   find_package(refit REQUIRED)
#   target_link_libraries(app PRIVATE refit::refit)
#
# works (tests/install builds such a program). The layers stay separate
# static libraries; refit::refit links them all.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(REFIT_INSTALLED_LAYERS refit_base refit_format refit_codec refit_delta refit_layout
                           refit_trainer refit_transport refit_sync refit_ranks)
# (`refit` itself names the command-line tool's target.)
add_library(refit_library INTERFACE)
add_library(refit::refit ALIAS refit_library)
set_target_properties(refit_library PROPERTIES EXPORT_NAME refit)
target_link_libraries(refit_library INTERFACE ${REFIT_INSTALLED_LAYERS})
target_include_directories(refit_library INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS refit_library ${REFIT_INSTALLED_LAYERS} EXPORT refitTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/refit
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
install(EXPORT refitTargets NAMESPACE refit:: FILE refitTargets.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/refit COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/refitConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/refitConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/refit)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/refitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/refitConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/refitConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/refit COMPONENT dev)
