/* mixprec's CUDA emulator: the runtime (tests/cuda_emu/README.md).
 *
 * A launch runs its blocks one after another, in an order drawn from
 * EMU_SEED (0: in index order). A block's threads are fibers on this OS
 * thread, each with its own stack; the scheduler resumes every runnable
 * thread (in a seeded order, redrawn each pass) until it finishes or waits:
 *   - at __syncthreads*: released when every live thread of the block waits
 *     at a barrier, all at the same one (else: divergent barrier, abort);
 *   - at a warp operation with a mask: completed when every lane the mask
 *     names waits at one with the same mask (a named lane that has exited,
 *     a mask that leaves the caller out, a shuffle reading a lane outside
 *     the mask: abort);
 *   - at __activemask: answered, when nothing else can move, with the lanes
 *     of its warp waiting at the same __activemask (full reconvergence).
 * Nothing runnable and nothing that can complete is a deadlock: abort with
 * the file:line of every waiting thread. Device and shared memory start
 * filled with EMU_FILL (default 0xcd); cudaMalloc blocks carry guard bytes
 * checked at cudaFree. Streams are eager; capture records into graphs. */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#error "tests/cuda_emu: the fiber switch is written for x86-64"
#endif

/* ---- fibers --------------------------------------------------------------
 * emu_swap saves the callee-saved registers on the current stack, stores
 * its pointer in *save_sp and resumes the stack to_sp. The floating-point
 * control registers are not switched: no kernel changes them. */
extern "C" void emu_swap(void **save_sp, void *to_sp);
__asm__(R"(
  .text
  .p2align 4
  .globl emu_swap
  .hidden emu_swap
  .type emu_swap,@function
emu_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_swap,.-emu_swap
)");

namespace emu {

enum { RUN, BAR, WARP, AMASK, DONE };
static const char *const kStateName[] = {"running", "__syncthreads", "warp op", "__activemask", "exited"};

struct Thread {
  void *sp;
  int state;
  uint3 tid;
  int lin, lane, warp;
  int kind;
  unsigned mask;
  uint64_t val, result;
  int arg, width;
  Site at;
};

Thread *cur = nullptr;
uint3 block_idx;
dim3 block_dim, grid_dim;

namespace {
constexpr size_t kSmemLimit = 48 * 1024; /* per block without an opt-in attribute */
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kGuard = 256;

std::vector<char *> stacks;
std::vector<Thread> threads;
int n_threads = 0, live = 0;
void *sched_sp = nullptr;
const Body *body = nullptr;
Site launch_site{"?", 0};
size_t dyn_smem = 0, smem_used = 0;
alignas(64) unsigned char smem[kSmemLimit];
std::vector<std::pair<const void *, size_t>> svars;
cudaError_t sticky = cudaSuccess;
/* xorshift64*: cheap enough to redraw a block's thread order every pass. */
struct Rng {
  using result_type = uint64_t;
  uint64_t x = 1;
  static constexpr uint64_t min() { return 0; }
  static constexpr uint64_t max() { return ~0ull; }
  uint64_t operator()() {
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    return x * 0x2545f4914f6cdd1dull;
  }
  void seed(uint64_t s) { x = s * 0x9e3779b97f4a7c15ull | 1; }
} rng;
long long seed_v = -2;

long long seed() {
  if (seed_v == -2) {
    const char *e = getenv("EMU_SEED");
    seed_v = e ? atoll(e) : 1;
    rng.seed((uint64_t)seed_v);
  }
  return seed_v;
}

void describe_thread(FILE *f) {
  if (!cur) return;
  fprintf(f, "  in block (%u,%u,%u) thread (%u,%u,%u) of the launch at %s:%d (EMU_SEED=%lld)\n",
          block_idx.x, block_idx.y, block_idx.z, cur->tid.x, cur->tid.y, cur->tid.z,
          launch_site.file, launch_site.line, seed());
}

/* The current pass over the block: threads[order[pos..]] are still to be
 * resumed. A thread that waits or exits switches straight to the next
 * runnable one (one switch, not two through the scheduler). */
std::vector<int> order, ready_next; /* this pass; made runnable for the next */
size_t pos = 0;
std::vector<int> dirty;             /* warps with a lane newly waiting or exited */
std::vector<char> is_dirty;
int n_bar = 0, n_amask = 0;

void make_ready(Thread &t) {
  t.state = RUN;
  ready_next.push_back(t.lin);
}
void mark_dirty(int w) {
  if (!is_dirty[w]) is_dirty[w] = 1, dirty.push_back(w);
}

void *next_sp() {
  while (pos < order.size()) {
    Thread &t = threads[order[pos++]];
    if (t.state == RUN) {
      cur = &t;
      return t.sp;
    }
  }
  cur = nullptr;
  return sched_sp;
}

void fiber_main() {
  Thread *t = cur;
  (*body)();
  t->state = DONE;
  live--;
  mark_dirty(t->warp);
  emu_swap(&t->sp, next_sp());
  __builtin_unreachable();
}

void *fresh_stack(int i) {
  while ((int)stacks.size() <= i) {
    void *m = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) { perror("cuda_emu: mmap"); abort(); }
    mprotect(m, 4096, PROT_NONE); /* overflow faults instead of corrupting */
    stacks.push_back((char *)m);
  }
  /* Tops staggered: stacks 256 KB apart would all map to the same cache
   * sets, and a switch would miss on every one. */
  uint64_t *top = (uint64_t *)(stacks[i] + kStackBytes - (size_t)(i % 64) * 320 - (size_t)(i / 64 % 4) * 80);
  top[-1] = 0;
  top[-2] = (uint64_t)(uintptr_t)&fiber_main;
  for (int r = 3; r <= 8; r++) top[-r] = 0; /* rbp rbx r12-r15 */
  return &top[-8];
}

void wait_here() {
  Thread *t = cur;
  emu_swap(&t->sp, next_sp());
}

struct SiteLess {
  bool operator()(const Site &a, const Site &b) const {
    int c = a.file == b.file ? 0 : strcmp(a.file, b.file);
    return c ? c < 0 : a.line < b.line;
  }
};
bool same_site(const Site &a, const Site &b) { return a.line == b.line && (a.file == b.file || !strcmp(a.file, b.file)); }

/* Every waiting thread's place, grouped, then abort. */
[[noreturn]] void dump_and_abort(const char *what) {
  fprintf(stderr, "cuda_emu: %s in block (%u,%u,%u) of the launch at %s:%d (EMU_SEED=%lld); waiting threads:\n",
          what, block_idx.x, block_idx.y, block_idx.z, launch_site.file, launch_site.line, seed());
  std::map<std::pair<int, Site>, std::vector<int>, bool (*)(const std::pair<int, Site> &, const std::pair<int, Site> &)>
      groups([](const std::pair<int, Site> &a, const std::pair<int, Site> &b) {
        if (a.first != b.first) return a.first < b.first;
        return SiteLess()(a.second, b.second);
      });
  for (auto &t : threads)
    if (t.state != DONE && t.state != RUN) groups[{t.state, t.at}].push_back(t.lin);
  for (auto &g : groups) {
    fprintf(stderr, "  %s:%d: %zu thread(s) at %s (thread %d", g.first.second.file, g.first.second.line,
            g.second.size(), kStateName[g.first.first], g.second[0]);
    for (size_t i = 1; i < g.second.size() && i < 4; i++) fprintf(stderr, ", %d", g.second[i]);
    fprintf(stderr, g.second.size() > 4 ? ", ...)\n" : ")\n");
  }
  int exited = 0;
  for (auto &t : threads) exited += t.state == DONE;
  fprintf(stderr, "  %d thread(s) of %d have exited\n", exited, n_threads);
  abort();
}

bool is_shuffle(int k) { return k >= W_SHFL_IDX && k <= W_SHFL_XOR; }

/* Completes the warp operations of warp w whose masks have all arrived. */
bool resolve_warp(int w) {
  const int base = w * 32, nl = std::min(32, n_threads - base);
  bool progress = false;
  for (int l = 0; l < nl; l++) {
    Thread &t = threads[base + l];
    if (t.state != WARP) continue;
    const unsigned m = t.mask;
    cur = &t;
    if (!((m >> l) & 1u)) fail(t.at, "lane %d calls a warp operation with mask 0x%08x, which leaves it out", l, m);
    bool ready = true;
    for (int j = 0; j < 32 && ready; j++) {
      if (!((m >> j) & 1u)) continue;
      if (j >= nl) fail(t.at, "mask 0x%08x names lane %d, which does not exist (block of %d threads)", m, j, n_threads);
      const Thread &u = threads[base + j];
      if (u.state == DONE) fail(t.at, "mask 0x%08x names lane %d, which has exited", m, j);
      if (u.state != WARP || u.mask != m) ready = false;
    }
    cur = nullptr;
    if (!ready) continue;
    uint64_t ballot = 0;
    for (int j = 0; j < nl; j++) {
      if (!((m >> j) & 1u)) continue;
      const Thread &u = threads[base + j];
      if (u.kind != t.kind && !(is_shuffle(u.kind) && is_shuffle(t.kind))) {
        cur = &t;
        fail(t.at, "lanes of one mask 0x%08x meet at different warp operations: lane %d here, lane %d at %s:%d",
             m, l, j, u.at.file, u.at.line);
      }
      ballot |= (uint64_t)(u.val != 0) << j;
    }
    for (int j = 0; j < nl; j++) {
      if (!((m >> j) & 1u)) continue;
      Thread &u = threads[base + j];
      cur = &u;
      switch (u.kind) {
        case W_SYNC: u.result = 0; break;
        case W_BALLOT: u.result = ballot; break;
        case W_ANY: u.result = ballot != 0; break;
        case W_ALL: u.result = ballot == m; break;
        case W_MATCH_ANY: {
          uint64_t r = 0;
          for (int i = 0; i < nl; i++)
            if (((m >> i) & 1u) && threads[base + i].val == u.val) r |= 1ull << i;
          u.result = r;
          break;
        }
        default: {
          const int wd = u.width;
          if (wd < 1 || wd > 32 || (wd & (wd - 1)))
            fail(u.at, "shuffle width %d is not a power of two in [1, 32]", wd);
          const int seg = j / wd * wd;
          int src = j;
          if (u.kind == W_SHFL_IDX) src = seg + (u.arg & (wd - 1));
          else if (u.kind == W_SHFL_UP) src = j - seg >= u.arg ? j - u.arg : j;
          else if (u.kind == W_SHFL_DOWN) src = j - seg + u.arg < wd ? j + u.arg : j;
          else if (u.kind == W_SHFL_XOR) src = ((j ^ u.arg) / wd == j / wd) ? (j ^ u.arg) : j;
          if (src < 0 || src >= 32 || !((m >> src) & 1u))
            fail(u.at, "shuffle of lane %d reads lane %d, outside its mask 0x%08x", j, src, m);
          u.result = threads[base + src].val;
        }
      }
      cur = nullptr;
    }
    for (int j = 0; j < nl; j++)
      if ((m >> j) & 1u) make_ready(threads[base + j]);
    progress = true;
  }
  return progress;
}

bool resolve_barrier() {
  if (n_bar == 0 || n_bar != live) return false;
  n_bar = 0;
  const Thread *first = nullptr;
  int agg_or = 0, agg_and = 1, count = 0;
  for (auto &t : threads) {
    if (t.state != BAR) continue;
    if (!first) first = &t;
    else if (!same_site(first->at, t.at) || first->kind != t.kind) dump_and_abort("divergent __syncthreads");
    agg_or |= (int)t.val; agg_and &= (int)t.val; count += (int)t.val;
  }
  for (auto &t : threads) {
    if (t.state != BAR) continue;
    t.result = t.kind == 0 ? agg_or : t.kind == 1 ? agg_and : count;
    make_ready(t);
  }
  return true;
}

bool resolve_activemask() {
  if (n_amask == 0) return false;
  bool progress = false;
  for (auto &t : threads) {
    if (t.state != AMASK) continue;
    const int base = t.warp * 32, nl = std::min(32, n_threads - base);
    unsigned m = 0;
    for (int j = 0; j < nl; j++) {
      const Thread &u = threads[base + j];
      if (u.state == AMASK && same_site(u.at, t.at)) m |= 1u << j;
    }
    for (int j = 0; j < nl; j++)
      if ((m >> j) & 1u) threads[base + j].result = m, make_ready(threads[base + j]), n_amask--;
    progress = true;
  }
  return progress;
}

void run_block(uint3 b, int order_seed) {
  block_idx = b;
  n_threads = (int)(block_dim.x * block_dim.y * block_dim.z);
  smem_used = (dyn_smem + 15) / 16 * 16;
  svars.clear();
  memset(smem, fill_byte(), dyn_smem);
  threads.assign(n_threads, Thread{});
  const int n_warps = (n_threads + 31) / 32;
  is_dirty.assign(n_warps, 0);
  dirty.clear();
  ready_next.clear();
  n_bar = n_amask = 0;
  for (int i = 0; i < n_threads; i++) {
    ready_next.push_back(order_seed < 0 ? n_threads - 1 - i : i);
    Thread &t = threads[i];
    t.lin = i, t.lane = i % 32, t.warp = i / 32, t.state = RUN;
    t.tid = uint3{i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y)};
    t.sp = fresh_stack(i);
  }
  live = n_threads;
  for (;;) {
    bool progress = false;
    order.swap(ready_next);
    ready_next.clear();
    if (order_seed > 0) std::shuffle(order.begin(), order.end(), rng);
    else if (order_seed < 0) std::sort(order.begin(), order.end(), std::greater<int>());
    else std::sort(order.begin(), order.end());
    pos = 0;
    void *sp = next_sp();
    if (sp != sched_sp) {
      emu_swap(&sched_sp, sp);
      progress = true;
    }
    if (live == 0) break;
    for (size_t i = 0; i < dirty.size(); i++) {
      is_dirty[dirty[i]] = 0;
      progress |= resolve_warp(dirty[i]);
    }
    dirty.clear();
    if (!progress) progress = resolve_barrier();
    if (!progress) progress = resolve_activemask();
    if (!progress) dump_and_abort("deadlock");
  }
}

void run_grid(Site at, dim3 grid, dim3 block, size_t smem_bytes, const Body &b) {
  const Site saved_site = launch_site;
  launch_site = at;
  grid_dim = grid, block_dim = block, dyn_smem = smem_bytes, body = &b;
  const uint64_t nb = (uint64_t)grid.x * grid.y * grid.z;
  const long long s = seed();
  std::vector<uint64_t> order;
  if (s > 0 && nb <= (1u << 24)) {
    order.resize(nb);
    for (uint64_t i = 0; i < nb; i++) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
  }
  for (uint64_t k = 0; k < nb; k++) {
    const uint64_t i = !order.empty() ? order[k] : s < 0 ? nb - 1 - k : k;
    run_block(uint3{(unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y), (unsigned)(i / grid.x / grid.y)},
              (int)(s > 0 ? 1 : s < 0 ? -1 : 0));
  }
  body = nullptr;
  launch_site = saved_site;
}

/* ---- host side: memory, streams, capture ---------------------------------- */
struct Alloc { size_t bytes; unsigned char *raw; };
std::map<uintptr_t, Alloc> allocs;
size_t allocated = 0;
std::set<cudaStream_t> streams;
struct Capture { cudaStream_t s = nullptr; int mode = 0; bool active = false, invalid = false; std::vector<Body> ops; } cap;
struct Graph { std::vector<Body> ops; };
std::set<Graph *> graphs, execs;
constexpr unsigned char kGuardByte = 0xa5;
constexpr size_t kBudget = (size_t)4 << 30;

bool capture_forbids(const char *what) {
  if (cap.active && cap.mode != cudaStreamCaptureModeRelaxed) {
    fprintf(stderr, "cuda_emu: %s during stream capture: the capture is invalidated\n", what);
    cap.invalid = true;
    return true;
  }
  return false;
}
void check_stream(cudaStream_t s, const char *what) {
  if (s && !streams.count(s)) fail(Site{"?", 0}, "%s on stream %p, which is not a live stream", what, (void *)s);
}
}  // namespace

uint8_t fill_byte() {
  static int f = -1;
  if (f < 0) {
    const char *e = getenv("EMU_FILL");
    f = e ? (int)strtol(e, nullptr, 0) & 0xff : 0xcd;
  }
  return (uint8_t)f;
}

void fail(Site at, const char *fmt, ...) {
  if (at.line > 0) fprintf(stderr, "cuda_emu: %s:%d: ", at.file, at.line);
  else fprintf(stderr, "cuda_emu: ");
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  describe_thread(stderr);
  abort();
}

uint3 &thread_idx() {
  if (!cur) fail(Site{"?", 0}, "threadIdx read outside a kernel");
  return cur->tid;
}

void syncthreads(Site at) { syncthreads_red(1, 0, at); }

int syncthreads_red(int pred, int op, Site at) {
  Thread *t = cur;
  if (!t) fail(at, "__syncthreads outside a kernel");
  t->state = BAR, t->kind = op, t->val = (uint64_t)pred, t->at = at;
  n_bar++;
  wait_here();
  return (int)t->result;
}

uint64_t warp_op(int kind, unsigned mask, uint64_t value, int arg, int width, Site at) {
  Thread *t = cur;
  if (!t) fail(at, "warp operation outside a kernel");
  t->state = WARP, t->kind = kind, t->mask = mask, t->val = value, t->arg = arg, t->width = width, t->at = at;
  mark_dirty(t->warp);
  wait_here();
  return t->result;
}

unsigned activemask(Site at) {
  Thread *t = cur;
  if (!t) fail(at, "__activemask outside a kernel");
  t->state = AMASK, t->at = at;
  n_amask++;
  wait_here();
  return (unsigned)t->result;
}

void *shared_var(const void *key, size_t bytes, size_t align) {
  for (auto &v : svars)
    if (v.first == key) return smem + v.second;
  const size_t off = (smem_used + align - 1) / align * align;
  if (off + bytes > kSmemLimit)
    fail(Site{"?", 0}, "shared memory of the block (%zu dynamic + static) exceeds %zu bytes", dyn_smem, kSmemLimit);
  memset(smem + off, fill_byte(), bytes);
  svars.push_back({key, off});
  smem_used = off + bytes;
  return smem + off;
}

void *dynamic_shared() { return smem; }

void launch_bounds(int max_threads, Site at) {
  if ((int)(block_dim.x * block_dim.y * block_dim.z) > max_threads)
    fail(at, "a block of %u threads exceeds the kernel's __launch_bounds__(%d): the launch fails on a GPU",
         block_dim.x * block_dim.y * block_dim.z, max_threads);
}

int submit(Site at, dim3 grid, dim3 block, size_t smem_bytes, void *stream, Body b) {
  const uint64_t nthr = (uint64_t)block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535 ||
      block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      nthr > 1024) {
    sticky = cudaErrorInvalidConfiguration;
    return 0;
  }
  if (smem_bytes > kSmemLimit) {
    sticky = cudaErrorInvalidValue;
    return 0;
  }
  cudaStream_t s = (cudaStream_t)stream;
  check_stream(s, "kernel launch");
  auto op = [at, grid, block, smem_bytes, b] { run_grid(at, grid, block, smem_bytes, b); };
  if (cap.active && s == cap.s) {
    cap.ops.push_back(op);
  } else if (cap.active && s == nullptr && cap.mode == cudaStreamCaptureModeGlobal) {
    cap.invalid = true;
    sticky = cudaErrorStreamCaptureImplicit;
  } else {
    op();
  }
  return 0;
}

cudaError_t stream_op(cudaStream_t s, const char *what, std::function<void()> op) {
  check_stream(s, what);
  if (cap.active && s == cap.s) {
    cap.ops.push_back(std::move(op));
    return cudaSuccess;
  }
  if (cap.active && s == nullptr && cap.mode == cudaStreamCaptureModeGlobal) {
    cap.invalid = true;
    return cudaErrorStreamCaptureImplicit;
  }
  op();
  return cudaSuccess;
}

namespace {
const Alloc *find_alloc(const void *p, uintptr_t *base) {
  auto it = allocs.upper_bound((uintptr_t)p);
  if (it == allocs.begin()) return nullptr;
  --it;
  if ((uintptr_t)p >= it->first + std::max<size_t>(it->second.bytes, 1)) return nullptr;
  *base = it->first;
  return &it->second;
}
}  // namespace

bool is_device(const void *p) {
  uintptr_t b;
  return find_alloc(p, &b) != nullptr;
}

void check_device_range(const void *p, size_t bytes, const char *what) {
  if (bytes == 0) return;
  uintptr_t b;
  const Alloc *a = find_alloc(p, &b);
  if (!a || (uintptr_t)p + bytes > b + a->bytes)
    fail(Site{"?", 0}, "%s: [%p, +%zu) is not inside one live cudaMalloc allocation%s", what, p, bytes,
         a ? " (it runs past the end)" : "");
}

}  // namespace emu

using namespace emu;

cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }

cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = nullptr;
  if (capture_forbids("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
  if (bytes == 0) return cudaSuccess;
  if (bytes > kBudget || allocated + bytes > kBudget) return cudaErrorMemoryAllocation;
  const size_t body = (bytes + kGuard - 1) / kGuard * kGuard;
  unsigned char *raw = (unsigned char *)aligned_alloc(kGuard, kGuard + body + kGuard);
  if (!raw) return cudaErrorMemoryAllocation;
  memset(raw, kGuardByte, kGuard);
  memset(raw + kGuard, fill_byte(), bytes);
  memset(raw + kGuard + bytes, kGuardByte, body - bytes + kGuard);
  *p = raw + kGuard;
  allocs[(uintptr_t)*p] = Alloc{bytes, raw};
  allocated += bytes;
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  if (capture_forbids("cudaFree")) return cudaErrorStreamCaptureUnsupported;
  auto it = allocs.find((uintptr_t)p);
  if (it == allocs.end()) fail(Site{"?", 0}, "cudaFree(%p): not a live cudaMalloc pointer", p);
  const Alloc a = it->second;
  const size_t body = (a.bytes + kGuard - 1) / kGuard * kGuard;
  for (size_t i = 0; i < kGuard; i++)
    if (a.raw[i] != kGuardByte) fail(Site{"?", 0}, "cudaFree(%p): bytes before the %zu-byte allocation were written", p, a.bytes);
  for (size_t i = kGuard + a.bytes; i < kGuard + body + kGuard; i++)
    if (a.raw[i] != kGuardByte) fail(Site{"?", 0}, "cudaFree(%p): bytes past the end of the %zu-byte allocation were written (offset %zu)", p, a.bytes, i - kGuard);
  allocated -= a.bytes;
  allocs.erase(it);
  free(a.raw);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  *free_bytes = kBudget - allocated;
  *total_bytes = kBudget;
  return cudaSuccess;
}

static cudaError_t copy_checked(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDefault) {
    kind = (cudaMemcpyKind)((is_device(src) ? 2 : 0) + (is_device(dst) ? 1 : 0));
    kind = kind == 3 ? cudaMemcpyDeviceToDevice : kind == 2 ? cudaMemcpyDeviceToHost : kind == 1 ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost;
  }
  if (kind < 0 || kind > 3) return cudaErrorInvalidMemcpyDirection;
  if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) check_device_range(dst, bytes, "cudaMemcpy destination");
  if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice) check_device_range(src, bytes, "cudaMemcpy source");
  if (kind == cudaMemcpyHostToDevice && bytes && is_device(src)) fail(Site{"?", 0}, "cudaMemcpyHostToDevice from device memory %p", src);
  if (kind == cudaMemcpyDeviceToHost && bytes && is_device(dst)) fail(Site{"?", 0}, "cudaMemcpyDeviceToHost into device memory %p", dst);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  if (capture_forbids("cudaMemcpy")) return cudaErrorStreamCaptureUnsupported;
  const cudaError_t e = copy_checked(dst, src, bytes, kind);
  if (e == cudaSuccess && bytes) memmove(dst, src, bytes);
  return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  const cudaError_t e = copy_checked(dst, src, bytes, kind);
  if (e != cudaSuccess) return e;
  return stream_op(s, "cudaMemcpyAsync", [=] { if (bytes) memmove(dst, src, bytes); });
}

cudaError_t cudaMemset(void *p, int v, size_t bytes) {
  if (capture_forbids("cudaMemset")) return cudaErrorStreamCaptureUnsupported;
  check_device_range(p, bytes, "cudaMemset");
  if (bytes) memset(p, v, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
  check_device_range(p, bytes, "cudaMemsetAsync");
  return stream_op(s, "cudaMemsetAsync", [=] { if (bytes) memset(p, v, bytes); });
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
  *s = (cudaStream_t) new char(0);
  streams.insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!streams.count(s)) return cudaErrorInvalidResourceHandle;
  if (cap.active && cap.s == s) fail(Site{"?", 0}, "cudaStreamDestroy of a stream that is capturing");
  streams.erase(s);
  delete (char *)s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  check_stream(s, "cudaStreamSynchronize");
  if (cap.active && (s == cap.s || s == nullptr)) {
    cap.invalid = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  if (capture_forbids("cudaDeviceSynchronize")) return cudaErrorStreamCaptureUnsupported;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = sticky;
  sticky = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return sticky; }
const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    default: return "cudaError (emulated)";
  }
}
const char *cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (s == nullptr) return cudaErrorStreamCaptureUnsupported;
  check_stream(s, "cudaStreamBeginCapture");
  if (cap.active) return cudaErrorInvalidValue;
  cap = Capture{};
  cap.s = s, cap.mode = mode, cap.active = true;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  if (!cap.active || cap.s != s) return cudaErrorStreamCaptureUnmatched;
  const bool invalid = cap.invalid;
  Graph *gr = invalid ? nullptr : new Graph{std::move(cap.ops)};
  cap = Capture{};
  *g = (cudaGraph_t)gr;
  if (invalid) return cudaErrorStreamCaptureInvalidated;
  graphs.insert(gr);
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *st) {
  *st = cap.active && cap.s == s ? (cap.invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive)
                                 : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long) {
  Graph *gr = (Graph *)g;
  if (!graphs.count(gr)) return cudaErrorInvalidValue;
  Graph *e = new Graph{gr->ops};
  execs.insert(e);
  *exec = (cudaGraphExec_t)e;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  Graph *e = (Graph *)exec;
  if (!execs.count(e)) return cudaErrorInvalidValue;
  return stream_op(s, "cudaGraphLaunch", [e] { for (auto &op : e->ops) op(); });
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Graph *e = (Graph *)exec;
  if (!execs.erase(e)) return cudaErrorInvalidValue;
  delete e;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  Graph *gr = (Graph *)g;
  if (!graphs.erase(gr)) return cudaErrorInvalidValue;
  delete gr;
  return cudaSuccess;
}
