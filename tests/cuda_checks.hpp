// The checks of the CUDA backend against the CPU f64 oracle, shared by the GPU tests (test_cuda.cpp,
// also built against the CPU emulation as test_cuda_emulated) and the tests of the benchmark's kernel
// variants (test_cuda_variants.cpp). Every check draws fresh random data (the seed is in the failure
// message), poisons the outputs (NaN) before the call, checks that every element was written, and
// applies the project's accuracy rule (common/accuracy.hpp): error against the f64 oracle at most twice
// the textbook method's error at the same precision, plus a small floor.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/cuda.hpp"
#include "cpu/rotary.hpp"
#include "support.hpp"

namespace attn::test {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(x)

// A device copy of a host vector or Tensor (which it remembers the shape of); freed on scope exit.
template <class T>
struct Dev {
  T* ptr = nullptr;
  std::size_t n = 0;
  std::array<std::int64_t, 4> shape{};  // [b, s, h, d] of the Tensor it copies
  explicit Dev(const std::vector<T>& host) : n(host.size()) {
    if (cudaMalloc(&ptr, std::max<std::size_t>(1, n) * sizeof(T)) != cudaSuccess)
      throw std::runtime_error("cudaMalloc");
    if (n && cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("H2D");
  }
  explicit Dev(const Tensor<T>& t) : Dev(t.data) { shape = {t.b, t.s, t.h, t.d}; }
  Dev(const Dev&) = delete;
  ~Dev() { cudaFree(ptr); }
  // The copied Tensor's view and its packed view (Tensor::packed), on the device.
  TensorView view() const { return TensorView::contiguous(ptr, shape[0], shape[1], shape[2], shape[3]); }
  TensorView packed() const { return TensorView::contiguous(ptr, shape[0] * shape[1], shape[2], shape[3]); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n && cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("D2H");
    return h;
  }
};

template <class T>
TensorView dview(const Dev<T>& d, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t e) {
  return TensorView::contiguous(d.ptr, a, b, c, e);
}

template <class T>
std::vector<T> poisoned(std::size_t n) {
  std::vector<T> v(n);
  std::memset(v.data(), 0xFF, n * sizeof(T));  // NaN in bf16, f16 and f32
  return v;
}
template <class T>
Tensor<T> poisoned(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  Tensor<T> t(b, s, h, d);
  t.data = poisoned<T>(t.data.size());
  return t;
}

struct Case : Shape {};

inline void PrintTo(const Case&, std::ostream* os) { *os << "(see the name)"; }

// The seed of the running test's random inputs: a hash of its full name (each parameterised case its
// own), so every run of a test draws the same inputs and a failure repeats (the seed is in its trace).
inline std::uint64_t test_seed() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h >> 16;
}

// Forward on the GPU against the f64 oracle; the textbook method at T's precision sets the bar.
template <class T>
void check_forward(const Case& c) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " d " + std::to_string(c.d) + " causal " + std::to_string(c.causal));
  const auto p = random_qkv<T>(c.b, c.sq, c.sk, c.h, c.hk, c.d, seed);
  const ShapeOptions cpu(c, 0.3f);
  const AttentionOptions& o_cpu = cpu.opts;
  Dev<float> d_slopes(cpu.slopes), d_sinks(cpu.sinks);
  AttentionOptions o = o_cpu;
  if (c.alibi) o.alibi_slopes = {d_slopes.ptr, static_cast<std::int64_t>(d_slopes.n)};
  if (c.sinks) o.sinks = {d_sinks.ptr, static_cast<std::int64_t>(d_sinks.n)};
  std::vector<double> oracle_lse;
  const std::vector<double> oracle = oracle_forward(p, o_cpu, &oracle_lse);
  const double base = max_error(textbook_forward(p, o_cpu), oracle);

  Dev<T> dq(p.q), dk(p.k), dv(p.v), dout(poisoned<T>(c.b, c.sq, c.h, c.d));
  Dev<float> dlse(poisoned<float>(oracle_lse.size()));
  TensorView lv = TensorView::contiguous(dlse.ptr, c.b, c.h, c.sq);
  cuda::attention(dq.view(), dk.view(), dv.view(), dout.view(), o, &lv);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<T> out = dout.get();
  EXPECT_EQ(count_nan(out), 0) << "output elements never written";
  EXPECT_TRUE(meets_textbook_rule(max_error(out, oracle), base, kForwardFactor, textbook_floor<T>()));
  EXPECT_LE(max_error(dlse.get(), oracle_lse), 2e-3) << "lse";
}

struct DecodeCase {
  std::int64_t batch, sq, heads, kv_heads, d, max_len;
  bool causal, paged;
  std::int64_t splits;  // 0 = automatic
  std::int64_t seqlen_new = 0;
  std::int64_t page_size = 64;
  bool head_major = false;  // cache stored [pages, kv_heads, rows, d] (Hugging Face's), viewed with strides
  bool sinks = false;       // attention sinks (test::sinks_for)
  int rotary = 0;           // with appends: 1 rotates all of d (GPT-NeoX pairs), 2 half of d (GPT-J, interleaved)
  std::int64_t keys_per_split = 0;  // > 0: batch-invariant slices (splits must be 0)
};

// Random rotary tables [positions][rotary_dim / 2] (f32 angles of position x frequency) and their view.
struct RotaryCase {
  std::vector<float> cos, sin;
  RotaryTables tables;
  RotaryCase(int kind, std::int64_t d, std::int64_t positions) {
    tables.rotary_dim = kind == 1 ? d : d / 2;
    tables.interleaved = kind == 2;
    tables.positions = positions;
    const std::int64_t half = tables.rotary_dim / 2;
    for (std::int64_t pos = 0; pos < positions; ++pos)
      for (std::int64_t c = 0; c < half; ++c) {
        const double angle = static_cast<double>(pos) * std::pow(10000.0, -static_cast<double>(c) / half);
        cos.push_back(static_cast<float>(std::cos(angle)));
        sin.push_back(static_cast<float>(std::sin(angle)));
      }
    tables.cos = cos.data();
    tables.sin = sin.data();
  }
};

// Rows first .. t.s - 1 of batch b of t, every head, rotated in place, row i at position pos(i): the host's
// rotary (cpu/rotary.hpp) in the accumulator type A, stored back as T.
template <class A, class T, class PosFn>
void rotate_rows(Tensor<T>& t, std::int64_t b, std::int64_t first, const RotaryTables& r, PosFn pos) {
  std::vector<A> row(static_cast<std::size_t>(t.d));
  for (std::int64_t i = first; i < t.s; ++i)
    for (std::int64_t h = 0; h < t.h; ++h) {
      for (std::int64_t x = 0; x < t.d; ++x) row[x] = detail::load<A>(t.at(b, i, h, x));
      detail::rotate_row<A>(row.data(), detail::rotary_spec(&r, false), pos(i));
      for (std::int64_t x = 0; x < t.d; ++x) t.at(b, i, h, x) = detail::store<T>(row[x]);
    }
}

inline void PrintTo(const DecodeCase&, std::ostream* os) { *os << "(see the name)"; }

template <class T>
void check_decode(const DecodeCase& c) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  std::vector<std::int32_t> seqlens(static_cast<std::size_t>(c.batch));
  for (auto& s : seqlens)
    s = std::uniform_int_distribution<std::int32_t>(0, static_cast<std::int32_t>(c.max_len - c.seqlen_new))(rng);
  seqlens[0] = static_cast<std::int32_t>(c.max_len - c.seqlen_new);  // one full sequence
  const std::int64_t pages_per_seq = (c.max_len + c.page_size - 1) / c.page_size;
  const std::int64_t num_pages = c.paged ? c.batch * pages_per_seq : c.batch;
  const std::int64_t rows = c.paged ? c.page_size : c.max_len;
  auto kc = test::random_tensor<T>(num_pages, rows, c.kv_heads, c.d, seed + 1, 2.0);
  auto vc = test::random_tensor<T>(num_pages, rows, c.kv_heads, c.d, seed + 2);
  auto q = test::random_tensor<T>(c.batch, c.sq, c.heads, c.d, seed + 3, 2.0);
  auto kn = test::random_tensor<T>(c.batch, c.seqlen_new, c.kv_heads, c.d, seed + 4, 2.0);
  auto vn = test::random_tensor<T>(c.batch, c.seqlen_new, c.kv_heads, c.d, seed + 5);
  std::vector<std::int32_t> table(static_cast<std::size_t>(c.batch * pages_per_seq));
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
  std::shuffle(table.begin(), table.end(), rng);  // pages scattered through the pool

  // Rotary: the kernels rotate q and the appended keys in f32 and store them as T, as the textbook's inputs
  // below are made; the oracle rotates the same T values in f64.
  const RotaryCase rot(c.rotary, c.d, c.max_len + c.sq);

  // The oracle: the f64 reference on each sequence's gathered keys.
  AttentionOptions o;
  o.causal = c.causal;
  const std::vector<float> sinks = test::sinks_for(c.heads);
  if (c.sinks) o.sinks = sinks;  // the oracle's; the device call gets d_sinks below
  std::vector<double> oracle(q.data.size()), oracle_lse(static_cast<std::size_t>(c.batch * c.heads * c.sq));
  std::vector<T> textbook(q.data.size());
  for (std::int64_t b = 0; b < c.batch; ++b) {
    const std::int64_t n = seqlens[b] + c.seqlen_new;
    Tensor<T> kb(1, n, c.kv_heads, c.d), vb(1, n, c.kv_heads, c.d);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t g = 0; g < c.kv_heads; ++g)
        for (std::int64_t x = 0; x < c.d; ++x) {
          if (j >= seqlens[b]) {
            kb.at(0, j, g, x) = kn.at(b, j - seqlens[b], g, x);
            vb.at(0, j, g, x) = vn.at(b, j - seqlens[b], g, x);
          } else if (c.paged) {
            kb.at(0, j, g, x) = kc.at(table[b * pages_per_seq + j / c.page_size], j % c.page_size, g, x);
            vb.at(0, j, g, x) = vc.at(table[b * pages_per_seq + j / c.page_size], j % c.page_size, g, x);
          } else {
            kb.at(0, j, g, x) = kc.at(b, j, g, x);
            vb.at(0, j, g, x) = vc.at(b, j, g, x);
          }
        }
    Tensor<T> qb(1, c.sq, c.heads, c.d);
    std::copy(q.data.begin() + b * c.sq * c.heads * c.d, q.data.begin() + (b + 1) * c.sq * c.heads * c.d,
              qb.data.begin());
    auto q64 = test::to_f64(qb), k64 = test::to_f64(kb), v64 = test::to_f64(vb);
    if (c.rotary) {  // q row i at seqlens[b] + i (causal) or seqlens[b]; the appended key j at position j
      auto q_pos = [&](std::int64_t i) { return seqlens[b] + (c.causal ? i : 0); };
      auto k_pos = [](std::int64_t j) { return j; };
      rotate_rows<double>(q64, 0, 0, rot.tables, q_pos);
      rotate_rows<double>(k64, 0, seqlens[b], rot.tables, k_pos);
      rotate_rows<float>(qb, 0, 0, rot.tables, q_pos);
      rotate_rows<float>(kb, 0, seqlens[b], rot.tables, k_pos);
    }
    std::vector<double> l(static_cast<std::size_t>(c.heads * c.sq));
    TensorView lv = TensorView::contiguous(l.data(), 1, c.heads, c.sq);
    attention_reference(q64.view(), k64.view(), v64.view(),
                        TensorView::contiguous(oracle.data() + b * c.sq * c.heads * c.d, 1, c.sq, c.heads, c.d), o,
                        &lv);
    std::copy(l.begin(), l.end(), oracle_lse.begin() + b * c.heads * c.sq);
    attention_reference(qb.view(), kb.view(), vb.view(),
                        TensorView::contiguous(textbook.data() + b * c.sq * c.heads * c.d, 1, c.sq, c.heads, c.d), o);
  }
  const double base = max_error(textbook, oracle);

  // The device cache: as generated ([pages, rows, kv_heads, d]), or permuted to kv-head-major.
  auto device_layout = [&](Tensor<T>& t) {
    if (!c.head_major) return t.data;
    std::vector<T> hm(t.data.size());
    for (std::int64_t pg = 0; pg < num_pages; ++pg)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t g = 0; g < c.kv_heads; ++g)
          for (std::int64_t x = 0; x < c.d; ++x) hm[((pg * c.kv_heads + g) * rows + r) * c.d + x] = t.at(pg, r, g, x);
    return hm;
  };
  auto cache_view = [&](const Dev<T>& d) {
    return c.head_major ? TensorView::strided(d.ptr, {num_pages, rows, c.kv_heads, c.d},
                                              {c.kv_heads * rows * c.d, c.d, rows * c.d, 1})
                        : dview(d, num_pages, rows, c.kv_heads, c.d);
  };
  Dev<T> dk(device_layout(kc)), dv(device_layout(vc)), dq(q), dkn(kn), dvn(vn),
      dout(poisoned<T>(c.batch, c.sq, c.heads, c.d));
  Dev<float> dlse(poisoned<float>(oracle_lse.size()));
  Dev<std::int32_t> dseq(seqlens), dtable(table);
  KVCache cache;
  cache.k = cache_view(dk);
  cache.v = cache_view(dv);
  cache.seqlens = dseq.ptr;
  if (c.paged) {
    cache.block_table = dtable.ptr;
    cache.max_pages = pages_per_seq;
  }
  DecodeOptions dec;
  dec.num_splits = c.splits;
  dec.keys_per_split = c.keys_per_split;
  TensorView knv = dkn.view(), vnv = dvn.view();
  if (c.seqlen_new > 0) {
    dec.k_new = &knv;
    dec.v_new = &vnv;
  }
  Dev<float> d_cos(rot.cos), d_sin(rot.sin);
  RotaryTables d_rot = rot.tables;
  d_rot.cos = d_cos.ptr;
  d_rot.sin = d_sin.ptr;
  if (c.rotary) dec.rotary = &d_rot;
  TensorView lv = TensorView::contiguous(dlse.ptr, c.batch, c.heads, c.sq);
  Dev<float> d_sinks(sinks);
  if (c.sinks) o.sinks = {d_sinks.ptr, static_cast<std::int64_t>(d_sinks.n)};
  cuda::attention_decode(dq.view(), cache, dout.view(), o, dec, &lv);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<T> out = dout.get();
  EXPECT_TRUE(meets_textbook_rule(max_error(out, oracle), base, kForwardFactor, textbook_floor<T>()));
  EXPECT_EQ(count_nan(out), 0);
  EXPECT_LE(max_error(dlse.get(), oracle_lse), 2e-3);
  if (c.seqlen_new > 0) {  // the append landed where the oracle put it (rotated, with rotary)
    const auto kh = dk.get();
    Tensor<T> want_k = kn;
    for (std::int64_t b = 0; b < c.batch && c.rotary; ++b)
      rotate_rows<float>(want_k, b, 0, rot.tables, [&](std::int64_t j) { return seqlens[b] + j; });
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t j = 0; j < c.seqlen_new; ++j) {
        const std::int64_t pos = seqlens[b] + j;
        const std::int64_t page = c.paged ? table[b * pages_per_seq + pos / c.page_size] : b;
        const std::int64_t slot = c.paged ? pos % c.page_size : pos;
        const std::int64_t at =
            c.head_major ? (page * c.kv_heads * rows + slot) * c.d : (page * rows + slot) * c.kv_heads * c.d;
        if (!c.rotary) EXPECT_EQ(kh[at].bits, kn.at(b, j, 0, 0).bits);
        if (c.rotary)  // the device's f32 rotation may round to T differently from the host's
          EXPECT_NEAR(detail::load<double>(kh[at]), detail::load<double>(want_k.at(b, j, 0, 0)),
                      0.02 * (1 + std::abs(detail::load<double>(kh[at]))));
      }
  }
}

}  // namespace attn::test
