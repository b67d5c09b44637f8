// The decode kernels of src/cuda/decode.cu, compiled by the host compiler for the emulator
// (cuda_runtime.h in this directory).
#include "cuda/decode.cu"
