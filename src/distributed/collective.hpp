// The distributed calls' agreement before any write: each rank validates its own arguments, then the
// ranks compare what must be equal across them (agreement.hpp), and either all go on or all throw the
// same error.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "distributed/agreement.hpp"

namespace attn::detail {

// Runs `check` on this rank (it throws std::invalid_argument on a bad argument); then, unless some
// rank's check threw, compares `fields` (built after `check`, the same list on every rank) across the
// ranks. If any rank's check failed, every rank throws the message of the lowest such rank followed by
// " (rank r)"; else if a field differs between rank 0 and a rank r, every rank throws
// "<who>: <arg>: <what> must be the same on every rank (rank 0: x, rank r: y)".
void agree_collectively(MPI_Comm comm, std::string_view who, const std::function<void()>& check,
                        const std::function<std::vector<SharedField>()>& fields);

// Every rank's x, in rank order (MPI_Allgather).
std::vector<std::int64_t> all_ranks(MPI_Comm comm, std::int64_t x);

}  // namespace attn::detail
