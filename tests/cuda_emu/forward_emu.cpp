// The forward kernels of src/cuda/forward.cu, compiled by the host compiler for the emulator
// (cuda_runtime.h in this directory).
#include "cuda/forward.cu"
