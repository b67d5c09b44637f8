// The records a sharded decode's ranks exchange: per query row (b, i, h), its partial lse and output
// [lse, o_0 .. o_{d_v - 1}] in the accumulator type (A = double or float), and their merge as an MPI
// user-defined operation. The merge is the online softmax's (merge/merge_output.hpp), so it is
// commutative bitwise and associative up to rounding (tests/mpi/test_distributed.cpp checks both).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <limits>

#include "attn/online_softmax.hpp"
#include "merge/merge_output.hpp"

namespace attn::detail {

// acc <- acc (+) the record at rec (width 1 + acc.dim).
template <class A>
void merge_record(RowState<A> acc, PartialState<A>& part, const A* rec) {
  merge_output(acc, part, rec[0], rec + 1, 1);
}

// inout[k] <- in[k] (+) inout[k] for `count` records of `width` values each: the state of the union
// of both key sets, finalized back into a record.
template <class A>
void merge_records(const A* in, A* inout, std::int64_t count, std::int64_t width) {
  PartialState<A> acc(width - 1), part(width - 1);
  for (std::int64_t k = 0; k < count; ++k) {
    reset(acc.view());
    merge_record(acc.view(), part, inout + k * width);
    merge_record(acc.view(), part, in + k * width);
    A* rec = inout + k * width;
    rec[0] = finalize(acc.view(), rec + 1);
  }
}

// The MPI_User_function of merge_records; the record's width is the datatype's size.
template <class A>
void merge_records_op(void* in, void* inout, int* count, MPI_Datatype* type) {
  int bytes = 0;
  MPI_Type_size(*type, &bytes);
  merge_records(static_cast<const A*>(in), static_cast<A*>(inout), *count,
                static_cast<std::int64_t>(bytes / static_cast<int>(sizeof(A))));
}

}  // namespace attn::detail
