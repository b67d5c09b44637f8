// The fields ranks agree on and the ring's per-rank rules (agreement.hpp).
#include "distributed/agreement.hpp"

#include <cstring>

#include "validate/validate.hpp"

namespace attn::detail {

void append_rule_fields(std::vector<SharedField>& fields, const ScoreRule& r, std::int64_t batch, std::int64_t heads) {
  fields.push_back({"opts", "softmax_scale", double_bits(r.scale)});
  fields.push_back({"opts", "softcap", double_bits(r.softcap)});
  fields.push_back({"opts", "window_left (causal, window)", r.window_left});
  fields.push_back({"opts", "window_right (causal, window)", r.window_right});
  std::vector<float> slopes;  // slope(b, h) as the kernels read it: with stride 0 the array holds only heads
  if (r.alibi_slopes)
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t h = 0; h < heads; ++h) slopes.push_back(r.alibi_slope(b, h));
  fields.push_back(
      {"opts", "alibi_slopes (their values)", r.alibi_slopes ? hash_floats(slopes.data(), batch * heads) : 0});
  fields.push_back({"opts", "sinks (their values)", r.sinks ? hash_floats(r.sinks, heads) : 0});
}

std::vector<SharedField> ring_shared_fields(const Problem& p, bool zigzag) {
  std::vector<SharedField> f = {{"q", "dtype", static_cast<std::int64_t>(p.dtype)},
                                {"q", "batch", p.batch},
                                {"q", "heads", p.heads},
                                {"k", "kv_heads", p.kv_heads},
                                {"q", "head_dim", p.head_dim},
                                {"v", "head_dim_v", p.head_dim_v},
                                {"ring", "layout", zigzag ? 1 : 0}};
  append_rule_fields(f, p.rule, p.batch, p.heads);
  return f;
}

std::vector<SharedField> decode_shared_fields(const DecodeProblem& p) {
  return {{"q", "dtype", static_cast<std::int64_t>(p.q_dtype)},
          {"q", "batch", p.batch},
          {"q", "seqlen_q", p.seqlen_q},
          {"q", "heads", p.heads},
          {"cache.k", "kv_heads", p.kv_heads},
          {"q", "head_dim", p.head_dim},
          {"cache.v", "head_dim_v", p.head_dim_v}};
}

void check_ring_layout(std::string_view who, const Problem& p, bool zigzag) {
  reject_dropout(who, p.dropout, "ring attention does not drop (the keep mask needs whole-sequence counters)");
  if (zigzag && (p.seqlen_q % 2 || p.seqlen_k % 2))
    fail(who, p.seqlen_q % 2 ? "q" : "k", "seqlen must be even with the zigzag layout (two halves)");
}

std::int64_t hash_floats(const float* x, std::int64_t n, std::int64_t stride) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, x + i * stride, 4);
    for (int b = 0; b < 4; ++b) h = (h ^ ((u >> (8 * b)) & 0xffu)) * 1099511628211ull;
  }
  return static_cast<std::int64_t>(h);
}

std::int64_t double_bits(double x) {
  std::int64_t u;
  std::memcpy(&u, &x, 8);
  return u;
}

}  // namespace attn::detail
