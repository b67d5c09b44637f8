// `attn check tiled|splitk`: the seed widget's exactness checks, on fresh random f64 data.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "checks.hpp"
#include "commands.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

std::string with_commas(std::int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<std::size_t>(i), ",");
  return s;
}

}  // namespace

void print(const TiledCheck& c) {
  std::printf("%lld queries × %lld keys, d = %lld, tiles of %lld: tiled vs textbook, max |Δ| = %.1e  %s\n",
              static_cast<long long>(c.seq), static_cast<long long>(c.seq), static_cast<long long>(c.head_dim),
              static_cast<long long>(c.tile), c.max_abs_diff, c.max_abs_diff <= kExactTolerance ? "(exact)" : "FAIL");
}

void print(const SplitKCheck& c, std::int64_t max_shown) {
  std::printf("One query over %s keys, merged from %s partials: max |Δ| = %.1e  %s\n", with_commas(c.keys).c_str(),
              with_commas(c.workers).c_str(), c.max_abs_diff, c.max_abs_diff <= kExactTolerance ? "(exact)" : "FAIL");
  for (std::size_t w = 0; w < c.partials.size() && static_cast<std::int64_t>(w) < max_shown; ++w) {
    const auto& p = c.partials[w];
    if (std::isinf(p.m))
      std::printf("  #%zu: empty slice (m=-inf l=0)\n", w);
    else
      std::printf("  #%zu: m=%.2f l=%.1f  (%lld keys)\n", w, p.m, p.l, static_cast<long long>(p.keys));
  }
  if (static_cast<std::int64_t>(c.partials.size()) > max_shown)
    std::printf("  ... %zu more (--json lists all)\n", c.partials.size() - static_cast<std::size_t>(max_shown));
}

void add_check_command(CLI::App& app) {
  auto* check =
      app.add_subcommand("check", "Exactness checks on random f64 data: tiled and split-K vs the textbook method");
  check->require_subcommand(1);

  struct TiledArgs {
    std::string seq = "48", d = "16", tile = "8";
    std::uint64_t seed = 1;
    bool json = false;
  };
  auto ta = std::make_shared<TiledArgs>();
  auto* tiled = check->add_subcommand("tiled", "Tiled attention (online softmax over key tiles) vs the reference");
  tiled->add_option("--seq", ta->seq, "queries = keys")->capture_default_str();
  tiled->add_option("--head-dim", ta->d, "head dimension d")->capture_default_str();
  tiled->add_option("--tile", ta->tile, "tile size (keys and queries)")->capture_default_str();
  tiled->add_option("--seed", ta->seed, "random seed")->capture_default_str();
  tiled->add_flag("--json", ta->json, "print one JSON object");
  tiled->callback([ta] {
    const auto c = check_tiled(parse_count(ta->seq, "--seq"), parse_count(ta->d, "--head-dim"),
                               parse_count(ta->tile, "--tile"), ta->seed);
    if (ta->json)
      std::printf("%s\n", nlohmann::json{{"check", "tiled"},
                                         {"seq", c.seq},
                                         {"head_dim", c.head_dim},
                                         {"tile", c.tile},
                                         {"max_abs_diff", c.max_abs_diff},
                                         {"tolerance", kExactTolerance},
                                         {"passed", c.max_abs_diff <= kExactTolerance}}
                              .dump()
                              .c_str());
    else
      print(c);
    if (c.max_abs_diff > kExactTolerance) throw CLI::RuntimeError(1);
  });

  struct SplitArgs {
    std::string keys = "4096", workers = "4", d = "16";
    std::uint64_t seed = 1;
    bool json = false;
  };
  auto sa = std::make_shared<SplitArgs>();
  auto* splitk = check->add_subcommand("splitk", "Split-K: one query's keys split across workers, partials merged");
  splitk->add_option("--keys", sa->keys, "keys in the cache")->capture_default_str();
  splitk->add_option("--workers", sa->workers, "number of splits")->capture_default_str();
  splitk->add_option("--head-dim", sa->d, "head dimension d")->capture_default_str();
  splitk->add_option("--seed", sa->seed, "random seed")->capture_default_str();
  splitk->add_flag("--json", sa->json, "print one JSON object");
  splitk->callback([sa] {
    const auto c = check_splitk(parse_count(sa->keys, "--keys"), parse_count(sa->workers, "--workers"),
                                parse_count(sa->d, "--head-dim"), sa->seed);
    if (sa->json) {
      nlohmann::json parts = nlohmann::json::array();
      for (const auto& p : c.partials)
        parts.push_back(
            {{"m", std::isinf(p.m) ? nlohmann::json(nullptr) : nlohmann::json(p.m)}, {"l", p.l}, {"keys", p.keys}});
      std::printf("%s\n", nlohmann::json{{"check", "splitk"},
                                         {"keys", c.keys},
                                         {"workers", c.workers},
                                         {"head_dim", c.head_dim},
                                         {"max_abs_diff", c.max_abs_diff},
                                         {"tolerance", kExactTolerance},
                                         {"passed", c.max_abs_diff <= kExactTolerance},
                                         {"partials", parts}}
                              .dump()
                              .c_str());
    } else {
      print(c, 16);
    }
    if (c.max_abs_diff > kExactTolerance) throw CLI::RuntimeError(1);
  });
}

}  // namespace attn::cli
