// A rank that dies while the others are inside a collective call: rank 1 exits without MPI_Finalize
// while ranks 0 and 2 wait in ring_attention for its chunk. tests/mpi/expect-job-ends checks that
// mpirun then ends the whole job with an error naming the rank, within a bounded time.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "attn/distributed.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 1) std::_Exit(3);
  std::vector<double> q(64 * 4 * 8, 0.5), k(64 * 2 * 8, 0.25), v(64 * 2 * 8, 1.0), out(64 * 4 * 8);
  attn::ring_attention(MPI_COMM_WORLD, attn::TensorView::contiguous(q.data(), 1, 64, 4, 8),
                       attn::TensorView::contiguous(k.data(), 1, 64, 2, 8),
                       attn::TensorView::contiguous(v.data(), 1, 64, 2, 8),
                       attn::TensorView::contiguous(out.data(), 1, 64, 4, 8));
  std::printf("rank %d: ring_attention returned although rank 1 died\n", rank);
  MPI_Finalize();
  return 0;
}
