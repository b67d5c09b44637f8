// Argument validation of the backward pass (rules listed in validate/backward_problem.hpp). The forward's
// rules come from `validate` (validate/validate.cpp); this adds dout and the three gradients.
#include <string>
#include <utility>

#include "validate/backward_problem.hpp"
#include "validate/validate.hpp"

namespace attn::detail {
namespace {

constexpr const char* kDimNames[] = {"batch", "seqlen", "heads", "head_dim"};

void require_dtype(std::string_view who, std::string_view arg, const TensorView& t, DType want) {
  if (t.dtype != want)
    fail(who, arg,
         "dtype must match q's (" + std::string(dtype_name(want)) + "), got " + std::string(dtype_name(t.dtype)));
}

void require_shape(std::string_view who, std::string_view arg, const TensorView& t, std::string_view other,
                   const TensorView& like) {
  for (int i = 0; i < 4; ++i) require_equal(who, arg, kDimNames[i], t.shape[i], other, like.shape[i]);
}

}  // namespace

BackwardProblem validate_backward(std::string_view who, const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView& dout, const TensorView& lse,
                                  const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                  const AttentionOptions& opts, const TensorView* dsink) {
  BackwardProblem p{};
  static_cast<Problem&>(p) = validate(who, q, k, v, &out, opts, &lse);
  const Span s_dout = check_view(who, "dout", dout, 4, false);
  const Span s_dq = check_view(who, "dq", dq, 4, false);
  const Span s_dk = check_view(who, "dk", dk, 4, true);
  const Span s_dv = check_view(who, "dv", dv, 4, true);
  for (auto [name, t] :
       {std::pair<const char*, const TensorView*>{"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}})
    require_dtype(who, name, *t, q.dtype);
  require_shape(who, "dout", dout, "out", out);
  require_shape(who, "dq", dq, "q", q);
  require_shape(who, "dk", dk, "k", k);
  require_shape(who, "dv", dv, "v", v);

  const std::pair<const char*, Span> inputs[] = {{"q", check_view(who, "q", q, 4, false)},
                                                 {"k", check_view(who, "k", k, 4, true)},
                                                 {"v", check_view(who, "v", v, 4, true)},
                                                 {"out", check_view(who, "out", out, 4, false)},
                                                 {"dout", s_dout},
                                                 {"lse", check_view(who, "lse", lse, 3, false)}};
  const std::pair<const char*, Span> grads[] = {{"dq", s_dq}, {"dk", s_dk}, {"dv", s_dv}};
  const TensorView* grad_views[] = {&dq, &dk, &dv};
  for (int g = 0; g < 3; ++g) {
    check_no_self_alias(who, grads[g].first, *grad_views[g]);
    for (const auto& [name, s] : inputs)
      if (overlaps(grads[g].second, s)) fail(who, grads[g].first, std::string("overlaps input ") + name);
    for (int e = 0; e < g; ++e)
      if (overlaps(grads[g].second, grads[e].second))
        fail(who, grads[g].first, std::string("overlaps ") + grads[e].first);
  }
  if (dsink) {
    if (!opts.sinks) fail(who, "dsink", "needs sinks (it is their gradient; AttentionOptions::sinks is null)");
    const Span s = check_view(who, "dsink", *dsink, 3, false);
    if (dsink->shape[0] != 1 || dsink->shape[1] != p.heads || dsink->shape[2] != 1)
      fail(who, "dsink", "must be [1, heads = " + std::to_string(p.heads) + ", 1]");
    if (dsink->dtype != lse.dtype)
      fail(who, "dsink",
           "dtype must match lse's (" + std::string(dtype_name(lse.dtype)) + "), got " +
               std::string(dtype_name(dsink->dtype)));
    check_no_self_alias(who, "dsink", *dsink);
    for (const auto& [name, o] : inputs)
      if (overlaps(s, o)) fail(who, "dsink", std::string("overlaps input ") + name);
    for (const auto& [name, o] : grads)
      if (overlaps(s, o)) fail(who, "dsink", std::string("overlaps ") + name);
  }
  p.dsink = dsink;
  p.dout = dout;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  return p;
}

}  // namespace attn::detail
