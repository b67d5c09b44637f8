// Collective validation (collective.hpp).
#include "distributed/collective.hpp"

#include <cstring>
#include <stdexcept>

namespace attn::detail {

std::vector<std::int64_t> all_ranks(MPI_Comm comm, std::int64_t x) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<std::int64_t> all(static_cast<std::size_t>(size));
  MPI_Allgather(&x, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, comm);
  return all;
}

namespace {

// Every rank throws the message `root` holds.
[[noreturn]] void throw_from(MPI_Comm comm, int root, std::string message) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  auto n = static_cast<std::int64_t>(message.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, root, comm);
  message.resize(static_cast<std::size_t>(n));
  MPI_Bcast(message.data(), static_cast<int>(n), MPI_CHAR, root, comm);
  throw std::invalid_argument(message + " (rank " + std::to_string(root) + ")");
}

}  // namespace

void agree_collectively(MPI_Comm comm, std::string_view who, const std::function<void()>& check,
                        const std::function<std::vector<SharedField>()>& fields) {
  std::string error;
  try {
    check();
  } catch (const std::invalid_argument& e) {
    error = e.what();
  }
  const std::vector<std::int64_t> failed = all_ranks(comm, error.empty() ? 0 : 1);
  for (std::size_t r = 0; r < failed.size(); ++r)
    if (failed[r]) throw_from(comm, static_cast<int>(r), error);

  const std::vector<SharedField> mine = fields();
  std::vector<std::int64_t> values;
  for (const SharedField& f : mine) values.push_back(f.value);
  const auto n = static_cast<int>(values.size());
  std::vector<std::int64_t> all(values.size() * failed.size());
  MPI_Allgather(values.data(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, comm);
  for (std::size_t r = 1; r < failed.size(); ++r)
    for (std::size_t i = 0; i < values.size(); ++i)
      if (all[r * values.size() + i] != all[i])
        throw std::invalid_argument(std::string(who) + ": " + mine[i].arg + ": " + mine[i].what +
                                    " must be the same on every rank (rank 0: " + std::to_string(all[i]) + ", rank " +
                                    std::to_string(r) + ": " + std::to_string(all[r * values.size() + i]) + ")");
}

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
