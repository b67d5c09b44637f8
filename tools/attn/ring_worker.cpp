// attn-ring-worker: one rank of `attn bench ring` (run by it under mpirun; usable by hand too, e.g.
// `mpirun -n 2 --bind-to none build/tools/attn-ring-worker --seq 4096 --threads 1`). Each rank holds
// its rows of a causal (or full) self-attention problem and times ring_attention over them: barrier,
// call, barrier, so a run's time is the slowest rank's. Rank 0 prints one JSON object.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "attn/distributed.hpp"
#include "bench_inputs.hpp"
#include "bench_isa.hpp"

namespace {

struct WorkerArgs {
  std::int64_t seq = 4096, heads = 16, kv_heads = 4, head_dim = 128;
  std::string dtype = "bf16", layout = "zigzag";
  bool full = false;
  int threads = 1, reps = 5;
};

int run(const WorkerArgs& a) {
  int R = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  const attn::DType t = attn::cli::parse_dtype(a.dtype);
  const std::int64_t rows = a.seq / R;  // --seq is a multiple of 2R (checked by attn bench ring)
  const attn::cli::Buffer q(rows * a.heads * a.head_dim, t, 1 + 3 * r), k(rows * a.kv_heads * a.head_dim, t, 2 + 3 * r),
      v(rows * a.kv_heads * a.head_dim, t, 3 + 3 * r), out(rows * a.heads * a.head_dim, t, 0);
  attn::AttentionOptions opts;
  opts.causal = !a.full;
  opts.num_threads = a.threads;
  const attn::RingOptions ring{a.layout == "zigzag" ? attn::RingLayout::zigzag : attn::RingLayout::contiguous};
  attn::RingStats stats;
  std::vector<double> times;
  for (int rep = 0; rep <= a.reps; ++rep) {  // rep 0 warms up
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    attn::ring_attention(MPI_COMM_WORLD, q.view(1, rows, a.heads, a.head_dim), k.view(1, rows, a.kv_heads, a.head_dim),
                         v.view(1, rows, a.kv_heads, a.head_dim), out.view(1, rows, a.heads, a.head_dim), opts, ring,
                         nullptr, &stats);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rep > 0) times.push_back(MPI_Wtime() - t0);
  }
  std::sort(times.begin(), times.end());
  std::int64_t most = 0, least = 0;
  MPI_Reduce(&stats.blocks_computed, &most, 1, MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(&stats.blocks_computed, &least, 1, MPI_INT64_T, MPI_MIN, 0, MPI_COMM_WORLD);
  if (r == 0)
    std::printf("%s\n", nlohmann::json{{"ranks", R},
                                       {"threads_per_rank", a.threads},
                                       {"median_s", times[times.size() / 2]},
                                       {"min_s", times.front()},
                                       {"reps", a.reps},
                                       {"blocks_computed_max", most},
                                       {"blocks_computed_min", least}}
                            .dump()
                            .c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  WorkerArgs a;
  CLI::App app{"attn-ring-worker: one rank of attn bench ring"};
  app.add_option("--seq", a.seq, "whole sequence length (a multiple of 2 x ranks)");
  app.add_option("--heads", a.heads, "query heads");
  app.add_option("--kv-heads", a.kv_heads, "kv heads");
  app.add_option("--head-dim", a.head_dim, "head dim");
  app.add_option("--dtype", a.dtype, "f32, bf16, f16 or f64");
  app.add_option("--layout", a.layout, "zigzag or contiguous")->check(CLI::IsMember({"zigzag", "contiguous"}));
  app.add_flag("--full", a.full, "no causal mask");
  app.add_option("--threads", a.threads, "OpenMP threads per rank");
  app.add_option("--reps", a.reps, "timed runs");
  app.add_option_function<std::string>("--isa", attn::cli::pin_isa, "Highway targets to run on (attn bench --isa)");
  int rc = 0;
  try {
    app.parse(argc, argv);
    rc = run(a);
  } catch (const CLI::ParseError& e) {
    rc = app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-ring-worker: %s\n", e.what());
    rc = 2;
  }
  MPI_Finalize();
  return rc;
}
