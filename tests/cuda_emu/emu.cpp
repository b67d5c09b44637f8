// The CUDA emulator's engine (cuda_runtime.h): tracked "device" allocations, and blocks run as one
// fiber per thread on the calling OS thread. A fiber runs until it reaches __syncthreads, a warp
// collective or its end; then the next ready lane of its warp runs, or, when none is, a ready fiber of
// a warp drawn at random (fixed seed). A barrier opens
// when every live thread of the block has reached it (exited threads count as arrived, as on the
// hardware); a collective completes when all 32 lanes of the warp have reached the same one. Anything
// else -- lanes at different collectives, a collective missing an exited lane, a barrier some threads
// never reach -- is a deadlock on a GPU, and aborts here with the threads' positions.
//
// Fibers switch with a few instructions of assembly on x86-64 (callee-saved registers and the stack
// pointer; ~10 ns), and with ucontext elsewhere.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "cuda_runtime.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace attn_emu {
namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "attn CUDA emulator: %s\n", what);
  std::abort();
}

// ---- memory ------------------------------------------------------------------------------------------
std::map<std::uintptr_t, std::size_t>& allocations() {
  static std::map<std::uintptr_t, std::size_t> a;
  return a;
}
bool is_device(const void* p, std::size_t bytes) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  auto& a = allocations();
  auto it = a.upper_bound(u);
  if (it == a.begin()) return false;
  --it;
  return u >= it->first && u + bytes <= it->first + it->second;
}
cudaError_t last_error = cudaSuccess;

// ---- fibers ------------------------------------------------------------------------------------------
#if defined(__x86_64__)
extern "C" void attn_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .pushsection .text
  .globl attn_emu_switch
  .type attn_emu_switch, @function
attn_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw (%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr 8(%rsp)
  fldcw (%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size attn_emu_switch, .-attn_emu_switch
  .popsection
)");
#endif

constexpr std::size_t kStackBytes = 256 * 1024;

struct Copy {
  std::uint32_t dst;
  const void* src;
  int bytes;
};

struct Fiber {
  enum State { kReady, kAtBarrier, kAtCollective, kDone };
  std::unique_ptr<char[]> stack;
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
  uint3 tid;
  int warp = 0, lane = 0, parity = 0, kind = 0;
  State state = kReady;
  std::vector<Copy> open;                 // cp.async since the last commit
  std::vector<std::vector<Copy>> groups;  // committed, oldest first
};

struct Warp {
  alignas(16) std::uint8_t slots[2][32][kSlotBytes];
  float result[2][128];
  bool fresh[2] = {false, false};
  int arrived[2] = {0, 0};
  int lanes = 32;
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::vector<std::uint8_t> smem;
  uint3 idx;
  dim3 dim, grid;
  const std::function<void()>* body = nullptr;
  int current = 0, live = 0, at_barrier = 0;
  int barrier_or = 0, barrier_result = 0;  // __syncthreads_or: the OR so far, and the last barrier's
#if defined(__x86_64__)
  void* scheduler_sp = nullptr;
#else
  ucontext_t scheduler;
#endif
};

Block* g_block = nullptr;
std::uint64_t g_rng = 0x9E3779B97F4A7C15ull;  // the scheduler's choice of warp
std::vector<std::unique_ptr<char[]>> g_stack_pool;

Fiber& self() { return g_block->fibers[static_cast<std::size_t>(g_block->current)]; }

void yield() {
  Fiber& f = self();
#if defined(__x86_64__)
  attn_emu_switch(&f.sp, g_block->scheduler_sp);
#else
  swapcontext(&f.ctx, &g_block->scheduler);
#endif
}

void run_copies(std::vector<Copy>& copies) {
  for (const Copy& c : copies) {
    if (std::size_t{c.dst} + 16 > g_block->smem.size()) die("cp.async past the end of shared memory");
    if (c.bytes > 0 && !is_device(c.src, static_cast<std::size_t>(c.bytes)))
      die("cp.async reads outside every cudaMalloc allocation");
    // A zero-size copy reads nothing, but the kernels promise its address is still inside the tensor
    // (tile.cuh, RowSource): an index that ran past the end shows here.
    if (c.bytes == 0 && !is_device(c.src, 16))
      die("a zero-size cp.async names an address outside every cudaMalloc allocation");
    std::memset(g_block->smem.data() + c.dst, 0, 16);
    if (c.bytes > 0) std::memcpy(g_block->smem.data() + c.dst, c.src, static_cast<std::size_t>(c.bytes));
  }
  copies.clear();
}

void release_barrier_if_complete() {
  Block& b = *g_block;
  if (b.at_barrier == 0 || b.at_barrier < b.live) return;
  b.barrier_result = b.barrier_or;
  b.barrier_or = 0;
  for (Fiber& f : b.fibers)
    if (f.state == Fiber::kAtBarrier) f.state = Fiber::kReady;
  b.at_barrier = 0;
}

void fiber_main() {
  (*g_block->body)();
  Fiber& f = self();
  for (auto& g : f.groups) run_copies(g);  // what the thread still had in flight lands
  run_copies(f.open);
  f.state = Fiber::kDone;
  --g_block->live;
  Warp& w = g_block->warps[static_cast<std::size_t>(f.warp)];
  if (w.arrived[0] || w.arrived[1]) die("a lane exited while its warp waits in a collective");
  release_barrier_if_complete();
  yield();
  die("a finished fiber was resumed");
}

#if defined(__x86_64__)
extern "C" void attn_emu_fiber_entry() { fiber_main(); }
#endif

void start_fiber(Fiber& f) {
  char* top = f.stack.get() + kStackBytes;
#if defined(__x86_64__)
  // The frame attn_emu_switch pops: fpu control word and mxcsr, six registers, the return address
  // (the entry), and a dummy return address above it so the entry sees the stack as after a call.
  auto* sp = reinterpret_cast<std::uint64_t*>(reinterpret_cast<std::uintptr_t>(top) & ~std::uintptr_t{15});
  *--sp = 0;
  *--sp = reinterpret_cast<std::uint64_t>(&attn_emu_fiber_entry);
  for (int i = 0; i < 6; ++i) *--sp = 0;
  *--sp = 0x1F80;  // mxcsr (at +8)
  *--sp = 0x037F;  // x87 control word (at +0)
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.get();
  f.ctx.uc_stack.ss_size = kStackBytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, fiber_main, 0);
#endif
}

void run_block(Block& b) {
  g_block = &b;
  for (;;) {
    // The next lane of the current warp if one is ready; otherwise a warp drawn at random (a fixed
    // seed: runs repeat), so that warps drift apart between barriers as they may on the hardware and a
    // missing barrier between two warps' accesses gets a chance to show.
    int ready = -1;
    const int n = static_cast<int>(b.fibers.size());
    const int warp0 = b.current / 32 * 32, lanes = std::min(32, n - warp0);
    for (int k = 1; k < lanes && ready < 0; ++k) {
      const int i = warp0 + (b.current - warp0 + k) % lanes;
      if (b.fibers[static_cast<std::size_t>(i)].state == Fiber::kReady) ready = i;
    }
    if (ready < 0) {
      g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
      const int start = static_cast<int>((g_rng >> 33) % static_cast<std::uint64_t>(n)) / 32 * 32;
      for (int k = 0; k < n && ready < 0; ++k) {
        const int i = (start + k) % n;
        if (b.fibers[static_cast<std::size_t>(i)].state == Fiber::kReady) ready = i;
      }
    }
    if (ready < 0) {
      if (b.live == 0) break;
      for (const Fiber& f : b.fibers)
        if (f.state != Fiber::kDone)
          std::fprintf(stderr, "  thread (%u,%u,%u): %s\n", f.tid.x, f.tid.y, f.tid.z,
                       f.state == Fiber::kAtBarrier ? "at __syncthreads" : "in a warp collective");
      die("deadlock: no thread of the block can continue");
    }
    b.current = ready;
    Fiber& f = b.fibers[static_cast<std::size_t>(ready)];
#if defined(__x86_64__)
    attn_emu_switch(&b.scheduler_sp, f.sp);
#else
    swapcontext(&b.scheduler, &f.ctx);
#endif
  }
  g_block = nullptr;
}

}  // namespace

// ---- device side ---------------------------------------------------------------------------------------
const uint3& thread_idx() { return self().tid; }
const uint3& block_idx() { return g_block->idx; }
const dim3& block_dim() { return g_block->dim; }
const dim3& grid_dim() { return g_block->grid; }
int lane_id() { return self().lane; }
std::uint8_t* dynamic_smem() { return g_block->smem.data(); }

int syncthreads_or(int predicate) {
  g_block->barrier_or |= predicate != 0;
  syncthreads();
  return g_block->barrier_result;  // read before this thread can reach the next barrier
}

void syncthreads() {
  Fiber& f = self();
  f.state = Fiber::kAtBarrier;
  ++g_block->at_barrier;
  release_barrier_if_complete();
  while (f.state != Fiber::kReady) yield();
}

Exchange warp_exchange(const void* in, std::size_t bytes, int kind) {
  if (bytes > kSlotBytes) die("warp collective operand too large");
  Fiber& f = self();
  Warp& w = g_block->warps[static_cast<std::size_t>(f.warp)];
  const int par = f.parity;
  f.parity ^= 1;
  std::memcpy(w.slots[par][f.lane], in, bytes);
  f.kind = kind;
  if (++w.arrived[par] == w.lanes) {
    w.arrived[par] = 0;
    w.fresh[par] = true;
    for (Fiber& g : g_block->fibers)
      if (g.warp == f.warp && g.state == Fiber::kAtCollective) {
        if (g.kind != kind) die("the lanes of a warp reached different collectives");
        g.state = Fiber::kReady;
      }
  } else {
    for (const Fiber& g : g_block->fibers)
      if (g.warp == f.warp && g.state == Fiber::kDone) die("a warp collective after one of its lanes exited");
    f.state = Fiber::kAtCollective;
    while (f.state != Fiber::kReady) yield();
  }
  return {&w.slots[par][0][0], w.result[par], &w.fresh[par]};
}

int any_in_warp(int predicate) {
  const int in = predicate != 0;
  const Exchange e = warp_exchange(&in, sizeof in, kVote);
  const int lanes = g_block->warps[static_cast<std::size_t>(self().warp)].lanes;
  for (int lane = 0; lane < lanes; ++lane) {
    int x;
    std::memcpy(&x, e.slots + static_cast<std::size_t>(lane) * kSlotBytes, sizeof x);
    if (x) return 1;
  }
  return 0;
}

std::uint32_t smem_offset(const void* p) {
  const auto* q = static_cast<const std::uint8_t*>(p);
  const std::uint8_t* base = g_block->smem.data();
  if (q < base || q > base + g_block->smem.size()) die("a shared-memory address outside the block's shared memory");
  return static_cast<std::uint32_t>(q - base);
}
std::uint16_t smem_load16(std::uint32_t offset) {
  if (std::size_t{offset} + 2 > g_block->smem.size()) die("ldmatrix past the end of shared memory");
  std::uint16_t v;
  std::memcpy(&v, g_block->smem.data() + offset, 2);
  return v;
}
SmemStats& smem_stats() {
  static SmemStats s;
  return s;
}
void count_ldmatrix(const std::uint8_t* slots) {
  SmemStats& s = smem_stats();
  ++s.ldmatrix;
  for (int m = 0; m < 4; ++m) {
    std::uint32_t words[32];
    for (int r = 0; r < 8; ++r) {
      std::uint32_t addr;
      std::memcpy(&addr, slots + (8 * m + r) * kSlotBytes, sizeof addr);
      if (addr % 16 != 0) die("an ldmatrix row address that is not 16-byte aligned");
      for (int i = 0; i < 4; ++i) words[4 * r + i] = addr / 4 + static_cast<std::uint32_t>(i);
    }
    std::sort(words, words + 32);
    const auto distinct = std::unique(words, words + 32) - words;
    int per_bank[32] = {};
    for (std::ptrdiff_t i = 0; i < distinct; ++i) ++per_bank[words[i] % 32];
    s.ldmatrix_wavefronts += static_cast<std::uint64_t>(*std::max_element(per_bank, per_bank + 32));
  }
}

void cp_async(std::uint32_t dst, const void* src, int src_bytes) {
  if (src_bytes < 0 || src_bytes > 16) die("cp.async with a source size outside 0..16");
  if (std::size_t{dst} + 16 > g_block->smem.size()) die("cp.async past the end of shared memory");
  // The destination holds NaN from the issue until the thread's wait, where the data lands: a read in
  // between -- of the old contents (the copy was issued too early) or of the new (waited too late) --
  // sees NaN.
  std::memset(g_block->smem.data() + dst, 0xFF, 16);
  self().open.push_back({dst, src, src_bytes});
}
void cp_async_commit() {
  Fiber& f = self();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
void cp_async_wait(int groups_left) {
  Fiber& f = self();
  while (static_cast<int>(f.groups.size()) > groups_left) {
    run_copies(f.groups.front());
    f.groups.erase(f.groups.begin());
  }
}

void launch(dim3 grid, dim3 block, std::size_t smem_bytes, const std::function<void()>& body) {
  const std::size_t threads = std::size_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
      smem_bytes > kMaxDynamicSmem) {
    last_error = cudaErrorInvalidValue;
    return;
  }
  if (g_block) die("a kernel launched from inside a kernel");
  while (g_stack_pool.size() < threads) g_stack_pool.push_back(std::make_unique<char[]>(kStackBytes));
  Block b;
  b.dim = block;
  b.grid = grid;
  b.body = &body;
  b.fibers.resize(threads);
  b.warps.resize((threads + 31) / 32);
  for (std::size_t w = 0; w < b.warps.size(); ++w)
    b.warps[w].lanes = static_cast<int>(std::min<std::size_t>(32, threads - 32 * w));
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        b.idx = {x, y, z};
        b.smem.assign(smem_bytes, 0xFF);  // NaN in every float type: reads of unwritten shared memory show
        b.live = static_cast<int>(threads);
        b.at_barrier = b.barrier_or = b.barrier_result = 0;
        b.current = static_cast<int>(threads) - 1;
        for (std::size_t t = 0; t < threads; ++t) {
          Fiber& f = b.fibers[t];
          f.stack.reset();
          f.tid = {static_cast<unsigned>(t % block.x), static_cast<unsigned>(t / block.x % block.y),
                   static_cast<unsigned>(t / (std::size_t{block.x} * block.y))};
          f.warp = static_cast<int>(t / 32);
          f.lane = static_cast<int>(t % 32);
          f.parity = 0;
          f.state = Fiber::kReady;
          f.open.clear();
          f.groups.clear();
        }
        for (Warp& w : b.warps) w.arrived[0] = w.arrived[1] = 0;
        // Borrow the pooled stacks for this block's fibers.
        for (std::size_t t = 0; t < threads; ++t) {
          b.fibers[t].stack = std::move(g_stack_pool[t]);
          start_fiber(b.fibers[t]);
        }
        run_block(b);
        for (std::size_t t = 0; t < threads; ++t) g_stack_pool[t] = std::move(b.fibers[t].stack);
      }
}

// ---- runtime API -------------------------------------------------------------------------------------
cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  void* q = std::aligned_alloc(256, (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256);
  if (!q) return last_error = cudaErrorMemoryAllocation;
  allocations()[reinterpret_cast<std::uintptr_t>(q)] = std::max<std::size_t>(bytes, 1);
  *p = q;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  if (allocations().erase(reinterpret_cast<std::uintptr_t>(p)) == 0) return last_error = cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if ((src_dev && !is_device(src, bytes)) || (dst_dev && !is_device(dst, bytes)))
    return last_error = cudaErrorInvalidValue;
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  if (!is_device(p, bytes)) return last_error = cudaErrorInvalidValue;
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  *a = {};
  if (is_device(p, 1)) {
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMultiProcessorCount) return last_error = cudaErrorInvalidValue;
  *v = kSmCount;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
  std::snprintf(prop->name, sizeof prop->name, "attn CUDA emulator (CPU)");
  prop->multiProcessorCount = kSmCount;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return last_error; }
struct CUevent_st {
  std::chrono::steady_clock::time_point t;
};
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st{};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  e->t = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    default:
      return "unknown error";
  }
}

}  // namespace attn_emu
