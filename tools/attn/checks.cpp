// The widget's two live checks (checks.hpp), apart from the CLI's parsing and printing so that the
// explorer's WebAssembly build (explorer/explorer_api.cpp) runs the same code without CLI11.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "attn/attention.hpp"
#include "checks.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

std::vector<double> random_values(std::size_t n, std::mt19937_64& rng) {
  // Standard normal entries: with d = 16 and scale 1/4 the scores have unit spread, and over thousands
  // of keys the row maxima land a few units above zero, as in the widget.
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

TiledCheck check_tiled(std::int64_t seq, std::int64_t d, std::int64_t tile, std::uint64_t seed) {
  if (seq < 1) throw UsageError("--seq: must be >= 1");
  if (d < 1) throw UsageError("--head-dim: must be >= 1");
  if (tile < 1) throw UsageError("--tile: must be >= 1");
  std::mt19937_64 rng(seed);
  const auto n = static_cast<std::size_t>(seq * d);
  auto q = random_values(n, rng), k = random_values(n, rng), v = random_values(n, rng);
  std::vector<double> ref(n), out(n);
  const auto view = [&](const std::vector<double>& x) { return TensorView::contiguous(x.data(), 1, seq, 1, d); };
  attention_reference(view(q), view(k), view(v), view(ref));
  TileOptions t;
  t.k_tile = tile;
  t.q_tile = tile;
  attention_tiled(view(q), view(k), view(v), view(out), {}, t);
  return {seq, d, tile, max_abs_diff(out, ref)};
}

SplitKCheck check_splitk(std::int64_t keys, std::int64_t workers, std::int64_t d, std::uint64_t seed) {
  if (keys < 1) throw UsageError("--keys: must be >= 1");
  if (workers < 1) throw UsageError("--workers: must be >= 1");
  if (workers > (1 << 20)) throw UsageError("--workers: must be <= 1048576");
  std::mt19937_64 rng(seed);
  auto q = random_values(static_cast<std::size_t>(d), rng);
  auto k = random_values(static_cast<std::size_t>(keys * d), rng),
       v = random_values(static_cast<std::size_t>(keys * d), rng);
  std::vector<double> ref(static_cast<std::size_t>(d)), out(static_cast<std::size_t>(d));
  const TensorView qv = TensorView::contiguous(q.data(), 1, 1, 1, d),
                   kv = TensorView::contiguous(k.data(), 1, keys, 1, d),
                   vv = TensorView::contiguous(v.data(), 1, keys, 1, d);
  attention_reference(qv, kv, vv, TensorView::contiguous(ref.data(), 1, 1, 1, d));
  SplitKOptions s;
  s.num_splits = workers;
  attention_splitk(qv, kv, vv, TensorView::contiguous(out.data(), 1, 1, 1, d), {}, s);
  SplitKCheck c{keys, workers, d, max_abs_diff(out, ref), {}};
  const auto parts = splitk_partials(qv, kv, vv, {}, s, 0, 0, 0);
  for (std::int64_t w = 0; w < workers; ++w) {
    const KeyRange r = splitk_slice(keys, workers, w);
    c.partials.push_back({parts[static_cast<std::size_t>(w)].m, parts[static_cast<std::size_t>(w)].l, r.end - r.begin});
  }
  return c;
}

}  // namespace attn::cli
