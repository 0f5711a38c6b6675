// memory.cpp: what the kernel file's loads, stores and atomics go through.
//
//   hooks        __tsan_{read,write}N: GCC calls them before every memory access of the kernel
//                file; they classify the address (kernel argument, shared, own stack, module
//                data), count bytes per argument, and check bounds and races.
//   arena        the module's static shared memory, one place per __shared__ declaration.
#include "runtime.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>

// ---- static shared memory ------------------------------------------------------------------
extern "C" void* emu_shared_alloc(size_t size, size_t align) {
    if (!g_arena) {
        void* m = mmap(nullptr, kArena, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) abort();
        g_arena = static_cast<char*>(m);
        g_sh_lo = reinterpret_cast<uintptr_t>(g_arena);
    }
    size_t at = (g_sh_size + align - 1) / align * align;
    if (at + size > kArena) {
        set_fault(F_CONFIG, nullptr, nullptr, 0,
                  "the module's __shared__ declarations need more than %zu KiB in all",
                  kArena / 1024);
        if (g_cur) abort_fiber();
        abort();
    }
    memset(g_arena + at, 0xFF, size);  // poisoned, like every block's shared memory
    g_sh_size = at + size;
    // A GPU's limits, which the first run of each declaration reveals: static shared memory of
    // at most 48 KiB a kernel, and static + dynamic within 48 KiB unless the kernel opted in
    // (then the H100's 227 KiB). A device function's __shared__ counts for the first kernel
    // that runs it.
    const size_t k = static_cast<size_t>(g_cfg.kernel) % kMaxKernels;
    g_static_by_kernel[k] += size;
    const size_t total = g_static_by_kernel[k] + g_dyn_size;
    const size_t limit = g_cfg.shared_opt_in ? EMU_SHARED_OPTIN_LIMIT : EMU_SHARED_STATIC_LIMIT;
    if (g_cur && (g_static_by_kernel[k] > EMU_SHARED_STATIC_LIMIT || total > limit)) {
        set_fault(F_CONFIG, __builtin_return_address(0), nullptr, 0,
                  "shared memory over a GPU's limit: %zu bytes static + %zu dynamic; a kernel "
                  "may have 48 KiB of static shared memory (ptxas refuses more), and static + "
                  "dynamic within 48 KiB unless max_dynamic_shared_size_bytes is raised",
                  g_static_by_kernel[k], g_dyn_size);
        abort_fiber();
    }
    return g_arena + at;
}

// ---- memory classification, counting, bounds and race checks -------------------------------
void find_module_ranges() {
    g_nmod = 0;
    dl_iterate_phdr(
        [](struct dl_phdr_info* info, size_t, void*) -> int {
            uintptr_t self = reinterpret_cast<uintptr_t>(&emu_builtins);
            for (int pass = 0; pass < 2; ++pass) {
                bool mine = false;
                for (int i = 0; i < info->dlpi_phnum; ++i) {
                    const auto& ph = info->dlpi_phdr[i];
                    if (ph.p_type != PT_LOAD) continue;
                    uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
                    if (pass == 0) mine |= self >= lo && self < hi;
                    else if (g_nmod < 16) g_mod_lo[g_nmod] = lo, g_mod_hi[g_nmod++] = hi;
                }
                if (!mine) return 0;
            }
            return 1;
        },
        nullptr);
}

void describe_address(char* out, size_t n, uintptr_t a, size_t size) {
    // Nearest argument buffer, for "16 bytes past the end of argument {arg3}" ({argN}: Python
    // substitutes the parameter name).
    long best = -1;
    long long dist = 0;
    for (int i = 0; i < g_nbuf; ++i) {
        uintptr_t lo = g_bufs[i].lo, hi = lo + g_bufs[i].size;
        long long d = a < lo ? static_cast<long long>(a) - static_cast<long long>(lo)
                             : static_cast<long long>(a + size) - static_cast<long long>(hi);
        if (a >= lo && a < hi) d = static_cast<long long>(a + size - hi);
        if (best < 0 || llabs(d) < llabs(dist)) best = i, dist = d;
    }
    if (best >= 0 && llabs(dist) <= (1ll << 20)) {
        if (dist < 0)
            snprintf(out, n, "%lld bytes before the start of argument {arg%d}", -dist,
                     g_bufs[best].arg);
        else
            snprintf(out, n, "ending %lld bytes past the end of argument {arg%d} (%llu bytes)",
                     dist, g_bufs[best].arg, (unsigned long long)g_bufs[best].size);
    } else {
        snprintf(out, n, "not inside any kernel argument, shared memory or the thread's stack");
    }
}

[[noreturn]] __attribute__((noinline, cold)) static void bad_access(uintptr_t a, size_t size,
                                                                bool write, void* pc) {
    char where[256];
    describe_address(where, sizeof where, a, size);
    set_fault(F_ACCESS, pc, nullptr, 0, "out-of-bounds %s of %zu bytes at %p: %s",
              write ? "write" : "read", size, reinterpret_cast<void*>(a), where);
    abort_fiber();
}

// Race check. The shadow holds, per 4-byte granule, the last writer and the readers of the
// current barrier epoch, and which bytes of the granule they touched. Epochs count up through
// the launch (+1 per block and per released barrier), so an older epoch of this block was
// ordered by a __syncthreads, and an epoch older than the block's first is another block's.
// A conflict (write against anything, read against a write, atomic against plain):
//   shared memory  another thread of the block in the same epoch, unless both lanes of one
//                  warp took part in a __syncwarp since the earlier access;
//   global memory  the same, or any other block of this launch: blocks run in no promised
//                  order (or at once) on a GPU, so only atomics may touch what another writes.
static bool ordered(int other_tid, uint32_t other_sync) {
    const int t = g_cur_tid;
    return other_tid == t || (other_tid / 32 == t / 32 &&
                              g_common[t / 32][t % 32][other_tid % 32] > other_sync);
}

static bool readers_ordered(const Shadow& s) {
    const int t = g_cur_tid;
    if (s.r_warp == kManyWarps) return false;  // a reader in another warp, no barrier since
    if (s.r_warp != t / 32) return false;
    for (int lane = 0; lane < 32; ++lane)  // every reader lane synced with us since its read
        if (((s.r_lanes >> lane) & 1u) && lane != t % 32 &&
            !(g_common[t / 32][t % 32][lane] > s.r_sync))
            return false;
    return true;
}

[[noreturn]] static void race(const char* space, size_t byte, int arg, const char* mine,
                              const char* theirs, int other_tid, bool other_block, void* pc) {
    char where[64], who[64] = "another thread";
    if (arg >= 0) snprintf(where, sizeof where, "byte +%zu of argument {arg%d}", byte, arg);
    else snprintf(where, sizeof where, "shared byte +%zu", byte);
    if (other_block) {
        snprintf(who, sizeof who, "another block");
    } else if (other_tid >= 0) {
        strcpy(who, "thread ");
        describe_thread(who + 7, sizeof who - 7, other_tid);
    }
    set_fault(F_RACE, pc, nullptr, 0, "%s-memory race: this thread %s %s, which %s %s earlier %s",
              space, mine, where, who, theirs,
              other_block ? "in this launch (blocks run in no fixed order on a GPU: use "
                            "atomics, or give each element one writer)"
                          : "with no __syncthreads in between");
    abort_fiber();
}

// kind: 0 read, 1 write, 2 atomic. arg: the argument index (global memory) or -1 (shared).
__attribute__((noinline)) static void race_check(Shadow* shadow, size_t off, size_t size,
                                                 int kind, int arg, void* pc) {
    const uint16_t t = static_cast<uint16_t>(g_cur_tid);
    const uint32_t epoch = g_bepoch, mine = g_block_first_epoch;
    const uint32_t oldest = arg >= 0 ? g_launch_first_epoch : mine;  // older entries: stale
    const bool write = kind != 0, atomic = kind == 2;
    const char* space = arg >= 0 ? "global" : "shared";
    const char* verb = atomic ? "updates atomically" : (write ? "writes" : "reads");
    for (size_t g = off / 4; g <= (off + size - 1) / 4; ++g) {
        const size_t lo = g * 4 > off ? g * 4 : off;
        const size_t hi = g * 4 + 4 < off + size ? g * 4 + 4 : off + size;
        const uint8_t m = static_cast<uint8_t>(((1u << (hi - lo)) - 1) << (lo - g * 4));
        Shadow& s = shadow[g];
        if (s.w_epoch >= oldest && (s.w_bytes & m) && !(atomic && s.w_atomic)) {
            const char* theirs = s.w_atomic ? "updated atomically" : "wrote";
            if (s.w_epoch < mine) race(space, lo, arg, verb, theirs, -1, true, pc);
            if (s.w_epoch == epoch && !ordered(s.w_tid, s.w_sync))
                race(space, lo, arg, verb, theirs, s.w_tid, false, pc);
        }
        if (write && s.r_epoch >= oldest && (s.r_bytes & m)) {
            if (s.r_epoch < mine) race(space, lo, arg, verb, "read", -1, true, pc);
            if (s.r_epoch == epoch && !readers_ordered(s))
                race(space, lo, arg, verb, "read", s.r_warp == t / 32 && __builtin_popcount(
                     s.r_lanes) == 1 ? t - t % 32 + __builtin_ctz(s.r_lanes) : -1, false, pc);
        }
        if (write && s.r_other >= oldest && s.r_other < mine)
            race(space, lo, arg, verb, "read", -1, true, pc);
        if (write) {
            if (s.w_epoch == epoch && s.w_tid == t) s.w_bytes |= m;
            else s.w_epoch = epoch, s.w_tid = t, s.w_bytes = m;
            s.w_sync = g_sync_id;
            s.w_atomic = atomic;
        } else if (s.r_epoch != epoch) {
            if (s.r_epoch >= oldest && s.r_epoch < mine) s.r_other = s.r_epoch;
            s.r_epoch = epoch, s.r_warp = t / 32, s.r_lanes = 1u << (t % 32);
            s.r_sync = g_sync_id, s.r_bytes = m;
        } else {
            if (s.r_warp != t / 32) s.r_warp = kManyWarps;
            s.r_lanes |= 1u << (t % 32);
            s.r_sync = g_sync_id;
            s.r_bytes |= m;
        }
    }
}

// ---- unique bytes: a bit per byte of each argument, set at the first touch ------------------
bool alloc_touched(int nbuf) {
    for (int i = 0; i < nbuf; ++i) {
        const size_t words = (g_bufs[i].size + 63) / 64;
        g_touched_read[i] = static_cast<uint64_t*>(calloc(words, 8));
        g_touched_write[i] = static_cast<uint64_t*>(calloc(words, 8));
        if (!g_touched_read[i] || !g_touched_write[i]) return false;
    }
    return true;
}

void count_touched(Counters& out) {
    for (int i = 0; i < kMaxArgs; ++i) {
        if (g_touched_read[i] && g_touched_write[i]) {
            const size_t words = (g_bufs[i].size + 63) / 64;
            uint64_t r = 0, w = 0;
            for (size_t j = 0; j < words; ++j) {
                r += static_cast<uint64_t>(__builtin_popcountll(g_touched_read[i][j]));
                w += static_cast<uint64_t>(__builtin_popcountll(g_touched_write[i][j]));
            }
            out.unique_read[g_bufs[i].arg] += r;
            out.unique_write[g_bufs[i].arg] += w;
        }
        free(g_touched_read[i]), g_touched_read[i] = nullptr;
        free(g_touched_write[i]), g_touched_write[i] = nullptr;
    }
}

// Bytes [off, off + size) of a buffer touched. Words are read before they are set, and set
// atomically only when a bit is missing: most accesses touch bytes already marked.
static inline void set_bits(uint64_t* bits, size_t off, size_t size) {
    while (size) {
        const size_t w = off / 64, b = off % 64, n = size < 64 - b ? size : 64 - b;
        const uint64_t m = (n == 64 ? ~0ull : ((1ull << n) - 1)) << b;
        if ((bits[w] & m) != m) __atomic_fetch_or(&bits[w], m, __ATOMIC_RELAXED);
        off += n, size -= n;
    }
}

// Not a kernel argument or shared memory: the thread's own stack, the module's data, or bad.
__attribute__((noinline)) static void other_access(uintptr_t a, size_t size, bool write,
                                                   void* pc) {
    Fiber* f = g_cur;
    if (f && a - reinterpret_cast<uintptr_t>(f->lo) < g_stack_size) return;  // own stack
    for (int i = 0; i < g_nmod; ++i)
        if (a >= g_mod_lo[i] && a < g_mod_hi[i]) return;  // module data (builtins, tables)
    if (!f) return;  // not from a kernel thread (static initialisers)
    bad_access(a, size, write, pc);
}

// The hot path, inlined into every hook: shared memory, then the argument buffers.
__attribute__((always_inline)) static inline void on_access(uintptr_t a, size_t size, bool write,
                                                            void* pc) {
    if (!g_cur) return;  // not a kernel thread: the module's own setup (signatures, statics)
    if (a - g_sh_lo < g_sh_size || a - g_dyn_lo < g_dyn_size) {
        bool stat = a - g_sh_lo < g_sh_size;
        size_t off = stat ? a - g_sh_lo : kArena + (a - g_dyn_lo);  // offset in the shadow
        size_t end = stat ? g_sh_size : kArena + g_dyn_size;
        if (off + size > end) bad_access(a, size, write, pc);
        (write ? g_cnt.shared_write : g_cnt.shared_read) += size;
        if (g_cfg.race_check) {
            // Fast path: a read of one granule that only this warp read, and nobody else
            // wrote, in this epoch.
            Shadow& sh = g_shadow[off / 4];
            const int t = g_cur_tid;
            if (!write && (off & 3) + size <= 4 && sh.r_epoch == g_bepoch &&
                sh.r_warp == t / 32 && (sh.w_epoch != g_bepoch || sh.w_tid == t)) {
                sh.r_lanes |= 1u << (t % 32);
                sh.r_sync = g_sync_id;
                sh.r_bytes |= static_cast<uint8_t>(((1u << size) - 1) << (off & 3));
                return;
            }
            race_check(g_shadow, off, size, write, -1, pc);
        }
        return;
    }
    for (int i = 0; i < g_nbuf; ++i) {
        const Buf& b = g_bufs[i];
        if (a - b.lo < b.size) {
            if (a - b.lo + size > b.size) bad_access(a, size, write, pc);
            (write ? g_cnt.write : g_cnt.read)[b.arg] += size;
            if (uint64_t* bits = (write ? g_touched_write : g_touched_read)[i])
                set_bits(bits, a - b.lo, size);
            if (g_gshadow[i]) race_check(g_gshadow[i], a - b.lo, size, write, b.arg, pc);
            return;
        }
    }
    other_access(a, size, write, pc);
}

// GCC's ThreadSanitizer instrumentation (-fsanitize=thread, with no TSan runtime linked) calls
// these before every load and store of the kernel file. TSan, unlike AddressSanitizer, keeps
// the store of a read-modify-write (`x[i] += v`: one read and one write); ASan drops a store
// to an address it just checked, which would lose bytes from the counts and the race check.
#define EMU_HOOKS(N)                                                                      \
    extern "C" void __tsan_read##N(void* p) {                                             \
        on_access(reinterpret_cast<uintptr_t>(p), N, false, __builtin_return_address(0)); \
    }                                                                                     \
    extern "C" void __tsan_write##N(void* p) {                                            \
        on_access(reinterpret_cast<uintptr_t>(p), N, true, __builtin_return_address(0));  \
    }                                                                                     \
    extern "C" void __tsan_unaligned_read##N(void* p) {                                   \
        on_access(reinterpret_cast<uintptr_t>(p), N, false, __builtin_return_address(0)); \
    }                                                                                     \
    extern "C" void __tsan_unaligned_write##N(void* p) {                                  \
        on_access(reinterpret_cast<uintptr_t>(p), N, true, __builtin_return_address(0));  \
    }
EMU_HOOKS(1)
EMU_HOOKS(2)
EMU_HOOKS(4)
EMU_HOOKS(8)
EMU_HOOKS(16)
extern "C" void __tsan_read_range(void* p, size_t n) {
    on_access(reinterpret_cast<uintptr_t>(p), n, false, __builtin_return_address(0));
}
extern "C" void __tsan_write_range(void* p, size_t n) {
    on_access(reinterpret_cast<uintptr_t>(p), n, true, __builtin_return_address(0));
}
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}

// ---- atomics: counted here (1 op + its size per argument), not as loads and stores ----------
static void on_atomic(void* p, size_t size, void* pc) {
    if (!g_cfg.counted) return;
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (a - g_sh_lo < g_sh_size || a - g_dyn_lo < g_dyn_size) {
        ++g_cnt.shared_atomics;
        if (g_cfg.race_check) {
            bool stat = a - g_sh_lo < g_sh_size;
            race_check(g_shadow, stat ? a - g_sh_lo : kArena + (a - g_dyn_lo), size, 2, -1, pc);
        }
        return;
    }
    for (int i = 0; i < g_nbuf; ++i) {
        const Buf& b = g_bufs[i];
        if (a - b.lo < b.size) {
            if (a - b.lo + size > b.size) bad_access(a, size, true, pc);
            ++g_cnt.atomic_ops[b.arg];
            g_cnt.atomic_bytes[b.arg] += size;
            set_bits(g_touched_read[i], a - b.lo, size);  // an atomic reads and writes
            set_bits(g_touched_write[i], a - b.lo, size);
            if (g_gshadow[i]) race_check(g_gshadow[i], a - b.lo, size, 2, b.arg, pc);
            return;
        }
    }
    Fiber* f = g_cur;
    if (f && a - reinterpret_cast<uintptr_t>(f->lo) < g_stack_size) return;
    bad_access(a, size, true, pc);
}
#define EMU_ATOMIC(T, NAME, NEW)                           \
    T NAME(T* a, T v) {                                    \
        on_atomic(a, sizeof(T), __builtin_return_address(0)); \
        T old = *a;                                        \
        *a = NEW;                                          \
        return old;                                        \
    }
EMU_ATOMIC(float, atomicAdd, old + v)
EMU_ATOMIC(double, atomicAdd, old + v)
EMU_ATOMIC(int, atomicAdd, old + v)
EMU_ATOMIC(unsigned, atomicAdd, old + v)
EMU_ATOMIC(unsigned long long, atomicAdd, old + v)
EMU_ATOMIC(int, atomicSub, old - v)
EMU_ATOMIC(unsigned, atomicSub, old - v)
EMU_ATOMIC(int, atomicMax, old > v ? old : v)
EMU_ATOMIC(unsigned, atomicMax, old > v ? old : v)
EMU_ATOMIC(int, atomicMin, old < v ? old : v)
EMU_ATOMIC(unsigned, atomicMin, old < v ? old : v)
EMU_ATOMIC(int, atomicExch, v)
EMU_ATOMIC(unsigned, atomicExch, v)
EMU_ATOMIC(float, atomicExch, v)
EMU_ATOMIC(int, atomicAnd, old & v)
EMU_ATOMIC(int, atomicOr, old | v)
EMU_ATOMIC(int, atomicXor, old ^ v)
#define EMU_CAS(T)                                          \
    T atomicCAS(T* a, T compare, T v) {                     \
        on_atomic(a, sizeof(T), __builtin_return_address(0)); \
        T old = *a;                                         \
        if (old == compare) *a = v;                         \
        return old;                                         \
    }
EMU_CAS(int)
EMU_CAS(unsigned)
EMU_CAS(unsigned long long)
