# The Debian package (docs/operations.md, section 1): scripts/package.sh configures a build with
# -DSWITCHML_PACKAGE=ON -DCMAKE_INSTALL_PREFIX=/usr -DSWITCHML_BUILD_SHARED=ON and runs CPack.
#
# With SWITCHML_PACKAGE on, `install` also puts in place: the switch's systemd unit and its
# /etc/default file, the docs, an example drop-in for kernel-bypass transports, and man pages
# made from each command's --help by help2man; and CPack makes switchml_<version>_amd64.deb
# whose Depends are dpkg-shlibdeps' reading of the binaries plus what the Python module and the
# maintainer scripts need.
option(SWITCHML_PACKAGE "Install the service, docs and man pages, and set up CPack's DEB (scripts/package.sh)" OFF)
if(NOT SWITCHML_PACKAGE)
  return()
endif()
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(FATAL_ERROR "SWITCHML_PACKAGE needs -DCMAKE_INSTALL_PREFIX=/usr (a Debian package "
                      "installs there; scripts/package.sh sets it)")
endif()

# The unit goes where Debian 12's systemd packages put theirs.
install(FILES ${PROJECT_SOURCE_DIR}/packaging/switchml-switch.service
  DESTINATION lib/systemd/system)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/switchml-switch.default
  DESTINATION /etc/default RENAME switchml-switch)
set(switchml_doc_dir ${CMAKE_INSTALL_DATAROOTDIR}/doc/switchml)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${switchml_doc_dir})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${switchml_doc_dir}
  FILES_MATCHING PATTERN "*.md" PATTERN "bench" EXCLUDE)  # (not the benchmark runs' files)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/packaging/examples/ DESTINATION ${switchml_doc_dir}/examples)

# Man pages: switchml(1) and switchml-<command>(1), from the built binary's --help.
find_program(HELP2MAN help2man REQUIRED)
set(switchml_man_dir ${PROJECT_BINARY_DIR}/man)
set(switchml_man_pages)
foreach(command IN ITEMS "" switch worker run status sim)
  if(command STREQUAL "")
    set(page switchml)
    set(summary "in-network aggregation for distributed machine learning")
  else()
    set(page switchml-${command})
    set(summary "switchml ${command} (see switchml(1))")
  endif()
  add_custom_command(OUTPUT ${switchml_man_dir}/${page}.1.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${switchml_man_dir}
    COMMAND bash ${PROJECT_SOURCE_DIR}/packaging/man_page.sh ${HELP2MAN} $<TARGET_FILE:switchml>
            "${command}" "${summary}" ${PROJECT_VERSION} ${switchml_man_dir}/${page}.1.gz
    DEPENDS switchml ${PROJECT_SOURCE_DIR}/packaging/man_page.sh
    COMMENT "Man page ${page}(1) from --help"
    VERBATIM)
  list(APPEND switchml_man_pages ${switchml_man_dir}/${page}.1.gz)
endforeach()
add_custom_target(switchml_man ALL DEPENDS ${switchml_man_pages})
install(FILES ${switchml_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME switchml)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "switchml maintainers <switchml@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "SwitchML: in-network aggregation (all-reduce through a switch) for distributed ML")
set(CPACK_PACKAGE_DESCRIPTION
  "The switchml command (a software switch, its workers, status and a simulator), the worker
library with its headers, CMake and pkg-config files, the Python module (with a
torch.distributed backend) for Debian's python3, and the switch as a systemd service.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # switchml_<version>_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The Python extensions find libswitchml_bindings.so beside them ($ORIGIN).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
  ${CMAKE_INSTALL_PREFIX}/${SWITCHML_PYTHON_INSTALL_DIR}/switchml)
# Beyond the libraries: the Python module's interpreter and packages, and the maintainer
# scripts' adduser.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3, python3-numpy, python3-torch, adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/packaging/debian/postinst
  ${PROJECT_SOURCE_DIR}/packaging/debian/prerm
  ${PROJECT_SOURCE_DIR}/packaging/debian/postrm
  ${PROJECT_SOURCE_DIR}/packaging/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
include(CPack)
