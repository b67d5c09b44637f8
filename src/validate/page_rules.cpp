#include "validate/page_rules.hpp"

#include <string>

#include "core/checked.hpp"
#include "validate/problem.hpp"

namespace attn::detail {

Span int32_span(const std::int32_t* p, std::int64_t count) {
  if (!p || count <= 0) return {};
  const auto lo = reinterpret_cast<std::uintptr_t>(p);
  return {lo, lo + static_cast<std::uintptr_t>(count) * 4};
}

BlockTableShape check_block_table(std::string_view who, std::string_view arg, const std::int32_t* table,
                                  std::int64_t max_pages, std::int64_t stride, std::int64_t batch,
                                  std::int64_t page_size) {
  const std::string name(arg);
  const std::string base = name.substr(0, name.rfind('.') + 1);  // "cache." of "cache.block_table"
  if (table == nullptr) fail(who, arg, "data pointer is null");
  if (max_pages < 1) fail(who, base + "max_pages", "must be >= 1, got " + std::to_string(max_pages));
  const std::int64_t s = stride == 0 ? max_pages : stride;
  if (s < max_pages)
    fail(who, base + "block_table_stride",
         "must be >= max_pages (" + std::to_string(max_pages) + ") or 0, got " + std::to_string(stride));
  std::int64_t extent = 0, capacity = 0;
  if (!checked_mul(batch - 1, s, extent) || !checked_add(extent, max_pages, extent) ||
      extent > (std::int64_t{1} << 60) || !checked_mul(max_pages, page_size, capacity))
    fail(who, arg, "sizes overflow");
  return {s, capacity, int32_span(table, extent)};
}

void check_block_table_entries(std::string_view who, std::string_view arg, const std::int32_t* table,
                               std::int64_t stride, std::int64_t b, std::int64_t keys, std::int64_t page_size,
                               std::int64_t num_pages) {
  const std::int64_t pages = keys / page_size + (keys % page_size != 0);
  for (std::int64_t j = 0; j < pages; ++j) {
    const std::int64_t e = table[b * stride + j];
    if (e < 0 || e >= num_pages)
      fail(who, arg,
           "entry [" + std::to_string(b) + "][" + std::to_string(j) + "] = " + std::to_string(e) +
               " must be in [0, num_pages = " + std::to_string(num_pages) + ")");
  }
}

}  // namespace attn::detail
