// OpenMP for the explorer's WebAssembly build, which runs on one thread (no -fopenmp, so every
// `#pragma omp` is ignored): the few runtime calls the kernels make, answered for a team of one.
#pragma once

inline int omp_get_thread_num() { return 0; }
inline int omp_get_num_threads() { return 1; }
inline int omp_get_max_threads() { return 1; }
inline int omp_in_parallel() { return 0; }
