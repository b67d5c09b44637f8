// Counts heap bytes in use through the global operator new/delete of the program that links this
// library, so a tool or test can measure the peak memory of one call honestly (everything attn
// allocates goes through operator new: std::vector, std::unique_ptr<T[]>).
#pragma once

#include <cstddef>

namespace attn::tools {

std::size_t heap_in_use();
// Peak of heap_in_use() since the last reset_heap_peak().
std::size_t heap_peak();
void reset_heap_peak();

// RAII: the peak heap growth (bytes above the level at construction) while it lives.
class HeapPeakScope {
 public:
  HeapPeakScope();
  std::size_t peak_growth() const;

 private:
  std::size_t base_;
};

}  // namespace attn::tools
