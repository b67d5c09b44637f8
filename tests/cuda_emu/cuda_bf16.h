// The emulation target's stand-in for CUDA's cuda_bf16.h: the 16-bit conversions the kernels need come
// from emu_ptx.hpp (attn's own, tested ones), so this only brings in the emulated runtime.
#pragma once

#include "cuda_runtime.h"
