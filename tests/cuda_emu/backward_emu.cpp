// The backward kernels of src/cuda/backward.cu, compiled by the host compiler for the emulator
// (cuda_runtime.h in this directory).
#include "cuda/backward.cu"
