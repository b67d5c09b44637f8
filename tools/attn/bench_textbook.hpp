// The textbook attention baseline of `attn bench prefill`: OpenBLAS sgemm for S = Q K^T, a vectorised
// row softmax, sgemm for O = P V. Bench-only code (OpenBLAS is linked into the CLI, never libattn).
#pragma once

#include <cstdint>

namespace attn::cli {

// q [seq_q, heads, d], k and v [seq_k, kv_heads, d], out [seq_q, heads, d], all f32 dense (batch 1).
// Per head, per block of query rows (so S never exceeds 64 MiB): S = scale Q K^T, softmax (causal
// rows bottom-right aligned: keys past the diagonal masked), O = P V. BLAS and the softmax use
// `threads` threads.
void textbook_attention(const float* q, const float* k, const float* v, float* out, std::int64_t seq_q,
                        std::int64_t seq_k, std::int64_t heads, std::int64_t kv_heads, std::int64_t d, bool causal,
                        int threads);

}  // namespace attn::cli
