// Collective validation (collective.hpp).
#include "distributed/collective.hpp"

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

}  // namespace attn::detail
