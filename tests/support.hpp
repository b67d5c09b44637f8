// Test helpers: the common tensor type, error measure and accuracy rule (tests/common/), problem shapes
// and options, and a run of a test once per SIMD target.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <hwy/targets.h>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "common/accuracy.hpp"
#include "common/error.hpp"
#include "common/rejection.hpp"
#include "common/tensor.hpp"
#include "cpu/dpbf16.hpp"
#include "core/element.hpp"
#include "cpu/target_names.hpp"

namespace attn::test {

// Sets the environment variable `name` (or unsets it, for nullopt) for one test, and puts back what was
// there.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::optional<std::string>& value) : name_(std::move(name)) {
    if (const char* v = std::getenv(name_.c_str())) saved_ = v;
    set(value);
  }
  ~ScopedEnv() { set(saved_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const std::optional<std::string>& value) const {
    if (value)
      setenv(name_.c_str(), value->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  std::string name_;
  std::optional<std::string> saved_;
};

// ATTN_AMX for one test.
class ScopedAmxEnv : public ScopedEnv {
 public:
  explicit ScopedAmxEnv(const std::optional<std::string>& value) : ScopedEnv("ATTN_AMX", value) {}
};

// Sanitizer builds run -O0 instrumented code, 20-60x slower than the release build, and the AArch64
// build's tests run under qemu-aarch64, about as slow (tests/CMakeLists.txt defines ATTN_TEST_SANITIZED
// for both). They look for bad memory accesses and races, or for the Arm kernels' agreement with the
// rules, which a shorter cache finds as well (still several splits, pages and partial tiles), so the
// heaviest sweeps take `sanitized` as their largest size there and `full` in the release suite, which
// keeps the numerical claims at full size.
#ifdef ATTN_TEST_SANITIZED
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
constexpr std::int64_t full_or_sanitized(std::int64_t full, std::int64_t sanitized) {
  return kSanitizedBuild ? sanitized : full;
}

// A problem's shape and flash-attn mask options, as the parameterised tests list them.
struct Shape {
  std::int64_t b, sq, sk, h, hk, d;
  bool causal;
  std::int64_t left = -1, right = -1;
  double softcap = 0;
  bool alibi = false;
  bool sinks = false;  // attention sinks (sinks_for)
};

// Sink logits for `heads` heads, around the scores' range, every third head without one (-inf).
inline std::vector<float> sinks_for(std::int64_t heads) {
  std::vector<float> s;
  for (std::int64_t h = 0; h < heads; ++h) s.push_back(h % 3 == 1 ? -INFINITY : 0.8f * float(h) - 1.0f);
  return s;
}

// The AttentionOptions of a Shape. With alibi, the slopes are slope_base / (1 + x) per (batch, head),
// stored in `slopes`, which must outlive the options.
inline AttentionOptions options_of(const Shape& s, float slope_base, std::vector<float>& slopes) {
  AttentionOptions o;
  o.causal = s.causal;
  o.window_left = s.left;
  o.window_right = s.right;
  o.softcap = s.softcap;
  slopes.clear();
  for (std::int64_t x = 0; x < s.b * s.h; ++x) slopes.push_back(slope_base / float(1 + x));
  if (s.alibi) {
    o.alibi_slopes = slopes;
    o.alibi_batch_stride = s.h;
  }
  return o;
}

// The options of a Shape (options_of), with its sinks (sinks_for) where it has them, and the arrays they
// point to. Not copied: the options point into this object.
struct ShapeOptions {
  std::vector<float> slopes, sinks;
  AttentionOptions opts;
  ShapeOptions(const Shape& s, float slope_base) : sinks(sinks_for(s.h)), opts(options_of(s, slope_base, slopes)) {
    if (s.sinks) opts.sinks = sinks;
  }
  ShapeOptions(const ShapeOptions&) = delete;
  ShapeOptions& operator=(const ShapeOptions&) = delete;
};

// One attention_decode call's cache and appended rows. It owns the k_new / v_new views the options
// point to, so it is neither copied nor moved.
struct DecodeCall {
  KVCache cache;
  DecodeOptions dec;
  TensorView k_new, v_new;
  DecodeCall(const TensorView& k, const TensorView& v, const std::int32_t* seqlens) {
    cache.k = k;
    cache.v = v;
    cache.seqlens = seqlens;
  }
  DecodeCall(const DecodeCall&) = delete;
  DecodeCall& operator=(const DecodeCall&) = delete;
  // Appends k_new, and v_new unless null (MLA: k_new alone).
  DecodeCall& append(const TensorView& k, const TensorView* v = nullptr) {
    k_new = k;
    dec.k_new = &k_new;
    if (v) v_new = *v;
    dec.v_new = v ? &v_new : nullptr;
    return *this;
  }
};

// ---- SIMD targets ----
// libattn's Highway kernels are compiled once per target of HWY_TARGETS (as this file sees it: same
// compiler and flags) minus the targets a kernel leaves out, and dispatch at run time to the best
// target the CPU supports. Tests pin the dispatch to one target at a time with Highway's
// SetSupportedTargetsForTest, so that an AVX-512 machine also tests the AVX2, SSE4 and scalar code.
//
// ATTN_ISA (optional): a comma-separated list of target names as hwy::TargetName spells them, in any
// case (avx3_dl, avx3, avx2, sse4, ssse3, and emu128 or scalar, whichever this Highway build has),
// pins every test of the binary to those targets: the per-target loops run only those (and fail when
// a kernel was compiled for none of them), every other test dispatches to the best of them.

// The targets of HWY_TARGETS that this CPU supports, read before anything is pinned (isa_targets(),
// which every pin calls first, reads it).
inline std::int64_t cpu_targets() {
  static const std::int64_t mask = hwy::SupportedTargets() & HWY_TARGETS;
  return mask;
}

using detail::target_names;

// The targets ATTN_ISA names, restricted to cpu_targets(); 0 when it is unset or empty. A name that
// is no target, or a list the CPU runs none of, throws std::invalid_argument.
inline std::int64_t isa_targets() {
  static const std::int64_t mask = [] {
    cpu_targets();
    const char* env = std::getenv("ATTN_ISA");
    if (env == nullptr || *env == '\0') return std::int64_t{0};
    return detail::parse_target_list(env, HWY_TARGETS, cpu_targets(), "ATTN_ISA");
  }();
  return mask;
}

// While alive, Highway dispatches to `target` (a single target bit) only; afterwards back to the
// targets ATTN_ISA allows, or to every supported one. RAII, so that a test that throws does not
// leave the next test pinned. (Highway has no getter for the pin: these scopes do not nest.)
class PinTarget {
 public:
  explicit PinTarget(std::int64_t target) {
    isa_targets();  // reads the CPU's targets, the first time, while nothing is pinned yet
    hwy::SetSupportedTargetsForTest(target);
  }
  ~PinTarget() { hwy::SetSupportedTargetsForTest(isa_targets()); }
  PinTarget(const PinTarget&) = delete;
  PinTarget& operator=(const PinTarget&) = delete;
};

// The target the decode kernel's dispatch picks now, as simd_targets' `dispatched`. decode_simd.cpp
// exports no Target() of its own (as the tiled and backward kernels do: tiled_target, backward_target),
// so this is Highway's choice restated: the best target supported now (the pin's) among those decode
// is compiled for, HWY_TARGETS less ATTN_DECODE_DISABLED_TARGETS (CMakeLists.txt: SVE, on AArch64),
// else the static target.
inline std::int64_t decode_dispatched() {
  const std::int64_t run = hwy::SupportedTargets() & HWY_TARGETS & ~std::int64_t{ATTN_DECODE_DISABLED_TARGETS};
  return run != 0 ? run & -run : std::int64_t{HWY_STATIC_TARGET};
}

// The targets to test a kernel on: those this CPU supports (and ATTN_ISA allows) that the kernel was
// compiled for, best first. `dispatched` returns the target the kernel's own dispatch picks now (e.g.
// detail::tiled_target); with it, a target the kernel leaves out (its dispatch falls back to another
// one) is skipped. nullptr: the kernel is compiled for every target of HWY_TARGETS. The first call per
// kernel name prints the list, and what was skipped, to stdout.
inline std::vector<std::int64_t> simd_targets(const char* kernel, std::int64_t (*dispatched)() = nullptr) {
  const std::int64_t allowed = isa_targets() != 0 ? isa_targets() : cpu_targets();
  std::vector<std::int64_t> run;
  std::int64_t ran = 0, skipped = 0;
  for (std::int64_t t = allowed; t != 0; t &= t - 1) {
    const std::int64_t target = t & -t;  // lower bits are the better targets
    bool compiled = true;
    if (dispatched != nullptr) {
      const PinTarget pin(target);
      compiled = dispatched() == target;
    }
    if (compiled) {
      run.push_back(target);
      ran |= target;
    } else {
      skipped |= target;
    }
  }
  static std::mutex mu;
  static std::set<std::string> printed;
  const std::lock_guard<std::mutex> lock(mu);
  if (printed.insert(kernel).second)
    std::printf("[  TARGETS ] %s:%s%s%s\n", kernel, target_names(ran).c_str(), skipped ? "; not compiled in:" : "",
                target_names(skipped).c_str());
  return run;
}

// While alive, the kernels' bf16 paths take VDPBF16PS (on) or widen to f32 (off), whatever the CPU's
// default (detail::bf16_dots); afterwards the default again. RAII, as PinTarget.
class ForceBf16Dots {
 public:
  explicit ForceBf16Dots(bool on) { detail::force_bf16_dots(on ? 1 : 0); }
  ~ForceBf16Dots() { detail::force_bf16_dots(-1); }
  ForceBf16Dots(const ForceBf16Dots&) = delete;
  ForceBf16Dots& operator=(const ForceBf16Dots&) = delete;
};

// A kernel dispatched to `target` has the bf16 dot-product path on this CPU: an AVX-512 target
// (ATTN_DPBF16_TARGET) on a CPU with AVX512-BF16.
inline bool has_bf16_dot_path(std::int64_t target) {
  return (target == HWY_AVX3 || target == HWY_AVX3_DL) && detail::cpu_has_avx512bf16();
}

// The bf16 modes a target runs in: both the dot-product path and the widening one where it has both
// (whichever the CPU's default is, both are tested), else the one.
inline std::vector<int> bf16_dot_modes(std::int64_t target) {
  return has_bf16_dot_path(target) ? std::vector<int>{1, 0} : std::vector<int>{-1};
}

// f(target) once per target of simd_targets(kernel, dispatched) and bf16 mode of it (bf16_dot_modes),
// with the dispatch pinned to it and every failure inside naming both. Fails if there is no target.
template <class F>
void for_each_simd_target(const char* kernel, std::int64_t (*dispatched)(), F&& f) {
  const std::vector<std::int64_t> targets = simd_targets(kernel, dispatched);
  EXPECT_FALSE(targets.empty()) << kernel << ": no SIMD target to test"
                                << (isa_targets() != 0 ? " among ATTN_ISA's" + target_names(isa_targets()) : "");
  for (const std::int64_t target : targets)
    for (const int mode : bf16_dot_modes(target)) {
      SCOPED_TRACE(::testing::Message() << "SIMD target " << hwy::TargetName(target)
                                        << (mode < 0 ? ""
                                            : mode   ? ", bf16 dot products"
                                                     : ", bf16 widened"));
      const PinTarget pin(target);
      std::optional<ForceBf16Dots> force;
      if (mode >= 0) force.emplace(mode == 1);
      if (dispatched != nullptr) ASSERT_EQ(dispatched(), target) << kernel << " did not dispatch to the pinned target";
      f(target);
    }
}

// Registered by every test binary that includes this file: with ATTN_ISA set, every test runs pinned to
// its targets (an ATTN_ISA that names nothing runnable fails the run before any test).
class IsaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    try {
      if (isa_targets() != 0) {
        hwy::SetSupportedTargetsForTest(isa_targets());
        std::printf("[  TARGETS ] ATTN_ISA=%s: every test dispatches to%s\n", std::getenv("ATTN_ISA"),
                    target_names(isa_targets()).c_str());
      }
    } catch (const std::invalid_argument& e) {
      FAIL() << e.what();
    }
  }
};
inline ::testing::Environment* const isa_environment = ::testing::AddGlobalTestEnvironment(new IsaEnvironment);

}  // namespace attn::test
