# The embeddable worker library and its installation.
#
# switchml_library (output name libswitchml, alias switchml::switchml) is one library made of the
# objects of switchml_runtime and every switchml_* module it links, so that a second program
# links one library: static by default, shared with -DSWITCHML_BUILD_SHARED=ON. Its usage
# requirements are the public headers (include/switchml/) and, for the static library, the
# external libraries the modules link (gRPC, protobuf, Highway, threads).
#
# Installed: the library, include/switchml/*.h, lib/cmake/switchml/ (find_package(switchml)
# gives the imported target switchml::switchml) and lib/pkgconfig/switchml.pc.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Collects the switchml_* targets that `target` links, transitively (into ${internal_var}), and
# the other libraries they link (into ${external_var}).
function(switchml_link_closure target internal_var external_var)
  set(internal ${target})
  set(external)
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue t)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(deps ${t} INTERFACE_LINK_LIBRARIES)
    else()
      get_target_property(deps ${t} LINK_LIBRARIES)
    endif()
    foreach(dep IN LISTS deps)
      if(NOT dep OR dep MATCHES "^\\$<")
        continue()
      endif()
      if(TARGET ${dep} AND dep MATCHES "^switchml_")
        if(NOT dep IN_LIST internal)
          list(APPEND internal ${dep})
          list(APPEND queue ${dep})
        endif()
      elseif(NOT dep IN_LIST external)
        list(APPEND external ${dep})
      endif()
    endforeach()
  endwhile()
  set(${internal_var} ${internal} PARENT_SCOPE)
  set(${external_var} ${external} PARENT_SCOPE)
endfunction()

# switchml_combined_library(NAME name TYPE STATIC|SHARED ROOTS target...)
#   One library of the objects of the roots and every switchml_* module they link; it links the
#   other libraries those modules link (PUBLIC for a static library, PRIVATE for a shared one).
#   A shared one exports only what the modules mark SWITCHML_EXPORT (they are built with hidden
#   visibility; include/switchml/export.h) and nothing outside namespace switchml.
#   Sets <name>_EXTERNAL_LIBS in the caller's scope.
function(switchml_combined_library)
  cmake_parse_arguments(ARG "" "NAME;TYPE" "ROOTS" ${ARGN})
  set(modules)
  set(external)
  foreach(root IN LISTS ARG_ROOTS)
    switchml_link_closure(${root} m e)
    list(APPEND modules ${m})
    list(APPEND external ${e})
  endforeach()
  list(REMOVE_DUPLICATES modules)
  list(REMOVE_DUPLICATES external)
  # Imported targets that a module's directory found (e.g. hwy::hwy) are visible there only.
  foreach(lib IN LISTS external)
    if(lib MATCHES "^([A-Za-z0-9_]+)::" AND NOT TARGET ${lib})
      find_package(${CMAKE_MATCH_1} REQUIRED)
    endif()
  endforeach()
  set(objects)
  foreach(m IN LISTS modules)
    get_target_property(type ${m} TYPE)
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      list(APPEND objects $<TARGET_OBJECTS:${m}>)
    endif()
  endforeach()
  add_library(${ARG_NAME} ${ARG_TYPE} ${objects})
  add_dependencies(${ARG_NAME} ${modules})
  if(ARG_TYPE STREQUAL "SHARED")
    target_link_libraries(${ARG_NAME} PRIVATE ${external})
    # Exports namespace switchml's default-visibility symbols only (cmake/switchml_exports.map).
    set(map ${PROJECT_SOURCE_DIR}/cmake/switchml_exports.map)
    target_link_options(${ARG_NAME} PRIVATE "LINKER:--version-script=${map}")
    set_target_properties(${ARG_NAME} PROPERTIES LINK_DEPENDS ${map} CXX_VISIBILITY_PRESET hidden
      VISIBILITY_INLINES_HIDDEN ON)
  else()
    target_link_libraries(${ARG_NAME} PUBLIC ${external})
  endif()
  set(${ARG_NAME}_EXTERNAL_LIBS ${external} PARENT_SCOPE)
endfunction()

if(SWITCHML_BUILD_SHARED)
  switchml_combined_library(NAME switchml_library TYPE SHARED ROOTS switchml_runtime)
else()
  switchml_combined_library(NAME switchml_library TYPE STATIC ROOTS switchml_runtime)
endif()
set(switchml_external_libs ${switchml_library_EXTERNAL_LIBS})
add_library(switchml::switchml ALIAS switchml_library)
set_target_properties(switchml_library PROPERTIES OUTPUT_NAME switchml EXPORT_NAME switchml
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
target_include_directories(switchml_library PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(switchml_library PUBLIC cxx_std_17)  # the public headers need C++17

install(TARGETS switchml_library EXPORT switchmlTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/switchml DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT switchmlTargets NAMESPACE switchml:: FILE switchmlTargets.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/switchml)

# What the config file must find again for a static library's consumers: the imported targets
# the modules link, by the package or pkg-config module that makes each.
set(SWITCHML_STATIC_DEPENDENCIES "")
set(SWITCHML_PC_REQUIRES_PRIVATE "")
if(NOT SWITCHML_BUILD_SHARED)
  foreach(lib IN LISTS switchml_external_libs)
    if(lib STREQUAL "Threads::Threads")
      string(APPEND SWITCHML_STATIC_DEPENDENCIES "find_dependency(Threads)\n")
    elseif(lib STREQUAL "hwy::hwy")
      string(APPEND SWITCHML_STATIC_DEPENDENCIES "find_dependency(hwy)\n")
      string(APPEND SWITCHML_PC_REQUIRES_PRIVATE " libhwy")
    elseif(lib STREQUAL "PkgConfig::GRPCPP")
      string(APPEND SWITCHML_STATIC_DEPENDENCIES "switchml_pkg_module(GRPCPP grpc++)\n")
      string(APPEND SWITCHML_PC_REQUIRES_PRIVATE " grpc++")
    elseif(lib STREQUAL "PkgConfig::PROTOBUF")
      string(APPEND SWITCHML_STATIC_DEPENDENCIES "switchml_pkg_module(PROTOBUF protobuf)\n")
      string(APPEND SWITCHML_PC_REQUIRES_PRIVATE " protobuf")
    elseif(lib STREQUAL "PkgConfig::LIBXDP")  # the AF_XDP transport
      string(APPEND SWITCHML_STATIC_DEPENDENCIES "switchml_pkg_module(LIBXDP libxdp)\n")
      string(APPEND SWITCHML_PC_REQUIRES_PRIVATE " libxdp")
    elseif(lib STREQUAL "PkgConfig::DPDK")  # the DPDK transport
      string(APPEND SWITCHML_STATIC_DEPENDENCIES "switchml_pkg_module(DPDK libdpdk)\n")
      string(APPEND SWITCHML_PC_REQUIRES_PRIVATE " libdpdk")
    elseif(lib STREQUAL "PkgConfig::SODIUM")  # the authenticated data plane
      string(APPEND SWITCHML_STATIC_DEPENDENCIES "switchml_pkg_module(SODIUM libsodium)\n")
      string(APPEND SWITCHML_PC_REQUIRES_PRIVATE " libsodium")
    elseif(lib STREQUAL "PkgConfig::LIBBPF")
      string(APPEND SWITCHML_STATIC_DEPENDENCIES "switchml_pkg_module(LIBBPF libbpf)\n")
      string(APPEND SWITCHML_PC_REQUIRES_PRIVATE " libbpf")
    else()
      message(WARNING "switchml: the installed static library links ${lib}; teach "
                      "cmake/SwitchmlInstall.cmake how its consumers find it")
    endif()
  endforeach()
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/switchmlConfig.cmake.in
  ${PROJECT_BINARY_DIR}/switchmlConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/switchml)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/switchmlConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/switchmlConfig.cmake
  ${PROJECT_BINARY_DIR}/switchmlConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/switchml)

file(RELATIVE_PATH SWITCHML_PC_PREFIX_FROM_PCDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" SWITCHML_PC_PREFIX_FROM_PCDIR "${SWITCHML_PC_PREFIX_FROM_PCDIR}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/switchml.pc.in ${PROJECT_BINARY_DIR}/switchml.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/switchml.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The shared library's exports, checked in every build with tests (tests/exported_symbols_test.sh):
# where the installed library is static, a shared copy is built for the check (not installed),
# and examples/allreduce is linked against it and run (--help: the library loads and every
# symbol the program needs is there; install_test runs the example against a switch).
if(SWITCHML_BUILD_TESTS)
  if(SWITCHML_BUILD_SHARED)
    set(switchml_shared_target switchml_library)
  else()
    switchml_combined_library(NAME switchml_shared_check TYPE SHARED ROOTS switchml_runtime)
    set_target_properties(switchml_shared_check PROPERTIES OUTPUT_NAME switchml
      LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/shared_check)
    target_include_directories(switchml_shared_check PUBLIC ${PROJECT_SOURCE_DIR}/include)
    set(switchml_shared_target switchml_shared_check)
  endif()
  file(GLOB switchml_public_headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/switchml/*.h)
  list(TRANSFORM switchml_public_headers PREPEND "switchml:" OUTPUT_VARIABLE switchml_public_api)
  add_executable(allreduce_example_shared ${PROJECT_SOURCE_DIR}/examples/allreduce/main.cc)
  target_link_libraries(allreduce_example_shared PRIVATE ${switchml_shared_target})
  add_test(NAME exported_symbols_test
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/exported_symbols_test.sh
            $<TARGET_FILE:${switchml_shared_target}> ${switchml_public_api})
  add_test(NAME shared_library_link_test COMMAND allreduce_example_shared --help)
  set_tests_properties(exported_symbols_test shared_library_link_test PROPERTIES TIMEOUT 60)
endif()

# An embedding program's view, in CI: install into a temporary prefix, check the public headers,
# build examples/allreduce with find_package and pkg-config and run it against a switch.
if(SWITCHML_BUILD_TESTS)
  add_test(NAME install_test
    COMMAND bash ${PROJECT_SOURCE_DIR}/examples/install_test.sh ${PROJECT_BINARY_DIR}
            $<TARGET_FILE:switchml>)
  # Most of its time is pkg-config (pkgconf) walking grpc++'s abseil graph, about 1 CPU-s per
  # call: find_package(switchml) makes some 20 such calls, the pkg-config build a few more. On
  # the 2-core machine at load 9 the whole test took 233 s (the example's configure 150 s), so
  # a loaded CI run came near 300 s.
  set_tests_properties(install_test PROPERTIES TIMEOUT 900)
endif()
