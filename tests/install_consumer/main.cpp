// The README's API example, compiled against the installed package: causal GQA attention, f32.
#include <attn/attn.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const int batch = 1, seqlen = 128, heads = 8, kv_heads = 2, head_dim = 64;
  std::vector<float> q(batch * seqlen * heads * head_dim), k(batch * seqlen * kv_heads * head_dim), v(k.size()),
      out(q.size()), lse(batch * heads * seqlen);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.1f * i);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.2f * i), v[i] = std::sin(0.3f * i);

  using attn::TensorView;
  attn::AttentionOptions opts;
  opts.causal = true;
  const TensorView lse_view = TensorView::contiguous(lse.data(), batch, heads, seqlen);
  attn::attention_tiled(TensorView::contiguous(q.data(), batch, seqlen, heads, head_dim),
                        TensorView::contiguous(k.data(), batch, seqlen, kv_heads, head_dim),
                        TensorView::contiguous(v.data(), batch, seqlen, kv_heads, head_dim),
                        TensorView::contiguous(out.data(), batch, seqlen, heads, head_dim), opts, {}, &lse_view);
  // Row 0 sees only key 0: its output is v[0] exactly and its lse is its one score.
  std::printf("out[0][0] = %.6f (v[0][0] = %.6f), lse[0] = %.6f\n", out[0], v[0], lse[0]);
  return std::abs(out[0] - v[0]) < 1e-6f ? 0 : 1;
}
