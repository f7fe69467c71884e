# Debian's libcaf-dev (CAF 0.17.6) ships no CMake config: this module makes the
# imported targets CAF::core, CAF::io and CAF::openssl from the installed libraries.
find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE_LIBRARY caf_core)
find_library(CAF_IO_LIBRARY caf_io)
find_library(CAF_OPENSSL_LIBRARY caf_openssl)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY
                                  CAF_IO_LIBRARY CAF_OPENSSL_LIBRARY)
if(CAF_FOUND AND NOT TARGET CAF::core)
  find_package(Threads REQUIRED)
  add_library(CAF::core UNKNOWN IMPORTED)
  set_target_properties(CAF::core PROPERTIES IMPORTED_LOCATION ${CAF_CORE_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR}
    INTERFACE_LINK_LIBRARIES Threads::Threads)
  add_library(CAF::io UNKNOWN IMPORTED)
  set_target_properties(CAF::io PROPERTIES IMPORTED_LOCATION ${CAF_IO_LIBRARY}
    INTERFACE_LINK_LIBRARIES CAF::core)
  add_library(CAF::openssl UNKNOWN IMPORTED)
  set_target_properties(CAF::openssl PROPERTIES IMPORTED_LOCATION ${CAF_OPENSSL_LIBRARY}
    INTERFACE_LINK_LIBRARIES CAF::io)
endif()
