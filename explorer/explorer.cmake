# The explorer page (docs/explorer.md): explorer_api.cpp and the few library sources it needs, compiled
# to WebAssembly by Emscripten's em++ (Debian's `emscripten`), plus the static page, into
# ${CMAKE_BINARY_DIR}/explorer. ATTN_EXPLORER: AUTO (default: built when em++ is found), ON (required),
# OFF. Not a CMake toolchain of its own: em++ runs as custom commands, one object per source, so the
# native build and the page share one configure and `cmake --build` builds both.
set(ATTN_EXPLORER AUTO CACHE STRING "Build the explorer page with Emscripten: AUTO, ON or OFF")
set_property(CACHE ATTN_EXPLORER PROPERTY STRINGS AUTO ON OFF)
set(ATTN_EXPLORER_DIR ${CMAKE_BINARY_DIR}/explorer)

# Only with the CLI (the page runs its checks, `attn explore` serves it) and not in the sanitizer or
# fuzzing builds, which test the native code; the Python package's build (no tools) skips it too.
if(NOT ATTN_EXPLORER STREQUAL "OFF" AND ATTN_BUILD_TOOLS AND NOT ATTN_SANITIZE AND NOT ATTN_BUILD_FUZZERS)
  find_program(ATTN_EMXX em++)
  set(attn_explorer_build ${ATTN_EMXX})
endif()
if(ATTN_EXPLORER STREQUAL "ON" AND NOT attn_explorer_build)
  message(FATAL_ERROR "ATTN_EXPLORER=ON but em++ was not found (apt-get install emscripten), or the build "
                      "has no tools (ATTN_BUILD_TOOLS) or is instrumented (ATTN_SANITIZE, ATTN_BUILD_FUZZERS)")
endif()

if(attn_explorer_build)
  message(STATUS "attn: explorer page with ${ATTN_EMXX} -> ${ATTN_EXPLORER_DIR}")
  set(src ${PROJECT_SOURCE_DIR})
  # Only what the page computes: the traffic model and its counted schedules, the reference, tiled and
  # split-K paths of the CLI's checks, and the CLI's formatting. No decode, backward or varlen kernels.
  set(lib_sources src/io/io_model.cpp src/io/counted.cpp src/io/planning.cpp src/reference/reference.cpp
      src/validate/validate.cpp src/tiled/tiled.cpp src/tiled/tiled_kernel.cpp src/heuristics/cpu.cpp
      src/splitk/splitk.cpp src/cpu/dpbf16.cpp src/tiled/amx_kernel.cpp src/amx/amx.cpp src/amx/amx_emulator.cpp)
  set(own_sources tools/attn/checks.cpp tools/attn/format.cpp explorer/explorer_api.cpp)
  set(obj_dir ${CMAKE_BINARY_DIR}/explorer-obj)
  # The headers of Highway and nlohmann-json (both header-only here) without the rest of /usr/include,
  # whose glibc headers must not shadow Emscripten's libc.
  find_path(ATTN_HWY_INCLUDE hwy/highway.h REQUIRED)
  find_path(ATTN_JSON_INCLUDE nlohmann/json.hpp REQUIRED)
  file(MAKE_DIRECTORY ${obj_dir}/include)
  file(CREATE_LINK ${ATTN_HWY_INCLUDE}/hwy ${obj_dir}/include/hwy SYMBOLIC)
  file(CREATE_LINK ${ATTN_JSON_INCLUDE}/nlohmann ${obj_dir}/include/nlohmann SYMBOLIC)
  # Emscripten's JS optimiser needs node's acorn: Debian's node-acorn lives in /usr/share/nodejs, which
  # a node that is not Debian's (NodeSource's) does not search.
  set(em_env ${CMAKE_COMMAND} -E env NODE_PATH=/usr/share/nodejs)
  # One thread, no OpenMP (explorer/wasm/omp.h), EMU128 for the kernel (its only Highway target),
  # exceptions on so that a bad input reaches the page as the library's message.
  set(em_flags -std=c++20 -O2 -fexceptions -DHWY_COMPILE_ONLY_EMU128 -I${src}/explorer/wasm -I${src}/include
      -I${src}/src -I${src}/tools/attn -I${obj_dir}/include)
  set(objects "")
  foreach(f IN LISTS lib_sources own_sources)
    get_filename_component(name ${f} NAME_WE)
    set(o ${obj_dir}/${name}.o)
    set(extra -Wall -Wextra)
    if(f IN_LIST lib_sources)
      # Without OpenMP the kernels' thread-count parameters and cpu.cpp's sysconf helper go unused.
      list(APPEND extra -Wno-unused-parameter -Wno-unused-function)
    endif()
    add_custom_command(OUTPUT ${o}
      COMMAND ${em_env} ${ATTN_EMXX} ${em_flags} ${extra} -MD -MF ${o}.d -c ${src}/${f} -o ${o}
      DEPENDS ${src}/${f} DEPFILE ${o}.d
      COMMENT "em++ ${f}" VERBATIM)
    list(APPEND objects ${o})
  endforeach()
  set(page_files index.html explorer.js explorer.css)
  set(page_outputs "")
  foreach(f IN LISTS page_files)
    add_custom_command(OUTPUT ${ATTN_EXPLORER_DIR}/${f}
      COMMAND ${CMAKE_COMMAND} -E copy ${src}/explorer/${f} ${ATTN_EXPLORER_DIR}/${f}
      DEPENDS ${src}/explorer/${f} VERBATIM)
    list(APPEND page_outputs ${ATTN_EXPLORER_DIR}/${f})
  endforeach()
  set(exports _explorer_io,_explorer_sweep,_explorer_count,_explorer_tiled,_explorer_splitk,_explorer_decode)
  add_custom_command(OUTPUT ${ATTN_EXPLORER_DIR}/attn_explorer.js ${ATTN_EXPLORER_DIR}/attn_explorer.wasm
    COMMAND ${CMAKE_COMMAND} -E make_directory ${ATTN_EXPLORER_DIR}
    COMMAND ${em_env} ${ATTN_EMXX} -O2 -fexceptions ${objects} -sENVIRONMENT=web -sMODULARIZE=1
      -sEXPORT_NAME=createAttnModule -sALLOW_MEMORY_GROWTH=1 -sEXPORTED_FUNCTIONS=${exports}
      -sEXPORTED_RUNTIME_METHODS=ccall -o ${ATTN_EXPLORER_DIR}/attn_explorer.js
    DEPENDS ${objects} COMMENT "em++: linking the explorer (attn_explorer.wasm)" VERBATIM)
  add_custom_target(attn_explorer ALL
    DEPENDS ${ATTN_EXPLORER_DIR}/attn_explorer.js ${ATTN_EXPLORER_DIR}/attn_explorer.wasm ${page_outputs})
endif()
