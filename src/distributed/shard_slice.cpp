// One rank's part of a sharded decode (shard_slice.hpp).
#include "distributed/shard_slice.hpp"

#include "decode/run_decode.hpp"
#include "validate/decode_problem.hpp"
#include "distributed/ring_block.hpp"

namespace attn::detail {

std::vector<std::int64_t> slice_key_shift(const std::vector<std::int64_t>& all_seqlens, std::int64_t batch, int rank) {
  const auto ranks = static_cast<std::int64_t>(all_seqlens.size()) / batch;
  std::vector<std::int64_t> shift(static_cast<std::size_t>(batch), 0);
  for (std::int64_t x = rank + 1; x < ranks; ++x)
    for (std::int64_t b = 0; b < batch; ++b)
      shift[static_cast<std::size_t>(b)] += all_seqlens[static_cast<std::size_t>(x * batch + b)];
  return shift;
}

void decode_slice_partial(std::string_view who, const TensorView& q, const KVCache& slice, const AttentionOptions& opts,
                          const DecodeOptions& dec, const std::int64_t* key_shift, const TensorView& out,
                          const TensorView& lse) {
  DenseCopy q_acc;
  TensorView qa = q;
  if (q.dtype != out.dtype) {
    q_acc = dense_copy(q, out.dtype);
    qa = q_acc.view;
  }
  AttentionOptions partial = opts;
  partial.sinks = nullptr;  // folded once, after the merge
  DecodeProblem p = validate_decode(who, qa, slice, out, partial, dec, &lse);
  p.key_shift = key_shift;
  run_decode(p);
}

}  // namespace attn::detail
