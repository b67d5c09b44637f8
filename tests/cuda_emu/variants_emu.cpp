// The benchmark's kernel variants (bench/gpu/variants.cu), compiled by the host compiler for the
// emulator (cuda_runtime.h in this directory).
#include "gpu/variants.cu"
