// DecodeOptions::quantized_query's rounding of a query row, restated for the tests from its definition
// (include/attn/decode.hpp), not taken from the library: scale = max |q| / 127 in f32, each element
// becomes code x scale with code = q / scale rounded to nearest even; a row whose scale would be below
// f32's normal range (zero included) becomes zero.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace attn::test {

inline void round_query_row(float* row, std::int64_t d) {
  float amax = 0;
  for (std::int64_t x = 0; x < d; ++x) amax = std::max(amax, std::fabs(row[x]));
  const float scale = amax / 127.0f;
  for (std::int64_t x = 0; x < d; ++x)
    row[x] = scale >= std::numeric_limits<float>::min() ? std::nearbyint(row[x] / scale) * scale : 0.0f;
}

}  // namespace attn::test
