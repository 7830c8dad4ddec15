# The `dev` install component: dlop's C++ libraries, their public headers and
# an exported CMake package, so that another project can
#   find_package(dlop REQUIRED)
#   target_link_libraries(app PRIVATE dlop::scheduler)
# against `cmake --install build --component dev --prefix PREFIX`. The
# Makefile's `--component bin` install (executables only) is unaffected.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Library target -> its name after dlop:: (lowest layer first).
set(DLOP_EXPORTED_LIBRARIES dlop_core core dlop_transport transport dlop_collectives collectives
                            dlop_scheduler scheduler dlop_media media dlop_offload offload)

set(dlop_export_targets dlop_options)  # linked privately (LINK_ONLY): its link options travel with static libraries
set_target_properties(dlop_options PROPERTIES EXPORT_NAME options)
while(DLOP_EXPORTED_LIBRARIES)
  list(POP_FRONT DLOP_EXPORTED_LIBRARIES target name)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  # The layers name their include folders as build-tree paths; an installed
  # package finds the same headers under include/ instead.
  get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  if(dirs)
    list(TRANSFORM dirs REPLACE "^(.+)$" "$<BUILD_INTERFACE:\\1>")
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
                          "${dirs};$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
  endif()
  list(APPEND dlop_export_targets ${target})
endwhile()

install(TARGETS ${dlop_export_targets} EXPORT dlopTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
set(DLOP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dlop)
# The MPI bootstrap is an optional component: its own export set, which the
# package loads only where MPI is found (FindMPI needs the C language).
if(TARGET dlop_transport_mpi)
  set_target_properties(dlop_transport_mpi PROPERTIES EXPORT_NAME transport_mpi)
  install(TARGETS dlop_transport_mpi EXPORT dlopMPITargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
  install(EXPORT dlopMPITargets NAMESPACE dlop:: DESTINATION ${DLOP_CMAKE_DIR} COMPONENT dev)
endif()
foreach(layer core transport collectives scheduler media offload)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
endforeach()
install(DIRECTORY ${PROJECT_BINARY_DIR}/core/generated/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)

install(EXPORT dlopTargets NAMESPACE dlop:: DESTINATION ${DLOP_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/dlopConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cmake/dlopConfig.cmake INSTALL_DESTINATION ${DLOP_CMAKE_DIR})
# 0.x: a new minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/dlopConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/dlopConfig.cmake ${PROJECT_BINARY_DIR}/cmake/dlopConfigVersion.cmake
        DESTINATION ${DLOP_CMAKE_DIR} COMPONENT dev)
