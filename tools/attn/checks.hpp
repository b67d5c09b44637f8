// The widget's two live checks on random f64 data, shared by `attn check` and `attn demo`.
#pragma once

#include <cstdint>
#include <vector>

namespace attn::cli {

constexpr double kExactTolerance = 1e-12;

struct TiledCheck {
  std::int64_t seq, head_dim, tile;
  double max_abs_diff;
};
// seq queries x seq keys, head_dim d, key tiles of `tile`: tiled against the reference.
TiledCheck check_tiled(std::int64_t seq, std::int64_t head_dim, std::int64_t tile, std::uint64_t seed);

struct SplitKCheck {
  std::int64_t keys, workers, head_dim;
  double max_abs_diff;
  struct Partial {
    double m, l;
    std::int64_t keys;
  };
  std::vector<Partial> partials;
};
// One query over `keys` keys, split across `workers`: split-K against the reference.
SplitKCheck check_splitk(std::int64_t keys, std::int64_t workers, std::int64_t head_dim, std::uint64_t seed);

void print(const TiledCheck& c);
void print(const SplitKCheck& c, std::int64_t max_partials_shown);

}  // namespace attn::cli
