// What the ranks of a distributed call must agree on before any of them writes, and the rules each
// rank checks alone, without the transport: attn_mpi's calls (collective.hpp gathers the fields over
// MPI) and the Python package's attn.distributed (torch.distributed gathers them) both use these, so
// the two front ends refuse the same input with the same message.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/score_rule.hpp"
#include "validate/decode_problem.hpp"
#include "validate/problem.hpp"

namespace attn::detail {

// A value every rank must share, and the argument a mismatch is blamed on.
struct SharedField {
  const char* arg;   // e.g. "q"
  const char* what;  // e.g. "heads"
  std::int64_t value;
};

// The score rule's fields every rank must share (scale, softcap, window, and hashes of the ALiBi
// slopes and sinks of `batch` x `heads`), appended to `fields`.
void append_rule_fields(std::vector<SharedField>& fields, const ScoreRule& rule, std::int64_t batch,
                        std::int64_t heads);

// The fields of a ring call (forward or backward) on problem p: dtype, batch, heads, kv heads, head
// dims, the layout (0 contiguous, 1 zigzag: RingLayout's values) and the score rule.
std::vector<SharedField> ring_shared_fields(const Problem& p, bool zigzag);

// The fields of a sharded decode: dtype, batch, seqlen_q, heads, kv heads and head dims; the caller
// appends its own (the merge mode) and then the score rule's.
std::vector<SharedField> decode_shared_fields(const DecodeProblem& p);

// The ring's rules on one rank's validated problem that any transport shares: no dropout (its keep
// mask needs whole-sequence counters), and even lengths with the zigzag layout (two halves).
void check_ring_layout(std::string_view who, const Problem& p, bool zigzag);

// FNV-1a over n floats' bits (the ALiBi slopes and sinks, compared across ranks by this hash).
std::int64_t hash_floats(const float* x, std::int64_t n, std::int64_t stride = 1);
std::int64_t double_bits(double x);

}  // namespace attn::detail
