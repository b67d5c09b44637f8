// attn._C's per-rank objects for attn.distributed (python/attn/distributed.py): context parallelism whose
// transport is torch.distributed's and whose arithmetic is libattn's, the same as attn_mpi's
// (src/distributed/: RingAccumulator, RingGradAccumulator, the sharded decode's slice, the fields the
// ranks agree on). Each object validates its rank's arguments when built (AttnError naming the
// argument and the rule, nothing written), reports what the ranks must agree on, and then, once Python
// has gathered every rank's lengths, folds the chunks Python hands it. It holds the arrays its views
// point into, so the tensors stay alive while it does.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "decode_args.hpp"
#include "distributed/agreement.hpp"
#include "distributed/ring_block.hpp"
#include "distributed/ring_grad.hpp"
#include "distributed/shard_slice.hpp"
#include "validate/backward_problem.hpp"
#include "validate/decode_problem.hpp"
#include "views.hpp"

namespace attn_py {
namespace {

namespace detail = attn::detail;
using Array = nb::ndarray<nb::device::cpu>;
using Options = BasicOptions<Array>;
using Fields = std::vector<std::tuple<std::string, std::string, std::int64_t>>;

Fields as_tuples(const std::vector<detail::SharedField>& fields) {
  Fields out;
  for (const detail::SharedField& f : fields) out.emplace_back(f.arg, f.what, f.value);
  return out;
}

// Where this rank sits in the whole sequence, from every rank's lengths (gathered by Python). Checked
// against this rank's own, so that a caller's mistake is an error rather than a read out of bounds.
struct Placement {
  std::vector<std::int64_t> lengths_q, lengths_k;
  int rank = 0;
  std::int64_t total_q = 0, total_k = 0;
};

Placement placement(const char* who, std::vector<std::int64_t> lq, std::vector<std::int64_t> lk, int rank,
                    const detail::Problem& p) {
  if (lq.empty() || lq.size() != lk.size())
    reject(who, "lengths_q", "must hold one length per rank, as lengths_k does");
  if (rank < 0 || rank >= static_cast<int>(lq.size())) reject(who, "rank", "must be in [0, ranks)");
  if (lq[static_cast<std::size_t>(rank)] != p.seqlen_q || lk[static_cast<std::size_t>(rank)] != p.seqlen_k)
    reject(who, "lengths_q", "this rank's entries must equal its q's and k's seqlen");
  Placement at{std::move(lq), std::move(lk), rank, 0, 0};
  for (std::size_t r = 0; r < at.lengths_q.size(); ++r) {
    if (at.lengths_q[r] < 0 || at.lengths_k[r] < 0) reject(who, "lengths_q", "lengths must be >= 0");
    at.total_q += at.lengths_q[r];
    at.total_k += at.lengths_k[r];
  }
  return at;
}

// A chunk (or its running gradient) handed in by Python: [batch, rows, kv_heads, dim] of `dtype`, any
// strides. The accumulators trust their chunks' shapes, so a mismatch is refused here.
attn::TensorView chunk_view(const char* who, const char* arg, const Array& a, std::array<std::int64_t, 4> shape,
                            attn::DType dtype) {
  const attn::TensorView v = view_of(who, arg, a, 4);
  if (v.dtype != dtype || v.shape != shape)
    reject(who, arg,
           "must be [" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + ", " + std::to_string(shape[2]) +
               ", " + std::to_string(shape[3]) + "] of the ring's dtype");
  return v;
}

// What the forward and the backward objects share: the arrays, the options, the layout and the place, the
// validated problem P and its accumulator Acc (RingAccumulator or RingGradAccumulator), built by start().
template <class P, class Acc>
struct RingBase {
  std::string who;
  std::vector<Array> arrays;  // every array a view points into
  Options options;
  bool zigzag = false;
  std::optional<Placement> at;
  detail::BlockCounts counts;

  attn::TensorView view(const char* arg, const Array& a, int rank) {
    arrays.push_back(a);
    return view_of(who.c_str(), arg, a, rank);
  }
  std::vector<detail::Segment> k_segments(int owner) const {
    if (owner < 0 || owner >= static_cast<int>(at->lengths_k.size()))
      reject(who.c_str(), "owner", "must be in [0, ranks)");
    return detail::ring_segments(zigzag, at->lengths_k, owner);
  }
  void require_started() const {
    if (!at) reject(who.c_str(), "start", "must be called before the chunks are folded");
  }
  std::tuple<std::int64_t, std::int64_t> blocks() const { return {counts.computed, counts.skipped}; }
  Fields shared_fields() const { return as_tuples(detail::ring_shared_fields(problem_, zigzag)); }
  std::tuple<std::int64_t, std::int64_t> seqlens() const { return {problem_.seqlen_q, problem_.seqlen_k}; }

  void start(std::vector<std::int64_t> lengths_q, std::vector<std::int64_t> lengths_k, int rank) {
    at = placement(who.c_str(), std::move(lengths_q), std::move(lengths_k), rank, problem_);
    acc_.emplace(problem_, detail::ring_segments(zigzag, at->lengths_q, rank), at->total_q, at->total_k);
  }

  P problem_{};
  std::optional<Acc> acc_;
};

// One rank's ring forward: RingAccumulator over its q, out and lse.
class RingForward : public RingBase<detail::Problem, detail::RingAccumulator> {
 public:
  RingForward(std::string who_, const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
              bool zigzag_, Options opts) {
    who = std::move(who_), options = std::move(opts), zigzag = zigzag_;
    const attn::AttentionOptions o = options.resolve(who.c_str(), q);
    const attn::TensorView qv = view("q", q, 4), kv = view("k", k, 4), vv = view("v", v, 4), ov = view("out", out, 4);
    lse_ = view("lse", lse, 3);
    problem_ = detail::validate(who, qv, kv, vv, &ov, o, &lse_);
    detail::check_ring_layout(who, problem_, zigzag);
  }
  RingForward(const RingForward&) = delete;
  RingForward& operator=(const RingForward&) = delete;

  void fold_chunk(const Array& k, const Array& v, int owner) {
    require_started();
    const std::vector<detail::Segment> segs = k_segments(owner);
    const std::int64_t rows = at->lengths_k[static_cast<std::size_t>(owner)];
    const detail::Problem& p = problem_;
    const attn::TensorView kv = chunk_view(who.c_str(), "k", k, {p.batch, rows, p.kv_heads, p.head_dim}, p.dtype),
                           vv = chunk_view(who.c_str(), "v", v, {p.batch, rows, p.kv_heads, p.head_dim_v}, p.dtype);
    nb::gil_scoped_release unlocked;
    acc_->fold_chunk(kv, vv, segs, counts);
  }

  void finish() {
    require_started();
    nb::gil_scoped_release unlocked;
    acc_->finish();
  }

 private:
  attn::TensorView lse_;  // the problem points at it
};

// One rank's ring backward: RingGradAccumulator over its q, out, dout and lse; the chunks' running dk,
// dv (the accumulator type) come with the chunks.
class RingBackward : public RingBase<detail::BackwardProblem, detail::RingGradAccumulator> {
 public:
  RingBackward(std::string who_, const std::vector<Array>& tensors, std::optional<Array> dsink, bool zigzag_,
               Options opts) {
    who = std::move(who_), options = std::move(opts), zigzag = zigzag_;
    static const char* names[] = {"q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv"};
    if (tensors.size() != 9) reject(who.c_str(), "tensors", "must be q, k, v, out, dout, lse, dq, dk, dv");
    attn::TensorView t[9];
    for (int i = 0; i < 9; ++i) t[i] = view(names[i], tensors[static_cast<std::size_t>(i)], i == 5 ? 3 : 4);
    const attn::AttentionOptions o = options.resolve(who.c_str(), tensors[0]);
    lse_ = t[5];
    if (dsink) {
      arrays.push_back(*dsink);
      dsink_ = sink_grad_view(who.c_str(), *dsink);
    }
    problem_ = detail::validate_backward(who, t[0], t[1], t[2], t[3], t[4], lse_, t[6], t[7], t[8], o,
                                         dsink ? &dsink_ : nullptr);
    detail::check_ring_layout(who, problem_, zigzag);
  }
  RingBackward(const RingBackward&) = delete;
  RingBackward& operator=(const RingBackward&) = delete;

  void add_chunk(const Array& k, const Array& v, const Array& dk, const Array& dv, int owner) {
    require_started();
    const std::vector<detail::Segment> segs = k_segments(owner);
    const detail::BackwardProblem& p = problem_;
    const std::int64_t rows = at->lengths_k[static_cast<std::size_t>(owner)];
    const char* w = who.c_str();
    const attn::DType acc = acc_->acc_dtype();
    const attn::TensorView kv = chunk_view(w, "k", k, {p.batch, rows, p.kv_heads, p.head_dim}, p.dtype),
                           vv = chunk_view(w, "v", v, {p.batch, rows, p.kv_heads, p.head_dim_v}, p.dtype),
                           dkv = chunk_view(w, "dk", dk, {p.batch, rows, p.kv_heads, p.head_dim}, acc),
                           dvv = chunk_view(w, "dv", dv, {p.batch, rows, p.kv_heads, p.head_dim_v}, acc);
    nb::gil_scoped_release unlocked;
    acc_->add_chunk(kv, vv, dkv, dvv, segs, counts);
  }

  // Writes this rank's dq, and its own chunk's finished dk, dv (back from their last hop, the
  // accumulator type) converted into the problem's dk, dv.
  void store(const Array& dk, const Array& dv) {
    require_started();
    const detail::BackwardProblem& p = problem_;
    const char* w = who.c_str();
    const attn::DType acc = acc_->acc_dtype();
    const attn::TensorView dkv = chunk_view(w, "dk", dk, {p.batch, p.seqlen_k, p.kv_heads, p.head_dim}, acc),
                           dvv = chunk_view(w, "dv", dv, {p.batch, p.seqlen_k, p.kv_heads, p.head_dim_v}, acc);
    nb::gil_scoped_release unlocked;
    acc_->store_dq();
    detail::convert_into(dkv, p.dk);
    detail::convert_into(dvv, p.dv);
  }

  // This rank's part of the sinks' gradient (its rows) into dsink; Python sums the ranks' in rank order.
  void sink_gradient() const {
    if (!problem_.dsink) reject(who.c_str(), "dsink", "was not given");
    nb::gil_scoped_release unlocked;
    detail::sink_gradient({problem_}, *problem_.dsink);
  }

 private:
  attn::TensorView lse_, dsink_;  // the problem points at them
};

// One rank's slice of a sharded decode (flash_attn_with_kvcache's arrays, no append, rotary or leftpad).
class ShardSlice {
 public:
  ShardSlice(std::string who, const Array& q, const Array& k_cache, const Array& v_cache, const Array& out,
             const Array& lse, const Array& cache_seqlens, std::optional<Array> block_table, std::int64_t num_splits,
             Options opts, std::optional<Array> k_scale, std::optional<Array> v_scale, const std::string& cache_type)
      : who_(std::move(who)),
        options_(std::move(opts)),
        arrays_{q, k_cache, v_cache, out, lse, cache_seqlens},
        call_(std::make_unique<DecodeCall<Array>>(who_.c_str(), q, k_cache, v_cache, out, lse, cache_seqlens,
                                                  block_table, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                                  std::nullopt, std::nullopt, false, num_splits, 0, k_scale, v_scale,
                                                  cache_type)) {
    for (const std::optional<Array>& a : {block_table, k_scale, v_scale})
      if (a) arrays_.push_back(*a);
    opts_ = options_.resolve(who_.c_str(), q);
    problem_ = detail::validate_decode(who_, call_->q, call_->cache, call_->out, opts_, call_->dec, call_->lse_ptr());
  }
  ShardSlice(const ShardSlice&) = delete;
  ShardSlice& operator=(const ShardSlice&) = delete;

  Fields shared_fields() const {
    std::vector<detail::SharedField> f = detail::decode_shared_fields(problem_);
    detail::append_rule_fields(f, problem_.rule, problem_.batch, problem_.heads);
    return as_tuples(f);
  }
  std::vector<std::int64_t> seqlens() const {
    std::vector<std::int64_t> n;
    for (std::int64_t b = 0; b < problem_.batch; ++b) n.push_back(problem_.seqlen_k(b));
    return n;
  }

  // This rank's partial state into out [batch, seqlen_q, heads, head_dim_v] and lse [batch, heads,
  // seqlen_q] of the accumulator type; all_seqlens: every rank's seqlens(), rank after rank.
  void partial(const std::vector<std::int64_t>& all_seqlens, int rank, const Array& out, const Array& lse) {
    const char* w = who_.c_str();
    const auto ranks = static_cast<std::int64_t>(all_seqlens.size()) / problem_.batch;
    if (ranks < 1 || static_cast<std::int64_t>(all_seqlens.size()) != ranks * problem_.batch || rank < 0 ||
        rank >= ranks)
      reject(w, "all_seqlens", "must hold batch key counts for each rank, this rank's among them");
    for (std::int64_t b = 0; b < problem_.batch; ++b)
      if (all_seqlens[static_cast<std::size_t>(rank * problem_.batch + b)] != problem_.seqlen_k(b))
        reject(w, "all_seqlens", "this rank's entries must equal its cache_seqlens");
    const std::vector<std::int64_t> shift = detail::slice_key_shift(all_seqlens, problem_.batch, rank);
    const attn::TensorView ov = view_of(w, "out", out, 4), lv = view_of(w, "lse", lse, 3);
    nb::gil_scoped_release unlocked;
    detail::decode_slice_partial(who_, call_->q, call_->cache, opts_, call_->dec, shift.data(), ov, lv);
  }

 private:
  std::string who_;
  Options options_;
  std::vector<Array> arrays_;
  std::unique_ptr<DecodeCall<Array>> call_;  // holds the views the problem points at
  attn::AttentionOptions opts_;
  detail::DecodeProblem problem_{};
};

// The objects' factories: flash-attn's keyword options (ATTN_OPTION_ARGS) become the Options they hold.
#define ATTN_OPTION_PARAMS                                                                                 \
  std::optional<double> scale, bool causal, std::int64_t wl, std::int64_t wr, double softcap,              \
      std::optional<Array> alibi, double dropout_p, std::uint64_t seed, std::uint64_t offset, int threads, \
      std::optional<Array> sinks
#define ATTN_OPTION_VALUES \
  Options { scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks) }

std::unique_ptr<RingForward> ring_forward(std::string who, const Array& q, const Array& k, const Array& v,
                                          const Array& out, const Array& lse, bool zigzag, ATTN_OPTION_PARAMS) {
  return std::make_unique<RingForward>(std::move(who), q, k, v, out, lse, zigzag, ATTN_OPTION_VALUES);
}

std::unique_ptr<RingBackward> ring_backward(std::string who, const std::vector<Array>& tensors,
                                            std::optional<Array> dsink, bool zigzag, ATTN_OPTION_PARAMS) {
  return std::make_unique<RingBackward>(std::move(who), tensors, std::move(dsink), zigzag, ATTN_OPTION_VALUES);
}

std::unique_ptr<ShardSlice> shard_slice(std::string who, const Array& q, const Array& k_cache, const Array& v_cache,
                                        const Array& out, const Array& lse, const Array& cache_seqlens,
                                        std::optional<Array> block_table, std::int64_t num_splits,
                                        std::optional<Array> k_scale, std::optional<Array> v_scale,
                                        const std::string& cache_type, ATTN_OPTION_PARAMS) {
  return std::make_unique<ShardSlice>(std::move(who), q, k_cache, v_cache, out, lse, cache_seqlens,
                                      std::move(block_table), num_splits, ATTN_OPTION_VALUES, std::move(k_scale),
                                      std::move(v_scale), cache_type);
}

}  // namespace

void register_distributed(nb::module_& m) {
  nb::class_<RingForward>(m, "RingForward", "One rank's ring attention forward (attn::detail::RingAccumulator).")
      .def("shared_fields", &RingForward::shared_fields, "(arg, what, value) that every rank must share")
      .def("seqlens", &RingForward::seqlens, "(seqlen_q, seqlen_k) of this rank's rows")
      .def("start", &RingForward::start, nb::arg("lengths_q"), nb::arg("lengths_k"), nb::arg("rank"))
      .def("fold_chunk", &RingForward::fold_chunk, nb::arg("k"), nb::arg("v"), nb::arg("owner"))
      .def("finish", &RingForward::finish, "folds the sinks and writes out and lse")
      .def("blocks", &RingForward::blocks, "(computed, skipped) blocks so far");
  nb::class_<RingBackward>(m, "RingBackward", "One rank's ring attention backward (RingGradAccumulator).")
      .def("shared_fields", &RingBackward::shared_fields)
      .def("seqlens", &RingBackward::seqlens)
      .def("start", &RingBackward::start, nb::arg("lengths_q"), nb::arg("lengths_k"), nb::arg("rank"))
      .def("add_chunk", &RingBackward::add_chunk, nb::arg("k"), nb::arg("v"), nb::arg("dk"), nb::arg("dv"),
           nb::arg("owner"))
      .def("store", &RingBackward::store, nb::arg("dk"), nb::arg("dv"))
      .def("sink_gradient", &RingBackward::sink_gradient)
      .def("blocks", &RingBackward::blocks);
  nb::class_<ShardSlice>(m, "ShardSlice", "One rank's slice of a sharded decode.")
      .def("shared_fields", &ShardSlice::shared_fields)
      .def("seqlens", &ShardSlice::seqlens)
      .def("partial", &ShardSlice::partial, nb::arg("all_seqlens"), nb::arg("rank"), nb::arg("out"), nb::arg("lse"));
  m.def("ring_forward", &ring_forward, nb::arg("who"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("zigzag"), ATTN_OPTION_ARGS,
        "A RingForward over this rank's q, k, v, out, lse (validated: AttnError naming the argument).");
  m.def("ring_backward", &ring_backward, nb::arg("who"), nb::arg("tensors"), nb::arg("dsink").none(), nb::arg("zigzag"),
        ATTN_OPTION_ARGS,
        "A RingBackward over this rank's [q, k, v, out, dout, lse, dq, dk, dv] (and dsink), validated.");
  m.def("shard_slice", &shard_slice, nb::arg("who"), nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"),
        nb::arg("out"), nb::arg("lse"), nb::arg("cache_seqlens"), nb::arg("block_table").none(),
        nb::arg("num_splits") = 0, nb::arg("k_scale").none() = nb::none(), nb::arg("v_scale").none() = nb::none(),
        nb::arg("cache_type") = "", ATTN_OPTION_ARGS, "A ShardSlice over this rank's cache slice, validated.");
}

}  // namespace attn_py
