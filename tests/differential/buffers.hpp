// Strided buffers for the differential test's views of any dtype, rank and layout: each surrounded by
// sentinel bytes so that a write outside a view's elements is seen, with the logical elements' offsets
// for reading their values back (which are then compared with test::max_error, common/error.hpp).
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "case.hpp"
#include "common/error.hpp"

namespace attn::fuzz {

// A strided buffer for one view, every byte first set to a sentinel so stray writes are visible.
constexpr unsigned char kSentinel = 0xA5;

struct Buffer {
  std::vector<unsigned char> bytes;
  TensorView view;
  std::vector<std::int64_t> offsets;  // element offset of each logical element, row-major over shape
};

inline Buffer make_buffer(DType t, std::array<std::int64_t, 4> shape, int rank, const Layout& l) {
  Buffer b;
  std::int64_t extent = 0;
  const auto st = strides_for(shape, rank, l, &extent);
  const std::size_t es = dtype_size(t);
  b.bytes.assign(static_cast<std::size_t>(extent + 8) * es, kSentinel);
  // Offset the data by a few elements so that a read or write before the view is also caught.
  b.view.data = b.bytes.data() + 4 * es;
  b.view.dtype = t;
  b.view.rank = rank;
  b.view.shape = shape;
  b.view.strides = st;
  if (rank == 3) {
    b.view.shape[3] = 1;
  }
  for (std::int64_t i0 = 0; i0 < shape[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < shape[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < shape[2]; ++i2)
        for (std::int64_t i3 = 0; i3 < (rank == 4 ? shape[3] : 1); ++i3)
          b.offsets.push_back(i0 * st[0] + i1 * st[1] + i2 * st[2] + (rank == 4 ? i3 * st[3] : 0));
  return b;
}

template <class T>
inline T* base(const Buffer& b) {
  return static_cast<T*>(b.view.data);
}

template <class T>
inline void fill_random(Buffer& b, Rng& r, double amp) {
  for (auto off : b.offsets) base<T>(b)[off] = detail::store<T>(r.real(-amp, amp));
}

template <class T>
inline std::vector<double> read(const Buffer& b) {
  std::vector<double> v;
  v.reserve(b.offsets.size());
  for (auto off : b.offsets) v.push_back(detail::load<double>(base<T>(b)[off]));
  return v;
}

// The logical elements as double, whatever the buffer's dtype.
inline std::vector<double> read_values(const Buffer& b) {
  std::vector<double> v;
  detail::dispatch_dtype(b.view.dtype, [&]<class U>() { v = read<U>(b); });
  return v;
}

// Bytes of `b` outside its view's elements that no longer hold the sentinel.
inline std::int64_t stray_writes(const Buffer& b) {
  std::vector<char> mine(b.bytes.size(), 0);
  const std::size_t es = dtype_size(b.view.dtype);
  const auto start = static_cast<std::size_t>(static_cast<unsigned char*>(b.view.data) - b.bytes.data());
  for (auto off : b.offsets) std::memset(&mine[start + static_cast<std::size_t>(off) * es], 1, es);
  std::int64_t n = 0;
  for (std::size_t i = 0; i < b.bytes.size(); ++i) n += !mine[i] && b.bytes[i] != kSentinel;
  return n;
}

// What went wrong with one configuration, as "; "-separated notes ("" when nothing did).
struct Notes {
  std::string text;
  void add(const std::string& s) {
    if (!s.empty()) text += (text.empty() ? "" : "; ") + s;
  }
  // A forward call wrote nothing outside out's and lse's elements, and nothing to lse unless asked to.
  void writes(const Buffer& out, const Buffer& lse, bool want_lse) {
    if (auto n = stray_writes(out)) add("wrote " + std::to_string(n) + " bytes outside out's view");
    if (auto n = stray_writes(lse)) add("wrote " + std::to_string(n) + " bytes outside lse's view");
    if (!want_lse && std::any_of(lse.bytes.begin(), lse.bytes.end(), [](unsigned char x) { return x != kSentinel; }))
      add("wrote lse although none was requested");
  }
  // A run with c.alt_threads threads gave the same bits as one with c.opts.num_threads (`same`).
  void thread_bits(bool same, const Config& c, const std::string& what = "") {
    if (!same)
      add(what + "num_threads " + std::to_string(c.alt_threads) + " gives different bits than " +
          std::to_string(c.opts.num_threads));
  }
};

}  // namespace attn::fuzz
