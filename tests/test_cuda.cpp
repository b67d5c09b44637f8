// The CUDA backend against the CPU f64 oracle (label `gpu`). Every test draws fresh random data,
// poisons the outputs (NaN) before the call, and checks that every element was written; accuracy is the
// project's rule (DEVELOPERS.md / check_precision): error against the f64 oracle at most twice the
// textbook method's error at the same precision, plus a small slack. Without a usable GPU every test
// reports SKIPPED.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>

#include "attn/cuda.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::Tensor;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(x)

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  }
};

// A device copy of a host vector; freed on scope exit.
template <class T>
struct Dev {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    if (cudaMalloc(&ptr, std::max<std::size_t>(1, n) * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    if (n && cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) throw std::runtime_error("H2D");
  }
  Dev(const Dev&) = delete;
  ~Dev() { cudaFree(ptr); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n && cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) throw std::runtime_error("D2H");
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
double max_err(const std::vector<T>& got, const std::vector<double>& want, std::int64_t* not_written = nullptr) {
  double m = 0;
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = detail::load<double>(got[i]);
    if (std::isnan(g)) {
      ++bad;
      m = INFINITY;
      continue;
    }
    m = std::max(m, std::abs(g - want[i]));
  }
  if (not_written) *not_written = bad;
  return m;
}

double lse_err(const std::vector<float>& got, const std::vector<double>& want) {
  double m = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (double(got[i]) != want[i]) return INFINITY;
      continue;
    }
    m = std::max(m, std::abs(got[i] - want[i]));
  }
  return m;
}

struct Case : test::Shape {};

void PrintTo(const Case&, std::ostream* os) { *os << "(see the name)"; }

std::uint64_t fresh_seed() { return std::random_device{}(); }

// Forward on the GPU against the f64 oracle; the textbook method at T's precision sets the bar.
template <class T>
void check_forward(const Case& c) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " d " + std::to_string(c.d) + " causal " + std::to_string(c.causal));
  auto q = test::random_tensor<T>(c.b, c.sq, c.h, c.d, seed, 2.0), k = test::random_tensor<T>(c.b, c.sk, c.hk, c.d, seed + 1, 2.0),
       v = test::random_tensor<T>(c.b, c.sk, c.hk, c.d, seed + 2);
  std::vector<float> slopes;
  const AttentionOptions o_cpu = test::options_of(c, 0.3f, slopes);
  Dev<float> d_slopes(slopes);
  AttentionOptions o = o_cpu;
  if (c.alibi) o.alibi_slopes = d_slopes.ptr;
  auto q64 = test::to_f64(q), k64 = test::to_f64(k), v64 = test::to_f64(v);
  std::vector<double> oracle(q.data.size()), oracle_lse(static_cast<std::size_t>(c.b * c.h * c.sq));
  TensorView olv = TensorView::contiguous(oracle_lse.data(), c.b, c.h, c.sq);
  attention_reference(q64.view(), k64.view(), v64.view(), TensorView::contiguous(oracle.data(), c.b, c.sq, c.h, c.d), o_cpu, &olv);
  std::vector<T> textbook(q.data.size());
  attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(textbook.data(), c.b, c.sq, c.h, c.d), o_cpu);
  const double base = max_err(textbook, oracle);

  Dev<T> dq(q.data), dk(k.data), dv(v.data), dout(poisoned<T>(q.data.size()));
  Dev<float> dlse(poisoned<float>(oracle_lse.size()));
  TensorView lv = TensorView::contiguous(dlse.ptr, c.b, c.h, c.sq);
  cuda::attention(dview(dq, c.b, c.sq, c.h, c.d), dview(dk, c.b, c.sk, c.hk, c.d), dview(dv, c.b, c.sk, c.hk, c.d),
                  dview(dout, c.b, c.sq, c.h, c.d), o, &lv);
  CUDA_OK(cudaDeviceSynchronize());
  std::int64_t unwritten = 0;
  const double err = max_err(dout.get(), oracle, &unwritten);
  EXPECT_EQ(unwritten, 0) << "output elements never written";
  const double slack = std::is_same_v<T, bf16_t> ? 1e-3 : 1e-4;
  EXPECT_LE(err, 2 * base + slack) << "textbook error " << base;
  EXPECT_LE(lse_err(dlse.get(), oracle_lse), 2e-3) << "lse";
}

class GpuForward : public Gpu, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuForward, Bf16MatchesTheOracle) { check_forward<bf16_t>(GetParam()); }
TEST_P(GpuForward, F16MatchesTheOracle) { check_forward<f16_t>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuForward,
    ::testing::Values(Case{2, 130, 257, 4, 2, 64, false}, Case{2, 130, 257, 4, 2, 64, true},
                      Case{1, 257, 130, 4, 1, 128, true},   // seqlen_q > seqlen_k: fully masked rows
                      Case{2, 200, 333, 8, 2, 128, false}, Case{1, 300, 300, 2, 2, 128, true},
                      Case{1, 97, 161, 4, 4, 256, false}, Case{1, 161, 161, 4, 2, 256, true},
                      Case{1, 1, 1000, 4, 1, 128, false},   // one query row
                      Case{1, 1, 0, 2, 1, 64, false},        // no keys: out = 0, lse = -inf
                      Case{2, 150, 180, 4, 2, 128, false, 40, 7},  // sliding window
                      Case{1, 150, 180, 4, 2, 64, true, -1, -1, 5.0, true}),  // softcap + ALiBi
    [](const ::testing::TestParamInfo<Case>& i) {
      const Case& c = i.param;
      return "b" + std::to_string(c.b) + "_q" + std::to_string(c.sq) + "_k" + std::to_string(c.sk) + "_h" +
             std::to_string(c.h) + "x" + std::to_string(c.hk) + "_d" + std::to_string(c.d) + (c.causal ? "_causal" : "") +
             (c.left >= 0 || c.right >= 0 ? "_window" : "") + (c.softcap > 0 ? "_softcap" : "") + (c.alibi ? "_alibi" : "");
    });

TEST_F(Gpu, VarlenMatchesPerSequenceOracle) {
  const std::int64_t H = 4, HK = 2, D = 128;
  const std::vector<std::int32_t> lq = {17, 0, 200, 64}, lk = {50, 9, 200, 1};
  std::vector<std::int32_t> cq = {0}, ck = {0};
  for (std::size_t b = 0; b < lq.size(); ++b) {
    cq.push_back(cq.back() + lq[b]);
    ck.push_back(ck.back() + lk[b]);
  }
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto q = test::random_tensor<bf16_t>(1, cq.back(), H, D, seed, 2.0), k = test::random_tensor<bf16_t>(1, ck.back(), HK, D, seed + 1, 2.0),
       v = test::random_tensor<bf16_t>(1, ck.back(), HK, D, seed + 2);
  auto q64 = test::to_f64(q), k64 = test::to_f64(k), v64 = test::to_f64(v);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    std::vector<double> oracle(q.data.size(), 0.0), oracle_lse(static_cast<std::size_t>(H * cq.back()));
    std::vector<bf16_t> textbook(q.data.size());
    for (std::size_t b = 0; b < lq.size(); ++b) {
      if (lq[b] == 0) continue;
      auto sub = [&](auto& t, std::int32_t off, std::int32_t n, std::int64_t heads) {
        return TensorView::strided(t.data() + off * heads * D, {1, n, heads, D}, {0, heads * D, D, 1});
      };
      std::vector<double> l(static_cast<std::size_t>(H * lq[b]));
      TensorView lv = TensorView::contiguous(l.data(), 1, H, lq[b]);
      attention_reference(sub(q64.data, cq[b], lq[b], H), sub(k64.data, ck[b], lk[b], HK), sub(v64.data, ck[b], lk[b], HK),
                          sub(oracle, cq[b], lq[b], H), o, &lv);
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < lq[b]; ++i) oracle_lse[h * cq.back() + cq[b] + i] = l[h * lq[b] + i];
      attention_reference(sub(q.data, cq[b], lq[b], H), sub(k.data, ck[b], lk[b], HK), sub(v.data, ck[b], lk[b], HK),
                          sub(textbook, cq[b], lq[b], H), o);
    }
    const double base = max_err(textbook, oracle);
    Dev<bf16_t> dq(q.data), dk(k.data), dv(v.data), dout(poisoned<bf16_t>(q.data.size()));
    Dev<float> dlse(poisoned<float>(oracle_lse.size()));
    Dev<std::int32_t> dcq(cq), dck(ck);
    TensorView lv = TensorView::contiguous(dlse.ptr, 1, H, cq.back());
    cuda::VarlenBatch vb;
    vb.cu_seqlens_q = dcq.ptr;
    vb.cu_seqlens_k = dck.ptr;
    vb.batch = static_cast<std::int64_t>(lq.size());
    cuda::attention_varlen(dview(dq, 1, cq.back(), H, D), dview(dk, 1, ck.back(), HK, D), dview(dv, 1, ck.back(), HK, D),
                           dview(dout, 1, cq.back(), H, D), vb, o, &lv);
    CUDA_OK(cudaDeviceSynchronize());
    std::int64_t unwritten = 0;
    EXPECT_LE(max_err(dout.get(), oracle, &unwritten), 2 * base + 1e-3) << "causal " << causal;
    EXPECT_EQ(unwritten, 0);
    EXPECT_LE(lse_err(dlse.get(), oracle_lse), 2e-3);
  }
}

struct DecodeCase {
  std::int64_t batch, sq, heads, kv_heads, d, max_len;
  bool causal, paged;
  std::int64_t splits;  // 0 = automatic
  std::int64_t seqlen_new = 0;
  std::int64_t page_size = 64;
};

void PrintTo(const DecodeCase&, std::ostream* os) { *os << "(see the name)"; }

template <class T>
void check_decode(const DecodeCase& c) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  std::vector<std::int32_t> seqlens(static_cast<std::size_t>(c.batch));
  for (auto& s : seqlens) s = std::uniform_int_distribution<std::int32_t>(0, static_cast<std::int32_t>(c.max_len - c.seqlen_new))(rng);
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

  // The oracle: the CPU decode... no: the f64 reference on each sequence's gathered keys.
  AttentionOptions o;
  o.causal = c.causal;
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
    std::copy(q.data.begin() + b * c.sq * c.heads * c.d, q.data.begin() + (b + 1) * c.sq * c.heads * c.d, qb.data.begin());
    auto q64 = test::to_f64(qb), k64 = test::to_f64(kb), v64 = test::to_f64(vb);
    std::vector<double> l(static_cast<std::size_t>(c.heads * c.sq));
    TensorView lv = TensorView::contiguous(l.data(), 1, c.heads, c.sq);
    attention_reference(q64.view(), k64.view(), v64.view(),
                        TensorView::contiguous(oracle.data() + b * c.sq * c.heads * c.d, 1, c.sq, c.heads, c.d), o, &lv);
    std::copy(l.begin(), l.end(), oracle_lse.begin() + b * c.heads * c.sq);
    attention_reference(qb.view(), kb.view(), vb.view(),
                        TensorView::contiguous(textbook.data() + b * c.sq * c.heads * c.d, 1, c.sq, c.heads, c.d), o);
  }
  const double base = max_err(textbook, oracle);

  Dev<T> dk(kc.data), dv(vc.data), dq(q.data), dkn(kn.data), dvn(vn.data), dout(poisoned<T>(q.data.size()));
  Dev<float> dlse(poisoned<float>(oracle_lse.size()));
  Dev<std::int32_t> dseq(seqlens), dtable(table);
  KVCache cache;
  cache.k = dview(dk, num_pages, rows, c.kv_heads, c.d);
  cache.v = dview(dv, num_pages, rows, c.kv_heads, c.d);
  cache.seqlens = dseq.ptr;
  if (c.paged) {
    cache.block_table = dtable.ptr;
    cache.max_pages = pages_per_seq;
  }
  DecodeOptions dec;
  dec.num_splits = c.splits;
  TensorView knv = dview(dkn, c.batch, c.seqlen_new, c.kv_heads, c.d), vnv = dview(dvn, c.batch, c.seqlen_new, c.kv_heads, c.d);
  if (c.seqlen_new > 0) {
    dec.k_new = &knv;
    dec.v_new = &vnv;
  }
  TensorView lv = TensorView::contiguous(dlse.ptr, c.batch, c.heads, c.sq);
  cuda::attention_decode(dview(dq, c.batch, c.sq, c.heads, c.d), cache, dview(dout, c.batch, c.sq, c.heads, c.d), o, dec, &lv);
  CUDA_OK(cudaDeviceSynchronize());
  std::int64_t unwritten = 0;
  const double slack = std::is_same_v<T, bf16_t> ? 1e-3 : 1e-4;
  EXPECT_LE(max_err(dout.get(), oracle, &unwritten), 2 * base + slack) << "textbook " << base;
  EXPECT_EQ(unwritten, 0);
  EXPECT_LE(lse_err(dlse.get(), oracle_lse), 2e-3);
  if (c.seqlen_new > 0) {  // the append landed where the oracle put it
    const auto kh = dk.get();
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t j = 0; j < c.seqlen_new; ++j) {
        const std::int64_t pos = seqlens[b] + j;
        const std::int64_t page = c.paged ? table[b * pages_per_seq + pos / c.page_size] : b;
        const std::int64_t slot = c.paged ? pos % c.page_size : pos;
        EXPECT_EQ(kh[((page * rows + slot) * c.kv_heads) * c.d].bits, kn.at(b, j, 0, 0).bits);
      }
  }
}

class GpuDecode : public Gpu, public ::testing::WithParamInterface<DecodeCase> {};
TEST_P(GpuDecode, Bf16MatchesTheOracle) { check_decode<bf16_t>(GetParam()); }
TEST_P(GpuDecode, F16MatchesTheOracle) { check_decode<f16_t>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuDecode,
    ::testing::Values(DecodeCase{1, 1, 32, 8, 128, 5000, false, false, 0},   // the benchmark's shape, smaller
                      DecodeCase{3, 1, 32, 8, 128, 3000, false, false, 1},   // one split: no merge kernel
                      DecodeCase{3, 1, 32, 8, 128, 3000, false, false, 7},
                      DecodeCase{2, 3, 8, 2, 64, 2000, true, false, 5},      // speculative, causal
                      DecodeCase{2, 1, 16, 1, 256, 1500, false, true, 0},    // MQA, 16 rows per slab, paged
                      DecodeCase{4, 2, 40, 8, 128, 1200, true, true, 3, 0, 16},  // 10 rows x 2 queries: 2 slabs
                      DecodeCase{2, 1, 8, 8, 128, 700, false, true, 0, 5, 64}),  // append 5 new keys
    [](const ::testing::TestParamInfo<DecodeCase>& i) {
      const DecodeCase& c = i.param;
      return std::to_string(i.index) + "_b" + std::to_string(c.batch) + "_q" + std::to_string(c.sq) + "_h" +
             std::to_string(c.heads) + "x" + std::to_string(c.kv_heads) + "_d" + std::to_string(c.d) + "_n" +
             std::to_string(c.max_len) + (c.causal ? "_causal" : "") + (c.paged ? "_paged" : "_contiguous") + "_splits" +
             std::to_string(c.splits) + (c.seqlen_new ? "_append" : "");
    });

TEST_F(Gpu, RejectsHostPointersAndUnsupportedShapesWithoutWriting) {
  auto q = test::random_tensor<bf16_t>(1, 4, 2, 128, 1), k = test::random_tensor<bf16_t>(1, 8, 2, 128, 2);
  Dev<bf16_t> dq(q.data), dk(k.data), dv(k.data), dout(poisoned<bf16_t>(q.data.size()));
  // Host memory as an input.
  EXPECT_THROW(cuda::attention(q.view(), dview(dk, 1, 8, 2, 128), dview(dv, 1, 8, 2, 128), dview(dout, 1, 4, 2, 128)),
               std::invalid_argument);
  // f32 is CPU-only; head_dim 96 has no kernel.
  std::vector<float> f(4 * 2 * 128);
  Dev<float> df(f);
  EXPECT_THROW(cuda::attention(dview(df, 1, 4, 2, 128), dview(df, 1, 4, 2, 128), dview(df, 1, 4, 2, 128), dview(dout, 1, 4, 2, 128)),
               std::invalid_argument);
  EXPECT_THROW(cuda::attention(dview(dq, 1, 4, 2, 96), dview(dk, 1, 8, 2, 96), dview(dv, 1, 8, 2, 96), dview(dout, 1, 4, 2, 96)),
               std::invalid_argument);
  // The shared rules (here: heads not a multiple of kv_heads) come from core/validate.
  EXPECT_THROW(cuda::attention(dview(dq, 1, 4, 2, 128), dview(dk, 1, 4, 4, 64), dview(dv, 1, 4, 4, 64), dview(dout, 1, 4, 2, 128)),
               std::invalid_argument);
  for (auto x : dout.get()) ASSERT_EQ(x.bits, 0xFFFF) << "out was written by a rejected call";
}

}  // namespace
}  // namespace attn
