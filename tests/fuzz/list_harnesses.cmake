# Prints the harness names, one per line: cmake -P tests/fuzz/list_harnesses.cmake
include(${CMAKE_CURRENT_LIST_DIR}/harnesses.cmake)
foreach(h IN LISTS AREAL_FUZZ_HARNESSES)
  message("${h}")
endforeach()
