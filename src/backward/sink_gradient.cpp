// The gradient of the attention sinks (validate/backward_problem.hpp, sink_gradient). With P_sink =
// exp(sink - lse) the sink's softmax weight in a row, out = sum_j p_j v_j and d p_j / d sink = -p_j P_sink,
// so d out / d sink = -P_sink out and d loss / d sink = -P_sink (dout . out), summed over the rows of the
// head. With dropout the same holds: the kept weights' common factor does not depend on the sink.
#include <cmath>
#include <limits>
#include <type_traits>

#include "validate/backward_problem.hpp"
#include "core/element.hpp"
#include "cpu/tile_ops.hpp"

namespace attn::detail {
namespace {

template <class T>
double row_dot(const TensorView& a, const TensorView& b, std::int64_t bi, std::int64_t i, std::int64_t h,
               std::int64_t d) {
  const T* x = row_ptr<const T>(a, bi, i, h);
  const T* y = row_ptr<const T>(b, bi, i, h);
  double s = 0;
  for (std::int64_t c = 0; c < d; ++c) s += load<double>(x[c * a.strides[3]]) * load<double>(y[c * b.strides[3]]);
  return s;
}

template <class T>
void run(const std::vector<BackwardProblem>& problems, const TensorView& dsink) {
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;  // lse's type
#pragma omp parallel for schedule(static) num_threads(resolve_threads(problems[0].num_threads))
  for (std::int64_t h = 0; h < dsink.shape[1]; ++h) {
    double acc = 0;
    for (const BackwardProblem& p : problems) {
      const double sink = p.rule.sink(h);
      const TensorView& lse = *p.lse;
      for (std::int64_t b = 0; b < p.batch; ++b)
        for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
          const double l =
              static_cast<const L*>(lse.data)[b * lse.strides[0] + h * lse.strides[1] + i * lse.strides[2]];
          if (l == -std::numeric_limits<double>::infinity()) continue;
          acc += std::exp(sink - l) * row_dot<T>(p.dout, p.out, b, i, h, p.head_dim_v);
        }
    }
    static_cast<L*>(dsink.data)[h * dsink.strides[1]] = static_cast<L>(acc == 0 ? 0.0 : -acc);
  }
}

}  // namespace

void sink_gradient(const std::vector<BackwardProblem>& problems, const TensorView& dsink) {
  if (problems.empty()) {  // no query row at all (a varlen batch of sequences without queries): no loss terms
    for (std::int64_t h = 0; h < dsink.shape[1]; ++h) {
      if (dsink.dtype == DType::f64)
        static_cast<double*>(dsink.data)[h * dsink.strides[1]] = 0;
      else
        static_cast<float*>(dsink.data)[h * dsink.strides[1]] = 0;
    }
    return;
  }
  dispatch_dtype(problems[0].dtype, [&]<class T>() { run<T>(problems, dsink); });
}

}  // namespace attn::detail
