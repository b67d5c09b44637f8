# Context parallelism over MPI (option ATTN_MPI, default AUTO: built when MPI is found): the library
# attn_mpi (alias attn::attn_mpi) with include/attn/distributed.hpp, and its tests under mpirun
# (tests/mpi/). The per-rank arithmetic (ring_block.cpp) needs no MPI and lives in libattn itself.
# docs/distributed.md.
set(ATTN_MPI AUTO CACHE STRING "Build the MPI part (attn_mpi): AUTO (when MPI is found), ON, OFF")
set_property(CACHE ATTN_MPI PROPERTY STRINGS AUTO ON OFF)
set(ATTN_HAS_MPI OFF)
if(ATTN_MPI STREQUAL "ON")
  find_package(MPI REQUIRED COMPONENTS CXX)
elseif(ATTN_MPI STREQUAL "AUTO")
  find_package(MPI QUIET COMPONENTS CXX)
endif()
if(MPI_CXX_FOUND AND NOT ATTN_MPI STREQUAL "OFF")
  set(ATTN_HAS_MPI ON)
  add_library(attn_mpi
    src/distributed/collective.cpp
    src/distributed/ring.cpp
    src/distributed/ring_backward.cpp
    src/distributed/sharded_decode.cpp)
  add_library(attn::attn_mpi ALIAS attn_mpi)
  target_include_directories(attn_mpi PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  set_target_properties(attn_mpi PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(attn_mpi PUBLIC attn MPI::MPI_CXX PRIVATE OpenMP::OpenMP_CXX)
  target_compile_options(attn_mpi PRIVATE -Wall -Wextra)
  set(ATTN_MPI_TARGETS attn_mpi)  # installed and exported with attn (attnConfig finds MPI)
  message(STATUS "attn: MPI found (${MPIEXEC_EXECUTABLE}): building attn_mpi")
else()
  message(STATUS "attn: MPI not built (ATTN_MPI=${ATTN_MPI}); the distributed tests report skipped")
endif()
