// Counted HBM traffic: FlashAttention's Algorithm 1 and the FlashAttention-2 loop order run for real,
// on random f64 data, with every element that crosses between "HBM" and "SRAM" counted.
//
// The point is to check the closed forms in io_model.cpp against an actual schedule rather than
// against the same arithmetic written twice: the kernels below can only reach Q, K, V, O, l, m and the
// LSE through `Hbm::read` / `Hbm::write`, so any access the formula forgets (or double counts) shows
// up as a mismatch, and the output is compared with attention_reference so a schedule that "moves the
// right amount" but computes the wrong thing fails too. The on-chip maths is the shared online softmax
// (attn/online_softmax.hpp), not a copy of it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/io_model.hpp"
#include "attn/online_softmax.hpp"
#include "attn/tensor.hpp"

namespace attn::io {
namespace {

// The off-chip memory: owns the arrays, hands out copies of whole rows, and counts every element.
class Hbm {
 public:
  struct Array {
    int index;
  };

  Array add(std::int64_t rows, std::int64_t cols, std::vector<double> init) {
    arrays_.push_back({rows, cols, std::move(init)});
    return {static_cast<int>(arrays_.size()) - 1};
  }

  // Rows [row0, row0 + rows) of `a` into an on-chip buffer.
  void read(Array a, std::int64_t row0, std::int64_t rows, double* sram) {
    const Stored& s = arrays_[static_cast<std::size_t>(a.index)];
    check(s, row0, rows);
    std::copy_n(s.data.data() + row0 * s.cols, rows * s.cols, sram);
    reads_ += rows * s.cols;
  }

  void write(Array a, std::int64_t row0, std::int64_t rows, const double* sram) {
    Stored& s = arrays_[static_cast<std::size_t>(a.index)];
    check(s, row0, rows);
    std::copy_n(sram, rows * s.cols, s.data.data() + row0 * s.cols);
    writes_ += rows * s.cols;
  }

  std::int64_t reads() const { return reads_; }
  std::int64_t writes() const { return writes_; }

  // For checking the result once the schedule is over; not traffic.
  const std::vector<double>& contents(Array a) const { return arrays_[static_cast<std::size_t>(a.index)].data; }

 private:
  struct Stored {
    std::int64_t rows, cols;
    std::vector<double> data;
  };
  static void check(const Stored& s, std::int64_t row0, std::int64_t rows) {
    if (row0 < 0 || rows < 0 || row0 + rows > s.rows)
      throw std::logic_error("io::Hbm: access outside an array (a schedule bug)");
  }
  std::vector<Stored> arrays_;
  std::int64_t reads_ = 0, writes_ = 0;
};

// The on-chip memory: buffers that report their size, so the schedule's peak working set is measured
// rather than assumed. Resizing keeps the vector's capacity, so reuse inside the loops is cheap.
class Sram {
 public:
  class Buffer {
   public:
    explicit Buffer(Sram& owner) : owner_(&owner) {}
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { owner_->live_ -= static_cast<std::int64_t>(v_.size()); }

    void resize(std::int64_t n) {
      owner_->live_ += n - static_cast<std::int64_t>(v_.size());
      owner_->peak_ = std::max(owner_->peak_, owner_->live_);
      v_.resize(static_cast<std::size_t>(n));
    }
    double* data() { return v_.data(); }
    double& operator[](std::int64_t i) { return v_[static_cast<std::size_t>(i)]; }

   private:
    Sram* owner_;
    std::vector<double> v_;
  };

  std::int64_t peak() const { return peak_; }

 private:
  std::int64_t live_ = 0, peak_ = 0;
};

struct Problem {
  std::int64_t n, d;
  double scale;
  std::vector<double> q, k, v;
};

Problem make_problem(const char* where, std::int64_t n, std::int64_t d, std::int64_t m, std::uint64_t seed) {
  auto positive = [&](const char* name, std::int64_t x) {
    if (x < 1)
      throw std::invalid_argument(std::string(where) + ": " + name + " must be >= 1, got " + std::to_string(x));
  };
  positive("seqlen", n);
  positive("head_dim", d);
  positive("sram_elements", m);
  std::int64_t nd;
  if (__builtin_mul_overflow(n, d, &nd) || nd > (std::int64_t{1} << 32))
    throw std::invalid_argument(std::string(where) + ": seqlen x head_dim must be <= 2^32, got " + std::to_string(n) +
                                " x " + std::to_string(d));
  Problem p{n, d, 1.0 / std::sqrt(static_cast<double>(d)), {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (auto* a : {&p.q, &p.k, &p.v}) {
    a->resize(static_cast<std::size_t>(nd));
    for (double& x : *a) x = u(rng);
  }
  return p;
}

// B = ceil(M / 4d), as in io_model.cpp (the closed forms and the schedules must agree on it).
std::int64_t block_for(std::int64_t d, std::int64_t m) {
  const std::int64_t four_d = 4 * d;  // d <= 2^32 here, so no overflow
  return m / four_d + (m % four_d != 0 ? 1 : 0);
}

// S_ij = Q_i K_j^T * scale for an nr x nb tile, row-major.
void scores(const double* qi, const double* kj, std::int64_t nr, std::int64_t nb, std::int64_t d, double scale,
            double* s) {
  for (std::int64_t r = 0; r < nr; ++r)
    for (std::int64_t c = 0; c < nb; ++c) {
      double acc = 0;
      for (std::int64_t x = 0; x < d; ++x) acc += qi[r * d + x] * kj[c * d + x];
      s[r * nb + c] = acc * scale;
    }
}

// Largest |a - b| over the output and the log-sum-exp, against attention_reference.
double diff_vs_reference(const Problem& p, const std::vector<double>& out, const std::vector<double>& lse) {
  std::vector<double> ref_out(out.size()), ref_lse(lse.size());
  const TensorView ref_lse_view = TensorView::contiguous(ref_lse.data(), 1, 1, p.n);
  attention_reference(TensorView::contiguous(p.q.data(), 1, p.n, 1, p.d),
                      TensorView::contiguous(p.k.data(), 1, p.n, 1, p.d),
                      TensorView::contiguous(p.v.data(), 1, p.n, 1, p.d),
                      TensorView::contiguous(ref_out.data(), 1, p.n, 1, p.d), AttentionOptions{}, &ref_lse_view);
  double worst = 0;
  for (std::size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - ref_out[i]));
  for (std::size_t i = 0; i < lse.size(); ++i) worst = std::max(worst, std::abs(lse[i] - ref_lse[i]));
  return worst;
}

Counted finish(const Hbm& hbm, const Sram& sram, double diff) {
  Counted c;
  c.reads = hbm.reads();
  c.writes = hbm.writes();
  c.elements = c.reads + c.writes;
  c.sram_peak_elements = sram.peak();
  c.max_abs_diff = diff;
  return c;
}

}  // namespace

// Algorithm 1 of the FlashAttention paper: outer loop over key/value tiles, inner over query tiles,
// with O (normalised), l and m living in HBM between passes.
Counted count_algorithm1(std::int64_t n, std::int64_t d, std::int64_t m, std::uint64_t seed) {
  const Problem p = make_problem("io::count_algorithm1", n, d, m, seed);
  const std::int64_t bc = block_for(d, m), br = std::min(bc, d);

  // Line 2 of the algorithm initialises O = 0, l = 0, m = -inf in HBM; that is not counted.
  Hbm hbm;
  const auto Q = hbm.add(n, d, p.q), K = hbm.add(n, d, p.k), V = hbm.add(n, d, p.v);
  const auto O = hbm.add(n, d, std::vector<double>(static_cast<std::size_t>(n * d), 0.0));
  const auto L = hbm.add(n, 1, std::vector<double>(static_cast<std::size_t>(n), 0.0));
  const auto Mx =
      hbm.add(n, 1, std::vector<double>(static_cast<std::size_t>(n), -std::numeric_limits<double>::infinity()));

  Sram sram;
  Sram::Buffer kj(sram), vj(sram), qi(sram), oi(sram), s(sram), li(sram), mi(sram);
  for (std::int64_t j0 = 0; j0 < n; j0 += bc) {
    const std::int64_t nb = std::min(bc, n - j0);  // the last tile may be partial
    kj.resize(nb * d);
    vj.resize(nb * d);
    hbm.read(K, j0, nb, kj.data());
    hbm.read(V, j0, nb, vj.data());
    for (std::int64_t i0 = 0; i0 < n; i0 += br) {
      const std::int64_t nr = std::min(br, n - i0);
      qi.resize(nr * d);
      oi.resize(nr * d);
      li.resize(nr);
      mi.resize(nr);
      s.resize(nr * nb);
      hbm.read(Q, i0, nr, qi.data());
      hbm.read(O, i0, nr, oi.data());
      hbm.read(L, i0, nr, li.data());
      hbm.read(Mx, i0, nr, mi.data());
      scores(qi.data(), kj.data(), nr, nb, d, p.scale, s.data());
      for (std::int64_t r = 0; r < nr; ++r) {
        double* o = oi.data() + r * d;
        // HBM holds the normalised O = o / l; the online state needs o back (l = 0: nothing yet).
        if (li[r] > 0)
          for (std::int64_t c = 0; c < d; ++c) o[c] *= li[r];
        const RowState<double> st{&mi[r], &li[r], o, d};
        fold(st, s.data() + r * nb, nb, vj.data(), d);
        finalize(st, o);  // in place: O_i = o / l, while l and m stay as the running statistics
      }
      hbm.write(O, i0, nr, oi.data());
      hbm.write(L, i0, nr, li.data());
      hbm.write(Mx, i0, nr, mi.data());
    }
  }

  // The result is O, and lse = m + log l from the final statistics (read back outside the count).
  const auto& l_final = hbm.contents(L);
  const auto& m_final = hbm.contents(Mx);
  std::vector<double> lse(static_cast<std::size_t>(n));
  for (std::size_t r = 0; r < lse.size(); ++r) lse[r] = m_final[r] + std::log(l_final[r]);
  return finish(hbm, sram, diff_vs_reference(p, hbm.contents(O), lse));
}

// The FlashAttention-2 order: outer loop over query tiles, whose state (m, l, o) stays on chip while
// the inner loop streams every key/value tile past it; O and the LSE are written once per query tile.
Counted count_fa2(std::int64_t n, std::int64_t d, std::int64_t m, std::uint64_t seed) {
  const Problem p = make_problem("io::count_fa2", n, d, m, seed);
  const std::int64_t b = block_for(d, m);  // B_r = B_c

  Hbm hbm;
  const auto Q = hbm.add(n, d, p.q), K = hbm.add(n, d, p.k), V = hbm.add(n, d, p.v);
  const auto O = hbm.add(n, d, std::vector<double>(static_cast<std::size_t>(n * d), 0.0));
  const auto Lse = hbm.add(n, 1, std::vector<double>(static_cast<std::size_t>(n), 0.0));

  Sram sram;
  Sram::Buffer qi(sram), oi(sram), li(sram), mi(sram), kj(sram), vj(sram), s(sram);
  for (std::int64_t i0 = 0; i0 < n; i0 += b) {
    const std::int64_t nr = std::min(b, n - i0);
    qi.resize(nr * d);
    oi.resize(nr * d);
    li.resize(nr);
    mi.resize(nr);
    hbm.read(Q, i0, nr, qi.data());
    for (std::int64_t r = 0; r < nr; ++r) reset(RowState<double>{&mi[r], &li[r], oi.data() + r * d, d});
    for (std::int64_t j0 = 0; j0 < n; j0 += b) {
      const std::int64_t nb = std::min(b, n - j0);
      kj.resize(nb * d);
      vj.resize(nb * d);
      s.resize(nr * nb);
      hbm.read(K, j0, nb, kj.data());
      hbm.read(V, j0, nb, vj.data());
      scores(qi.data(), kj.data(), nr, nb, d, p.scale, s.data());
      for (std::int64_t r = 0; r < nr; ++r)
        fold(RowState<double>{&mi[r], &li[r], oi.data() + r * d, d}, s.data() + r * nb, nb, vj.data(), d);
    }
    // finalize in place; the row's m is no longer needed, so its slot carries the LSE out.
    for (std::int64_t r = 0; r < nr; ++r)
      mi[r] = finalize(RowState<double>{&mi[r], &li[r], oi.data() + r * d, d}, oi.data() + r * d);
    hbm.write(O, i0, nr, oi.data());
    hbm.write(Lse, i0, nr, mi.data());
  }
  return finish(hbm, sram, diff_vs_reference(p, hbm.contents(O), hbm.contents(Lse)));
}

}  // namespace attn::io
