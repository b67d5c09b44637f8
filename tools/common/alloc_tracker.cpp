#include "alloc_tracker.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<std::size_t> g_in_use{0};
std::atomic<std::size_t> g_peak{0};

// Each block carries its size in a header aligned for any type, so delete can subtract it.
constexpr std::size_t kHeader = alignof(std::max_align_t);

void* tracked_alloc(std::size_t n, std::size_t align) {
  const std::size_t header = align > kHeader ? align : kHeader;
  void* raw = nullptr;
  if (align > kHeader) {
    raw = std::aligned_alloc(align, (n + header + align - 1) / align * align);
  } else {
    raw = std::malloc(n + header);
  }
  if (!raw) throw std::bad_alloc();
  auto* base = static_cast<unsigned char*>(raw);
  *reinterpret_cast<std::size_t*>(base + header - sizeof(std::size_t)) = n;
  *reinterpret_cast<std::size_t*>(base + header - 2 * sizeof(std::size_t)) = header;
  const std::size_t now = g_in_use.fetch_add(n, std::memory_order_relaxed) + n;
  std::size_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return base + header;
}

void tracked_free(void* p) noexcept {
  if (!p) return;
  auto* user = static_cast<unsigned char*>(p);
  const std::size_t n = *reinterpret_cast<std::size_t*>(user - sizeof(std::size_t));
  const std::size_t header = *reinterpret_cast<std::size_t*>(user - 2 * sizeof(std::size_t));
  g_in_use.fetch_sub(n, std::memory_order_relaxed);
  std::free(user - header);
}
}  // namespace

void* operator new(std::size_t n) { return tracked_alloc(n, kHeader); }
void* operator new[](std::size_t n) { return tracked_alloc(n, kHeader); }
void* operator new(std::size_t n, std::align_val_t a) { return tracked_alloc(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return tracked_alloc(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { tracked_free(p); }
void operator delete[](void* p) noexcept { tracked_free(p); }
void operator delete(void* p, std::size_t) noexcept { tracked_free(p); }
void operator delete[](void* p, std::size_t) noexcept { tracked_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { tracked_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { tracked_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { tracked_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { tracked_free(p); }

namespace attn::tools {
std::size_t heap_in_use() { return g_in_use.load(std::memory_order_relaxed); }
std::size_t heap_peak() { return g_peak.load(std::memory_order_relaxed); }
void reset_heap_peak() { g_peak.store(g_in_use.load(std::memory_order_relaxed), std::memory_order_relaxed); }
HeapPeakScope::HeapPeakScope() : base_(heap_in_use()) { reset_heap_peak(); }
std::size_t HeapPeakScope::peak_growth() const {
  const std::size_t p = heap_peak();
  return p > base_ ? p - base_ : 0;
}
}  // namespace attn::tools
