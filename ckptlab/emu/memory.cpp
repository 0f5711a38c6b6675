// memory.cpp: what the kernel file's loads and stores go through, and its atomics' checks.
//
//   hooks     __tsan_{read,write}N: GCC calls them before every memory access of the kernel
//             file. Each address is classified by the object it lies in (objects.cpp): a
//             shared array (the worker's arena slot), a kernel argument (its staged region's
//             slot), the thread's own stack, a __device__ variable, a device malloc block or the
//             module's own data; then bounds, const, alignment, counts and races are checked.
//   atomics   on_atomic checks and counts each (atomics.cpp does them, as real atomics):
//             the runtime is not instrumented, so they do not pass through the hooks.
#include "runtime.h"

// ---- unique bytes: a bit per byte of each argument, set at the first touch ------------------
bool alloc_touched() {
    for (int i = 0; i < g_nargs; ++i) {
        const size_t words = (g_args[i].size + 63) / 64;
        g_args[i].touched_r = static_cast<uint64_t*>(calloc(words + 1, 8));
        g_args[i].touched_w = static_cast<uint64_t*>(calloc(words + 1, 8));
        if (!g_args[i].touched_r || !g_args[i].touched_w) return false;
    }
    return true;
}

void count_touched(Counters& out) {
    for (int i = 0; i < g_nargs; ++i) {
        ArgBuf& b = g_args[i];
        if (b.touched_r && b.touched_w) {
            const size_t words = (b.size + 63) / 64;
            uint64_t r = 0, wr = 0;
            for (size_t j = 0; j < words; ++j) {
                r += static_cast<uint64_t>(__builtin_popcountll(b.touched_r[j]));
                wr += static_cast<uint64_t>(__builtin_popcountll(b.touched_w[j]));
            }
            out.unique_read[b.counter] += r;
            out.unique_write[b.counter] += wr;
        }
        free(b.touched_r), b.touched_r = nullptr;
        free(b.touched_w), b.touched_w = nullptr;
    }
}

// Bytes [off, off + size) of an argument touched. Words are read before they are set, and set
// atomically (workers share them) only when a bit is missing: most accesses find it set.
__attribute__((always_inline)) static inline void set_bits(uint64_t* bits, size_t off,
                                                           size_t size) {
    while (size) {
        const size_t w = off / 64, b = off % 64, n = size < 64 - b ? size : 64 - b;
        const uint64_t m = (n == 64 ? ~0ull : ((1ull << n) - 1)) << b;
        if ((__atomic_load_n(&bits[w], __ATOMIC_RELAXED) & m) != m)  // (a plain load on x86)
            __atomic_fetch_or(&bits[w], m, __ATOMIC_RELAXED);
        off += n, size -= n;
    }
}

// ---- faults ---------------------------------------------------------------------------------
static const char* verb(int kind) { return kind == 2 ? "atomic" : (kind ? "write" : "read"); }

[[noreturn]] __attribute__((noinline, cold)) static void bad_access(Fiber* f, uintptr_t a,
                                                                    size_t size, int kind,
                                                                    void* pc) {
    char where[320];
    describe_address(where, sizeof where, f, a, size);
    set_fault(worker_of(f), F_ACCESS, pc, nullptr, 0, "out-of-bounds %s of %zu bytes at %p: %s",
              verb(kind), size, reinterpret_cast<void*>(a), where);
    abort_fiber(f);
}

// A stop was asked, or the address is not a multiple of the access's size.
[[noreturn]] __attribute__((noinline, cold)) static void stop_or_misaligned(Fiber* f, uintptr_t a,
                                                                            size_t size,
                                                                            int kind, void* pc) {
    if (g_stop) stop_here(f, pc, nullptr, 0);
    set_fault(worker_of(f), F_ACCESS, pc, nullptr, 0,
              "misaligned %zu-byte %s at %p: a GPU requires an address that is a multiple of "
              "%zu (cudaErrorMisalignedAddress; a float4 or double through a pointer that is "
              "not aligned to its size?)",
              size, verb(kind), reinterpret_cast<void*>(a), size);
    abort_fiber(f);
}

[[noreturn]] __attribute__((noinline, cold)) static void const_write(Fiber* f, const ArgBuf& b,
                                                                     void* pc) {
    set_fault(worker_of(f), F_ACCESS, pc, nullptr, 0,
              "write through a const parameter {arg%d}: the kernel declared it read-only",
              b.param);
    abort_fiber(f);
}

// ---- shared memory: the race check ------------------------------------------------------------
// kind: 0 read, 1 write, 2 atomic. off: offset in the slot's object. fo: the stack's offset in
// the fiber region (the fiber and its worker). Both are tail-called from the hook: their return
// address is the kernel's access.
__attribute__((noinline)) static void shared_race_slow(uint64_t fo, Shadow* shadow, uint64_t off,
                                                       size_t sk, void* pc) {
    Worker* w = &g_wbase[fo >> g_wshift];
    Fiber* f = &g_fibers[fo >> g_fshift];
    if (race_check_shared(w, f->tid, shadow, off, sk >> 2, int(sk & 3)))
        report_race(f, w->conflict, int(sk & 3), -1, pc ? pc : __builtin_return_address(0));
}

// Everything it needs is found by arithmetic from fo and the arena (ArenaHead), no pointers.
__attribute__((noinline)) static void shared_race_at(uintptr_t arena, uint64_t fo,
                                                     uint64_t slot, uint64_t off, size_t sk,
                                                     void* pc) {
    const size_t size = sk >> 2;
    const int kind = int(sk & 3);
    const ArenaHead* head = arena_head(reinterpret_cast<char*>(arena));
    const int t = g_fibers[fo >> g_fshift].tid;
    // (each slot's shadow coloured as its data: otherwise they would all share cache sets)
    Shadow* shadow = reinterpret_cast<Shadow*>(g_shadow_base + ((fo & g_wmask) << 2)) +
                     slot * (kShMaxObj / 4) + (emu_slot_start(slot) - kShHalf) / 4;
    Shadow& sh = shadow[off / 4];
    const uint64_t epoch = head->epoch;
    // Fast path: a read of one granule that no other thread wrote in this epoch (an older epoch
    // of this block is ordered by a barrier; another block's entry is stale) conflicts with
    // nothing: record the reader (race_check_shared's bookkeeping, without its checks).
    // (Not when other readers of this epoch read before a __syncwarp: the slow path may fold
    // them into this read.)
    if (kind == 0 && (off & 3) + size <= 4 && (sh.w_epoch != epoch || sh.w_thread() == t) &&
        (sh.r_epoch != epoch || sh.r_sync == static_cast<uint16_t>(head->sync_id) ||
         sh.r_lanes == (1u << (t % 32)))) {
        const uint32_t bit = 1u << (t % 32);
        const uint8_t m = static_cast<uint8_t>(((1u << size) - 1) << (off & 3));
        if (sh.r_epoch != epoch) {
            sh.r_epoch = epoch, sh.r_warp = static_cast<uint16_t>(t / 32);
            sh.r_lanes = bit, sh.bytes = static_cast<uint8_t>((sh.bytes & 0x0F) | (m << 4));
        } else {
            if (sh.r_warp != t / 32) sh.r_warp = kManyWarps;
            sh.r_lanes |= bit, sh.bytes |= static_cast<uint8_t>(m << 4);
        }
        sh.r_sync = static_cast<uint16_t>(head->sync_id);
        return;
    }
    return shared_race_slow(fo, shadow, off, sk, pc);
}

// ---- kernel arguments ---------------------------------------------------------------------
__attribute__((noinline)) static void arg_race(Worker* w, Fiber* f, const ArgBuf* b,
                                               uint64_t boff, size_t n, int kind, void* pc) {
    const bool locked = g_nworkers > 1;
    if (locked) lock_stripe(b->counter, boff, n);
    const bool race = race_check_global(w, f->tid, b->shadow, boff, n, kind);
    if (locked) unlock_stripe(b->counter, boff, n);
    if (race) report_race(f, w->conflict, kind, b->param, pc);
}

__attribute__((always_inline)) static inline void arg_access(Worker* w, Fiber* f, uintptr_t a,
                                                             uint64_t ao, size_t size, int kind,
                                                             void* pc) {
    const Region& R = g_regions[ao >> g_arg_shift];
    const uint64_t off = a - R.lo;
    if (__builtin_expect(off >= R.size || off + size > R.size, 0))
        bad_access(f, a, size, kind, pc);
    if (kind && __builtin_expect(!R.writable, 0)) const_write(f, g_args[R.first], pc);
    const ArgBuf* b = &g_args[R.first];
    for (int i = 1; i < R.n && a - b->lo >= b->size; ++i) b = &g_args[R.first + i];  // overlaps
    const uint64_t boff = a - b->lo;
    const size_t n = size < b->size - boff ? size : b->size - boff;
    if (kind == 2) {
        ++w->cnt.atomic_ops[b->counter];
        w->cnt.atomic_bytes[b->counter] += size;
        set_bits(b->touched_r, boff, n);  // an atomic reads and writes
        set_bits(b->touched_w, boff, n);
    } else {
        (kind ? w->cnt.write : w->cnt.read)[b->counter] += size;
        set_bits(kind ? b->touched_w : b->touched_r, boff, n);
    }
    if (__builtin_expect(b->traced, 0)) trace_access(w, f, b, boff, n, kind);
    if (b->shadow) arg_race(w, f, b, boff, n, kind, pc);
}

// ---- anything else: the thread's own stack, a __device__ variable, a malloc block, the module
__attribute__((noinline)) static void other_access(Fiber* f, uintptr_t a, size_t size, int kind,
                                                   void* pc) {
    if (a - reinterpret_cast<uintptr_t>(stack_lo(*f)) < g_stack_size) return;  // own stack
    if (in_module(a)) {  // the module's data: constants, tables, statics; not the runtime's
        if (in_runtime_data(a)) bad_access(f, a, size, kind, pc);
        return;
    }
    const Found o = find_object(a);  // a __device__ variable, a malloc block
    if (o.kind == OBJ_NONE || a - o.lo >= o.size || size > o.size - (a - o.lo))
        bad_access(f, a, size, kind, pc);
}

// Slow paths of the hot path, reached by a jump where they return (so that the hot path needs
// no stack frame): the kernel's pc, which errors name the line of, is then their own return
// address; the faults (they never return: called, not jumped to) and atomics (which call the
// hot path) are given it. sk: size << 2 | kind.
#define EMU_PC (pc ? pc : __builtin_return_address(0))
__attribute__((noinline, cold)) static void stop_or_misaligned_at(uint64_t fo, uintptr_t a,
                                                                  size_t sk, void* pc) {
    stop_or_misaligned(&g_fibers[fo >> g_fshift], a, sk >> 2, int(sk & 3), EMU_PC);
}
__attribute__((noinline, cold)) static void bad_access_at(uint64_t fo, uintptr_t a, size_t sk,
                                                          void* pc) {
    bad_access(&g_fibers[fo >> g_fshift], a, sk >> 2, int(sk & 3), EMU_PC);
}
__attribute__((noinline)) static void elsewhere_slow(uint64_t fo, uintptr_t a, size_t sk,
                                                     void* pc) {
    Fiber* f = &g_fibers[fo >> g_fshift];
    const uint64_t ao = a - g_arg_base;
    if (ao < g_arg_span)
        return arg_access(&g_wbase[fo >> g_wshift], f, a, ao, sk >> 2, int(sk & 3), pc);
    return other_access(f, a, sk >> 2, int(sk & 3), pc);
}
__attribute__((noinline)) static void elsewhere(uint64_t fo, uintptr_t a, size_t sk, void* pc) {
    // The common global access first, with no call on its way (so no register to save): a read
    // or a write of one argument alone in its region, in bounds, allowed, with neither the race
    // check nor the trace (full_path). Anything else takes the full path, which checks and
    // counts it as this would.
    const uint64_t ao = a - g_arg_base;
    if (ao < g_arg_span) {
        const Region& R = g_regions[ao >> g_arg_shift];
        const size_t size = sk >> 2;
        const int kind = int(sk & 3);
        const uint64_t off = a - R.lo;
        const ArgBuf* b = &g_args[R.first];
        if (__builtin_expect(R.n == 1 && kind != 2 && off < R.size && size <= R.size - off &&
                             (kind == 0 || R.writable) && !b->full_path, 1)) {
            Worker* w = &g_wbase[fo >> g_wshift];
            (kind ? w->cnt.write : w->cnt.read)[b->counter] += size;
            set_bits(kind ? b->touched_w : b->touched_r, off, size);
            return;
        }
    }
    return elsewhere_slow(fo, a, sk, EMU_PC);
}

// The hot path, inlined into every hook: no call but tail calls to the rarer cases, so that it
// needs no stack frame nor callee-saved registers. The worker, its arena and its shared counts
// come from the stack pointer by arithmetic (runtime.h).
template <bool Aligned>
__attribute__((always_inline)) static inline void on_access(uintptr_t a, size_t size, int kind,
                                                            void* pc = nullptr) {
    const uint64_t fo = stack_pointer() - g_fbase;
    if (__builtin_expect(fo >= g_fspan, 0)) return;  // not a kernel thread: the module's setup
    const size_t sk = size << 2 | size_t(kind);
    // (the faults never return: calls, not jumps, so they are given the pc)
    if (__builtin_expect(g_stop | (Aligned && size > 1 ? int(a & (size - 1)) : 0), 0))
        return stop_or_misaligned_at(fo, a, sk, pc ? pc : __builtin_return_address(0));
    const uintptr_t arena = g_arena_base + (fo & g_wmask);
    const uint64_t so = a - arena;
    if (__builtin_expect(so >= kArenaSpan, 0))
        return elsewhere(fo, a, sk, pc ? pc : __builtin_return_address(0));
    const uint64_t slot = so >> kShShift;
    const SlotInfo si = g_slots[slot];
    const uint64_t off = (so & ((uint64_t(1) << kShShift) - 1)) - si.start;  // before: huge
    const uint64_t osize = si.size;
    // Aligned: off is a multiple of size (data starts 64-byte aligned), so off + size cannot
    // wrap past zero and one comparison covers both ends.
    if (__builtin_expect(off + size > osize || (!Aligned && off >= osize), 0))
        return bad_access_at(fo, a, sk, pc ? pc : __builtin_return_address(0));
    shared_counts(reinterpret_cast<char*>(arena))[kind] += kind == 2 ? 1 : size;
    if (g_cfg.race_check) return shared_race_at(arena, fo, slot, off, sk, pc);
}

// GCC's ThreadSanitizer instrumentation (-fsanitize=thread, with no TSan runtime linked) calls
// these before every load and store of the kernel file. TSan, unlike AddressSanitizer, keeps
// the store of a read-modify-write (`x[i] += v`: one read and one write); ASan drops a store
// to an address it just checked, which would lose bytes from the counts and the race check.
// GCC calls the aligned forms where the type promises alignment: a misaligned address there is
// a misaligned access on a GPU.
#define EMU_HOOKS(N)                                                                             \
    extern "C" void __tsan_read##N(void* p) { on_access<true>(reinterpret_cast<uintptr_t>(p), N, 0); } \
    extern "C" void __tsan_write##N(void* p) { on_access<true>(reinterpret_cast<uintptr_t>(p), N, 1); } \
    extern "C" void __tsan_unaligned_read##N(void* p) {                                          \
        on_access<false>(reinterpret_cast<uintptr_t>(p), N, 0);                                  \
    }                                                                                            \
    extern "C" void __tsan_unaligned_write##N(void* p) {                                         \
        on_access<false>(reinterpret_cast<uintptr_t>(p), N, 1);                                  \
    }
EMU_HOOKS(1)
EMU_HOOKS(2)
EMU_HOOKS(4)
EMU_HOOKS(8)
EMU_HOOKS(16)
extern "C" void __tsan_read_range(void* p, size_t n) {
    if (n) on_access<false>(reinterpret_cast<uintptr_t>(p), n, 0);
}
extern "C" void __tsan_write_range(void* p, size_t n) {
    if (n) on_access<false>(reinterpret_cast<uintptr_t>(p), n, 1);
}
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}

// ---- atomics: checked and counted as one access of `size` bytes (atomics.cpp does them) -----
void on_atomic(void* p, size_t size, void* pc) {
    if (!g_cfg.counted) return;
    on_access<true>(reinterpret_cast<uintptr_t>(p), size, 2, pc);
}
