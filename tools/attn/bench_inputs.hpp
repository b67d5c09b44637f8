// Shared by `attn bench prefill` and `attn bench backward`: comma-list arguments and random inputs
// stored in the benchmark's dtype.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/tensor.hpp"
#include "units.hpp"

namespace attn::cli {

inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

inline std::vector<std::int64_t> parse_counts(const std::string& text, const char* flag, std::int64_t min) {
  std::vector<std::int64_t> out;
  for (const auto& s : split_list(text)) {
    const std::int64_t v = parse_count(s, flag);
    if (v < min) throw UsageError(std::string(flag) + ": must be >= " + std::to_string(min) + ", got " + s);
    out.push_back(v);
  }
  if (out.empty()) throw UsageError(std::string(flag) + ": empty list");
  return out;
}

inline DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  if (s == "f64") return DType::f64;
  throw UsageError("--dtype: must be f32, bf16, f16 or f64, got " + s);
}

// Random inputs in [-1, 1), stored in the benchmark's dtype.
struct Buffer {
  std::vector<unsigned char> bytes;
  DType dtype;
  Buffer(std::int64_t n, DType t, std::uint64_t seed) : bytes(static_cast<std::size_t>(n) * dtype_size(t)), dtype(t) {
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < n; ++i) {
      const float f = dist(rng);
      unsigned char* p = bytes.data() + i * dtype_size(t);
      if (t == DType::f32)
        std::memcpy(p, &f, 4);
      else if (t == DType::f64) {
        const double x = f;
        std::memcpy(p, &x, 8);
      } else if (t == DType::bf16) {
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        const std::uint16_t h = static_cast<std::uint16_t>(u >> 16);
        std::memcpy(p, &h, 2);
      } else {
        const _Float16 h = static_cast<_Float16>(f);
        std::memcpy(p, &h, 2);
      }
    }
  }
  TensorView view(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    TensorView v = TensorView::contiguous(reinterpret_cast<const float*>(bytes.data()), b, s, h, d);
    v.dtype = dtype;
    return v;
  }
};

}  // namespace attn::cli
