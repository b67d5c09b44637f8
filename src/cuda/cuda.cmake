# The CUDA backend (docs/cuda.md). Included from the top-level CMakeLists.txt after the attn target.
#   ATTN_CUDA=AUTO (default): on when CMake finds nvcc (check_language), except in sanitizer and fuzzer
#   builds (device code is not instrumented, and CI would compile it twice more); ON: required; OFF.
# Architectures: CMAKE_CUDA_ARCHITECTURES, default 80-real;90-real (A100, H100/H200 machine code).
set(ATTN_CUDA AUTO CACHE STRING "CUDA backend: AUTO (on when nvcc is found), ON or OFF")
set_property(CACHE ATTN_CUDA PROPERTY STRINGS AUTO ON OFF)
set(ATTN_WITH_CUDA OFF)
if(ATTN_CUDA STREQUAL "AUTO")
  if(ATTN_SANITIZE OR ATTN_BUILD_FUZZERS)
    message(STATUS "attn: CUDA backend off (AUTO) in sanitizer/fuzzer builds")
  else()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(ATTN_WITH_CUDA ON)
    else()
      message(STATUS "attn: CUDA backend off (AUTO): no CUDA compiler found")
    endif()
  endif()
elseif(ATTN_CUDA)
  set(ATTN_WITH_CUDA ON)
endif()

if(ATTN_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real)
  endif()
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "attn: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
  # One translation unit per kernel family, so -j2 compiles them side by side. An object library whose
  # objects go into attn itself: the launchers call attn's validation, and attn's users see one library.
  add_library(attn_cuda OBJECT
    ${PROJECT_SOURCE_DIR}/src/cuda/forward.cu
    ${PROJECT_SOURCE_DIR}/src/cuda/decode.cu
    ${PROJECT_SOURCE_DIR}/src/cuda/backward.cu
    ${PROJECT_SOURCE_DIR}/src/cuda/cuda_api.cpp)
  # The device code is C++17: CMake 3.25 does not know nvcc 13's CUDA20 dialect.
  # Directory-wide flags (sanitizers) are for the host compiler; nvcc rejects them.
  set_property(TARGET attn_cuda PROPERTY COMPILE_OPTIONS "")
  target_include_directories(attn_cuda PRIVATE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>)
  target_compile_options(attn_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xptxas=-warn-spills -lineinfo>
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  target_link_libraries(attn_cuda PRIVATE CUDA::cudart)
  # The shared runtime everywhere (CMake's default for CUDA targets is the static one, which would give
  # a program two runtimes once it links CUDA::cudart itself).
  set_target_properties(attn_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
    CUDA_RUNTIME_LIBRARY Shared)
  target_sources(attn PRIVATE $<TARGET_OBJECTS:attn_cuda>)
  # attn was created before CUDA was enabled: give it the CUDA properties its device-code objects need
  # (without them a fresh configure fails: empty CUDA_ARCHITECTURES, and CUDA20 from CMAKE_CXX_STANDARD).
  set_target_properties(attn PROPERTIES CUDA_RUNTIME_LIBRARY Shared CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
    CUDA_STANDARD 17)
  # Link-only and interface-only: attn's own C++ sources then compile with exactly the commands of a
  # build without CUDA (the Python package's), so that ccache serves one from the other (Makefile).
  target_link_libraries(attn PRIVATE $<LINK_ONLY:CUDA::cudart>)
  target_compile_definitions(attn INTERFACE ATTN_HAS_CUDA)
endif()

# The GPU benchmark (bench/gpu/, run by scripts/gpu-check). ATTN_GPU_VARIANTS=ON also compiles the kernel
# configurations of bench/gpu/variants.hpp into it (attn_gpu_bench --variants); off by default, so CI
# does not compile them with nvcc (test_cuda_variants_emulated compiles and checks them on the CPU).
option(ATTN_GPU_VARIANTS "Compile the kernel variants into attn_gpu_bench (--variants)" OFF)
if(ATTN_WITH_CUDA)
  add_executable(attn_gpu_bench ${PROJECT_SOURCE_DIR}/bench/gpu/attn_gpu_bench.cpp)
  target_link_libraries(attn_gpu_bench PRIVATE attn CUDA::cudart)
  if(ATTN_GPU_VARIANTS)
    target_sources(attn_gpu_bench PRIVATE ${PROJECT_SOURCE_DIR}/bench/gpu/variants.cu)
    target_include_directories(attn_gpu_bench PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/bench)
    target_compile_definitions(attn_gpu_bench PRIVATE ATTN_GPU_VARIANTS)
    target_compile_options(attn_gpu_bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xptxas=-warn-spills>)
    set_target_properties(attn_gpu_bench PROPERTIES CUDA_STANDARD 17 CUDA_RUNTIME_LIBRARY Shared)
  endif()
endif()
