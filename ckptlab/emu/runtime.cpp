// runtime.cpp: the emulator's execution engine, linked into every emulated kernel module.
// Compiled WITHOUT the sanitizer (its own loads and stores must not call the hooks below).
//
//   emu_launch   runs a grid: blocks one after another; inside a block every CUDA thread is a
//                fiber on this OS thread, run until it blocks (barrier, warp op) or exits.
//   scheduler    releases a __syncthreads when every live thread waits at the same one; a warp
//                operation completes when every lane of its mask has arrived; anything else
//                (some threads exited, different barriers, a lane missing) is an error.
//   hooks        __tsan_{read,write}N: GCC calls them before every memory access of the
//                kernel file; they classify the address (kernel argument, shared, own stack,
//                module data), count bytes per argument, and check bounds and shared races.
//   faults       become an EmuFault the Python side raises as EmuError; the process survives:
//                in-fiber errors switch back to the scheduler, signals (SIGSEGV, stack overflow,
//                SIGFPE, the watchdog timer, Ctrl-C) siglongjmp back to emu_launch.
#include "shim.h"

#include <dlfcn.h>
#include <link.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdlib>

#define EMU_API extern "C" __attribute__((visibility("default")))

static constexpr int kMaxThreads = 1024;
static constexpr int kMaxArgs = 64;
static constexpr size_t kGuard = 64 * 1024;  // PROT_NONE below each fiber stack

enum State : uint8_t { READY, AT_BARRIER, AT_WARP, EXITED, ABORTED };
enum FaultKind {
    F_NONE = 0, F_BARRIER = 1, F_WARP = 2, F_ACCESS = 3, F_RACE = 4, F_STACK = 5,
    F_SIGNAL = 6, F_WATCHDOG = 7, F_INTERRUPT = 8, F_TRAP = 9, F_CONFIG = 10
};
enum { OP_SYNCWARP = 7 };

struct Buf { uint64_t lo, size; int32_t arg, pad; };  // one kernel-argument buffer (Python)
struct Config {
    int32_t counted, race_check, stack_kib, shuffle_blocks;
    double watchdog_s;
    uint64_t seed;            // of the block order when shuffle_blocks
    int32_t kernel;           // which kernel of the module (its static shared memory, below)
    int32_t shared_opt_in;    // 1 if max_dynamic_shared_size_bytes was raised above 48 KiB
};
struct Counters {
    uint64_t read[kMaxArgs], write[kMaxArgs], atomic_ops[kMaxArgs], atomic_bytes[kMaxArgs];
    uint64_t shared_read, shared_write, shared_atomics, threads, blocks;
};
struct Fault {
    int32_t kind, has_thread;
    uint32_t block[3], thread[3];
    uint64_t pc;  // offset of the faulting instruction in this module (for addr2line), or 0
    int32_t line, pad;
    char file[256];
    char message[2048];
};

struct Fiber {
    void* sp;
    char* map;            // whole mapping: guard + stack
    char *lo, *hi;        // usable stack
    uint3 idx;
    uint8_t state;
    const char* file;     // where it waits
    int line;
    int pred;             // __syncthreads_count/and/or argument
};
struct Warp {
    bool active;
    int op, line;
    unsigned mask, arrived;
    const char* file;
    unsigned long long val[32], result[32];
    int arg[32], width[32];
};
struct Shadow {  // race check: one per 4 bytes of shared memory or of a kernel argument
    uint32_t w_epoch, r_epoch;  // barrier epoch of the last write, of the current readers
    uint32_t r_other;           // epoch of a read by another block, replaced since (global)
    uint32_t r_lanes;           // reader lanes, when every reader is in warp r_warp
    uint32_t w_sync, r_sync;    // __syncwarp id at the write / at the latest read
    uint16_t w_tid, r_warp;     // the writer; the readers' warp, or kManyWarps
    uint8_t w_bytes, r_bytes;   // which bytes of the granule were written / read
    uint8_t w_atomic, pad;      // the write was an atomic (atomic vs atomic never races)
};
static constexpr uint16_t kManyWarps = 0xFFFF;

EmuBuiltins emu_builtins;
char* emu_dynamic_shared;

// Static shared memory: every `__shared__` declaration of the module gets its place in this
// arena the first time it executes (emu_shared_alloc); blocks run one after another, so one copy
// is right. (A linker section would be simpler, but GCC ignores section attributes on the
// static locals of template instantiations.) Dynamic shared memory is a separate buffer.
static constexpr size_t kArena = 1 << 20;
static constexpr size_t kMaxKernels = 256;
static char* g_arena;
static size_t g_static_by_kernel[kMaxKernels];  // static shared bytes each kernel declared

// ---- launch state (globals: a launch is serial and may be abandoned by siglongjmp) ----------
static Fiber g_fibers[kMaxThreads];
static Warp g_warps[kMaxThreads / 32];
// __syncwarp bookkeeping for the race check: every completed __syncwarp gets an id, and
// g_common[w][a][b] is the latest id in which lanes a and b of warp w took part together.
static uint32_t g_sync_id;
static uint32_t g_common[kMaxThreads / 32][32][32];
static uint32_t g_block_first_epoch, g_launch_first_epoch;  // epochs: newer = this block/launch
static Shadow* g_gshadow[kMaxArgs];  // per argument buffer, fresh each launch (race check)
static size_t g_stack_size;        // usable bytes per fiber stack
static int g_nstacks;
static void* g_sched_sp;
static Fiber* volatile g_cur;      // the running fiber, or null in the scheduler
static int g_cur_tid;
static int g_nthreads;
static void (*g_launcher)(void**);
static void** g_args;
static Config g_cfg;
static Counters g_cnt;
static Fault g_fault;
static volatile sig_atomic_t g_failed, g_in_launch, g_interrupted;
static sigjmp_buf g_jmp;
static const Buf* g_bufs;
static int g_nbuf;
static uintptr_t g_sh_lo, g_dyn_lo;  // static arena (g_sh_size bytes in use), dynamic buffer
static size_t g_sh_size, g_dyn_size, g_dyn_cap;
static Shadow* g_shadow;
static size_t g_shadow_cap;
static uint32_t g_bepoch;          // barrier epoch: +1 per block and per released barrier
static int g_reduce_result;
static int g_n_exited, g_n_waiting;  // threads of the block that exited / wait at a barrier
static uintptr_t g_mod_lo[16], g_mod_hi[16];
static int g_nmod = -1;
static struct timespec g_t0;

// ---- fibers ---------------------------------------------------------------------------------
#if defined(__x86_64__)
// Switch stacks: save the callee-saved registers on the old stack, store its sp, load the new
// sp, restore. ~30 cycles; MXCSR and the x87 control word are never changed by kernels, so
// they are not saved (ucontext's swapcontext would also make a sigprocmask syscall: ~10x slower).
extern "C" void emu_switch(void** save_sp, void* new_sp);
extern "C" void emu_fiber_entry();
asm(R"(
    .text
    .globl emu_switch
    .hidden emu_switch
    .type emu_switch,@function
emu_switch:
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
    .size emu_switch, .-emu_switch
    .globl emu_fiber_entry
    .hidden emu_fiber_entry
    .type emu_fiber_entry,@function
emu_fiber_entry:
    andq $-16, %rsp
    call emu_fiber_main
    ud2
    .size emu_fiber_entry, .-emu_fiber_entry
)");
static void fiber_init(Fiber& f) {
    uint64_t* sp = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(f.hi) & ~uintptr_t(15));
    *--sp = 0;                                                // padding
    *--sp = reinterpret_cast<uint64_t>(&emu_fiber_entry);     // where the first switch returns
    for (int i = 0; i < 6; ++i) *--sp = 0;                    // rbp rbx r12-r15
    f.sp = sp;
}
static inline void switch_to_fiber(Fiber& f) { emu_switch(&g_sched_sp, f.sp); }
static inline void switch_to_scheduler() { emu_switch(&g_cur->sp, g_sched_sp); }
#else
#include <ucontext.h>
static ucontext_t g_sched_ctx, g_ctx[kMaxThreads];
extern "C" void emu_fiber_main();
static void fiber_init(Fiber& f) {
    int t = static_cast<int>(&f - g_fibers);
    getcontext(&g_ctx[t]);
    g_ctx[t].uc_stack.ss_sp = f.lo;
    g_ctx[t].uc_stack.ss_size = f.hi - f.lo;
    g_ctx[t].uc_link = nullptr;
    makecontext(&g_ctx[t], emu_fiber_main, 0);
}
static inline void switch_to_fiber(Fiber& f) { swapcontext(&g_sched_ctx, &g_ctx[&f - g_fibers]); }
static inline void switch_to_scheduler() { swapcontext(&g_ctx[g_cur_tid], &g_sched_ctx); }
#endif

// Stack t's top sits at a different offset modulo 64 KiB for each fiber ("colouring"): with
// identical offsets every fiber's saved registers would fall into the same cache sets and
// evict each other at every switch (measured: ~2x slower barriers).
static size_t colour(int t) { return size_t(t % 64) * 64 + size_t(t / 64 % 16) * 4096; }

static bool ensure_stacks(int n, size_t stack_size) {
    if (stack_size != g_stack_size) {  // a new size: drop the old pool
        for (int i = 0; i < g_nstacks; ++i)
            munmap(g_fibers[i].map, kGuard + g_stack_size + colour(i));
        g_nstacks = 0;
        g_stack_size = stack_size;
    }
    for (; g_nstacks < n; ++g_nstacks) {
        Fiber& f = g_fibers[g_nstacks];
        const size_t size = kGuard + stack_size + colour(g_nstacks);
        void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return false;
        mprotect(m, kGuard, PROT_NONE);  // overflowing the stack faults here
        f.map = static_cast<char*>(m);
        f.lo = f.map + kGuard;
        f.hi = f.map + size - colour(g_nstacks);
    }
    return true;
}

// ---- faults ---------------------------------------------------------------------------------
static uint64_t pc_offset(void* pc) {
    Dl_info info;
    if (pc && dladdr(pc, &info) && info.dli_fbase)
        return reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase);
    return 0;
}
static void set_fault(int kind, void* pc, const char* file, int line, const char* fmt, ...) {
    if (g_failed) return;  // keep the first fault
    g_failed = 1;
    g_fault.kind = kind;
    g_fault.block[0] = emu_builtins.block.x;
    g_fault.block[1] = emu_builtins.block.y;
    g_fault.block[2] = emu_builtins.block.z;
    Fiber* f = g_cur;
    g_fault.has_thread = f != nullptr;
    if (f) {
        g_fault.thread[0] = f->idx.x;
        g_fault.thread[1] = f->idx.y;
        g_fault.thread[2] = f->idx.z;
    }
    g_fault.pc = pc_offset(pc);
    g_fault.line = line;
    snprintf(g_fault.file, sizeof g_fault.file, "%s", file ? file : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_fault.message, sizeof g_fault.message, fmt, ap);
    va_end(ap);
}
// An error found while a fiber runs: record it and leave that fiber for good.
[[noreturn]] static void abort_fiber() {
    g_cur->state = ABORTED;
    switch_to_scheduler();
    __builtin_unreachable();
}
static void describe_thread(char* out, size_t n, int t) {
    const Fiber& f = g_fibers[t];
    snprintf(out, n, "(%u,%u,%u)", f.idx.x, f.idx.y, f.idx.z);
}

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
    const size_t limit = g_cfg.shared_opt_in ? 227 * 1024 : 48 * 1024;
    if (g_cur && (g_static_by_kernel[k] > 48 * 1024 || total > limit)) {
        set_fault(F_CONFIG, __builtin_return_address(0), nullptr, 0,
                  "shared memory over a GPU's limit: %zu bytes static + %zu dynamic; a kernel "
                  "may have 48 KiB of static shared memory (ptxas refuses more), and static + "
                  "dynamic within 48 KiB unless max_dynamic_shared_size_bytes is raised",
                  g_static_by_kernel[k], g_dyn_size);
        abort_fiber();
    }
    return g_arena + at;
}

// ---- the scheduler --------------------------------------------------------------------------
static void warp_pending_check(int t);

extern "C" __attribute__((used)) void emu_fiber_main() {
    g_launcher(g_args);
    warp_pending_check(g_cur_tid);  // may abort: a lane waits for this one at a warp op
    g_cur->state = EXITED;
    ++g_n_exited;
    switch_to_scheduler();
    __builtin_unreachable();
}

static void barrier_error() {
    // Nobody can run. Explain why: exited threads, different barriers, or a stuck warp op.
    int exited = 0, waiting = 0, first = -1, other = -1;
    for (int t = 0; t < g_nthreads; ++t) {
        const Fiber& f = g_fibers[t];
        if (f.state == EXITED) { ++exited; continue; }
        if (f.state == AT_WARP) {
            const Warp& w = g_warps[t / 32];
            unsigned missing = w.mask & ~w.arrived;
            int m = __builtin_ctz(missing ? missing : 1) + (t / 32) * 32;
            char who[32], miss[32];
            describe_thread(who, sizeof who, t);
            describe_thread(miss, sizeof miss, m);
            const Fiber& mf = g_fibers[m];
            g_cur = &g_fibers[t];
            set_fault(F_WARP, nullptr, f.file, f.line,
                      "deadlock: thread %s waits at a warp operation (mask 0x%08x) at %s:%d for "
                      "lane %d, thread %s, which %s %s:%d",
                      who, w.mask, f.file, f.line, m % 32, miss,
                      mf.state == AT_BARRIER ? "waits at __syncthreads at" : "waits at",
                      mf.file ? mf.file : "?", mf.line);
            return;
        }
        ++waiting;
        if (first < 0) first = t;
        else if (other < 0 && (f.line != g_fibers[first].line || f.file != g_fibers[first].file))
            other = t;
    }
    const Fiber& f = g_fibers[first];
    g_cur = &g_fibers[first];
    if (exited) {
        set_fault(F_BARRIER, nullptr, f.file, f.line,
                  "__syncthreads at %s:%d reached by %d of %d threads; the other %d exited "
                  "(undefined behaviour on a GPU: it may hang or silently skip the barrier)",
                  f.file, f.line, waiting, g_nthreads, exited);
    } else {
        char a[32], b[32];
        describe_thread(a, sizeof a, first);
        describe_thread(b, sizeof b, other);
        set_fault(F_BARRIER, nullptr, f.file, f.line,
                  "threads wait at different __syncthreads: thread %s at %s:%d, thread %s at "
                  "%s:%d (a barrier inside divergent code)",
                  a, f.file, f.line, b, g_fibers[other].file, g_fibers[other].line);
    }
    g_cur = nullptr;
}

static bool release_barrier() {
    // Every thread has exited or waits at a barrier. Release them if all live threads wait at
    // the same __syncthreads (one barrier epoch further); anything else is an error.
    if (g_n_exited) { barrier_error(); return false; }
    const Fiber& first = g_fibers[0];
    int count = 0;
    for (int t = 0; t < g_nthreads; ++t) {
        Fiber& f = g_fibers[t];
        if (f.line != first.line || f.file != first.file) { barrier_error(); return false; }
        count += f.pred;
        f.state = READY;
    }
    g_reduce_result = count;  // emu_syncthreads_reduce turns it into count/and/or
    g_n_waiting = 0;
    ++g_bepoch;
    return true;
}

static bool run_block() {
    g_block_first_epoch = ++g_bepoch;
    for (int t = 0; t < g_nthreads; ++t) {
        Fiber& f = g_fibers[t];
        f.state = READY;
        f.file = nullptr;
        f.line = 0;
        fiber_init(f);
    }
    for (int w = 0; w < (g_nthreads + 31) / 32; ++w) g_warps[w].active = false;
    g_n_exited = g_n_waiting = 0;
    for (;;) {
        // One pass: run every READY thread until it blocks or exits. A completed warp
        // operation may make lanes before the current one READY: the next pass runs them.
        bool ran = false;
        for (int t = 0; t < g_nthreads; ++t) {
            Fiber& f = g_fibers[t];
            if (f.state != READY) continue;
            g_cur = &f;
            g_cur_tid = t;
            emu_builtins.thread = f.idx;
            switch_to_fiber(f);
            g_cur = nullptr;
            if (g_failed) return false;
            ran = true;
        }
        if (g_n_exited == g_nthreads) return true;
        if (g_n_exited + g_n_waiting == g_nthreads) {
            if (!release_barrier()) return false;
        } else if (!ran) {
            barrier_error();  // threads stuck at warp operations
            return false;
        }
    }
}

// ---- __syncthreads and warp operations (called from fibers) --------------------------------
extern "C" void emu_syncthreads(const char* file, int line) {
    Fiber* f = g_cur;
    f->state = AT_BARRIER, f->file = file, f->line = line, f->pred = 0;
    ++g_n_waiting;
    switch_to_scheduler();
}
extern "C" int emu_syncthreads_reduce(int op, int pred, const char* file, int line) {
    Fiber* f = g_cur;
    f->state = AT_BARRIER, f->file = file, f->line = line, f->pred = pred != 0;
    ++g_n_waiting;
    switch_to_scheduler();
    if (op == 0) return g_reduce_result;
    if (op == 1) return g_reduce_result == g_nthreads;  // no thread may have exited
    return g_reduce_result != 0;
}

static void warp_pending_check(int t) {
    // Thread t is about to exit. Lanes of its warp waiting for it would wait forever.
    Warp& w = g_warps[t / 32];
    unsigned bit = 1u << (t % 32);
    if (w.active && (w.mask & bit) && !(w.arrived & bit)) {
        set_fault(F_WARP, nullptr, w.file, w.line,
                  "lane %d exits while other lanes of its warp wait for it at a warp operation "
                  "at %s:%d (mask 0x%08x includes it)",
                  t % 32, w.file, w.line, w.mask);
        abort_fiber();
    }
}

static const char* op_name(int op) {
    static const char* names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                  "__shfl_xor_sync", "__ballot_sync", "__any_sync",
                                  "__all_sync", "__syncwarp"};
    return op >= 0 && op <= OP_SYNCWARP ? names[op] : "warp op";
}

static void complete_warp(Warp& w, int base, const char* file, int line) {
    unsigned long long ballot = 0;
    for (int j = 0; j < 32; ++j)
        if ((w.mask >> j) & 1u) ballot |= static_cast<unsigned long long>(w.val[j] != 0) << j;
    for (int j = 0; j < 32; ++j) {
        if (!((w.mask >> j) & 1u)) continue;
        int width = w.width[j], src = j;
        if (w.op <= 3 && (width < 1 || width > 32 || (width & (width - 1)))) {
            set_fault(F_WARP, nullptr, file, line,
                      "%s: width %d is not a power of two in [1, 32]", op_name(w.op), width);
            abort_fiber();
        }
        int seg = j - j % (width > 0 ? width : 32);
        switch (w.op) {
            case 0: src = seg + (((w.arg[j] % width) + width) % width); break;
            case 1: src = j - w.arg[j] >= seg ? j - w.arg[j] : j; break;
            case 2: src = j + w.arg[j] < seg + width ? j + w.arg[j] : j; break;
            case 3: src = (j ^ w.arg[j]) < seg + width ? (j ^ w.arg[j]) : j; break;
            default: break;
        }
        if (w.op <= 3) {
            if (src < 0 || src > 31 || !((w.mask >> src) & 1u)) {
                set_fault(F_WARP, nullptr, file, line,
                          "%s: lane %d reads lane %d, which is not in the mask 0x%08x "
                          "(undefined on a GPU)",
                          op_name(w.op), j, src, w.mask);
                abort_fiber();
            }
            w.result[j] = w.val[src];
        } else if (w.op == 4) {
            w.result[j] = ballot;
        } else if (w.op == 5) {
            w.result[j] = ballot != 0;
        } else if (w.op == 6) {
            w.result[j] = ballot == w.mask;
        }
        if (j + base != g_cur_tid) g_fibers[base + j].state = READY;
    }
}

static unsigned long long warp_op(int op, unsigned mask, unsigned long long bits, int arg,
                                  int width, const char* file, int line) {
    const int t = g_cur_tid, lane = t % 32, base = t - lane;
    Warp& w = g_warps[t / 32];
    if (!((mask >> lane) & 1u)) {
        set_fault(F_WARP, nullptr, file, line,
                  "%s called by lane %d with mask 0x%08x, which does not include the lane",
                  op_name(op), lane, mask);
        abort_fiber();
    }
    for (int j = 0; j < 32; ++j) {
        if (!((mask >> j) & 1u)) continue;
        if (base + j >= g_nthreads) {
            set_fault(F_WARP, nullptr, file, line,
                      "%s mask 0x%08x names lane %d, which does not exist (the block has %d "
                      "threads): use a mask of the lanes that exist",
                      op_name(op), mask, j, g_nthreads);
            abort_fiber();
        }
        if (g_fibers[base + j].state == EXITED) {
            set_fault(F_WARP, nullptr, file, line,
                      "%s mask 0x%08x names lane %d, which has already exited", op_name(op),
                      mask, j);
            abort_fiber();
        }
    }
    if (!w.active) {
        w.active = true, w.op = op, w.mask = mask, w.arrived = 0, w.file = file, w.line = line;
    } else if (w.op != op || w.mask != mask || (op != OP_SYNCWARP && w.line != line)) {
        set_fault(F_WARP, nullptr, file, line,
                  "lanes of one warp reached different warp operations: %s (mask 0x%08x) at "
                  "%s:%d and %s (mask 0x%08x) at %s:%d",
                  op_name(w.op), w.mask, w.file, w.line, op_name(op), mask, file, line);
        abort_fiber();
    }
    w.val[lane] = bits, w.arg[lane] = arg, w.width[lane] = width;
    w.arrived |= 1u << lane;
    if (w.arrived == w.mask) {
        complete_warp(w, base, file, line);
        w.active = false;
        // Only __syncwarp orders the lanes' memory accesses (CUDA documents no ordering for
        // shuffles or votes), and only among the lanes of its mask.
        if (op == OP_SYNCWARP) {
            ++g_sync_id;
            for (int a = 0; a < 32; ++a)
                if ((mask >> a) & 1u)
                    for (int b = 0; b < 32; ++b)
                        if ((mask >> b) & 1u) g_common[t / 32][a][b] = g_sync_id;
        }
        return w.result[lane];
    }
    Fiber* f = g_cur;
    f->state = AT_WARP, f->file = file, f->line = line;
    switch_to_scheduler();
    return w.result[lane];
}

extern "C" unsigned long long emu_warp_exchange(int op, unsigned mask, unsigned long long bits,
                                             int arg, int width, const char* file, int line) {
    return warp_op(op, mask, bits, arg, width, file, line);
}
extern "C" void emu_syncwarp(const char* file, int line, unsigned mask) {
    warp_op(OP_SYNCWARP, mask, 0, 0, 32, file, line);
}
extern "C" unsigned emu_activemask(void) {
    unsigned m = 0;
    int base = g_cur_tid - g_cur_tid % 32;
    for (int j = 0; j < 32 && base + j < g_nthreads; ++j)
        if (g_fibers[base + j].state != EXITED) m |= 1u << j;
    return m;
}
extern "C" void emu_trap(const char* what, const char* file, int line) {
    set_fault(F_TRAP, __builtin_return_address(0), file, line, "%s executed", what);
    abort_fiber();
}
// assert() in a kernel lands here (the module binds its own definition first).
extern "C" __attribute__((noreturn)) void __assert_fail(const char* expr, const char* file,
                                                        unsigned line, const char*) noexcept {
    if (!g_cur) abort();
    set_fault(F_TRAP, __builtin_return_address(0), file, static_cast<int>(line),
              "assertion failed: %s", expr);
    abort_fiber();
}

// ---- memory classification, counting, bounds and race checks -------------------------------
static void find_module_ranges() {
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

static void describe_address(char* out, size_t n, uintptr_t a, size_t size) {
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

// ---- signals: faults, the watchdog and Ctrl-C end the launch, not the process ---------------
static const int kTickSignal = SIGRTMIN + 4;
static const int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGINT};
static struct sigaction g_old[5], g_old_tick;
static stack_t g_old_alt;
static char g_altstack[64 * 1024];
static timer_t g_timer;
static bool g_timer_ok;

static double elapsed_s() {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - g_t0.tv_sec) + 1e-9 * (now.tv_nsec - g_t0.tv_nsec);
}

static pid_t g_launch_tid;

static void on_signal(int sig, siginfo_t* si, void* ucv) {
    const bool mine = g_in_launch && static_cast<pid_t>(syscall(SYS_gettid)) == g_launch_tid;
    if (!mine) {
        if (sig == SIGINT && g_in_launch) { g_interrupted = 1; return; }  // next tick aborts
        if (sig == kTickSignal) return;
        // Not ours: let the previous handler (or the default action) have it.
        for (int i = 0; i < 5; ++i)
            if (kSignals[i] == sig) sigaction(sig, &g_old[i], nullptr);
        if (sig == SIGINT) raise(SIGINT);
        return;
    }
    void* pc = nullptr;
#if defined(__x86_64__)
    pc = reinterpret_cast<void*>(static_cast<ucontext_t*>(ucv)->uc_mcontext.gregs[REG_RIP]);
#else
    (void)ucv;
#endif
    if (sig == SIGINT) {
        g_interrupted = 1;
        set_fault(F_INTERRUPT, nullptr, nullptr, 0, "interrupted (Ctrl-C) after %.1f s",
                  elapsed_s());
    } else if (sig == SIGSEGV || sig == SIGBUS) {
        uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
        Fiber* f = g_cur;
        if (f && a >= reinterpret_cast<uintptr_t>(f->map) - (1u << 20) &&
            a < reinterpret_cast<uintptr_t>(f->lo)) {
            set_fault(F_STACK, pc, nullptr, 0,
                      "fiber stack overflow: this thread used more than its %zu KiB stack "
                      "(large local arrays?); raise it with "
                      "ckptlab.emu.configure(stack_kib=...)",
                      g_stack_size / 1024);
        } else {
            char where[256];
            describe_address(where, sizeof where, a, 1);
            set_fault(F_SIGNAL, pc, nullptr, 0, "invalid memory access at %p (%s): %s",
                      si->si_addr, sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", where);
        }
    } else if (sig == SIGFPE) {
        set_fault(F_SIGNAL, pc, nullptr, 0,
                  "arithmetic exception (SIGFPE): an integer division by zero? (on a GPU it "
                  "gives garbage instead)");
    } else if (sig == SIGILL) {
        set_fault(F_SIGNAL, pc, nullptr, 0, "illegal instruction (SIGILL)");
    } else if (g_interrupted) {  // the tick, after Ctrl-C reached another thread
        set_fault(F_INTERRUPT, nullptr, nullptr, 0, "interrupted (Ctrl-C) after %.1f s",
                  elapsed_s());
    } else {  // the watchdog tick
        if (elapsed_s() < g_cfg.watchdog_s) return;
        set_fault(F_WATCHDOG, pc, nullptr, 0,
                  "watchdog: the launch ran longer than %.1f s (an endless loop or a spin-wait "
                  "that no other thread can release?); change the limit with "
                  "ckptlab.emu.configure(watchdog_s=...)",
                  g_cfg.watchdog_s);
    }
    siglongjmp(g_jmp, 1);
}

static void install_signals() {
    stack_t ss{};
    ss.ss_sp = g_altstack;
    ss.ss_size = sizeof g_altstack;
    sigaltstack(&ss, &g_old_alt);
    struct sigaction sa{};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 5; ++i) sigaction(kSignals[i], &sa, &g_old[i]);
    sigaction(kTickSignal, &sa, &g_old_tick);
    struct sigevent sev{};
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = kTickSignal;
#ifdef sigev_notify_thread_id
    sev.sigev_notify_thread_id = static_cast<pid_t>(syscall(SYS_gettid));
#else
    sev._sigev_un._tid = static_cast<pid_t>(syscall(SYS_gettid));
#endif
    g_timer_ok = timer_create(CLOCK_MONOTONIC, &sev, &g_timer) == 0;
    if (g_timer_ok) {
        struct itimerspec its{};
        its.it_interval.tv_nsec = its.it_value.tv_nsec = 100 * 1000 * 1000;  // 10 ticks/s
        timer_settime(g_timer, 0, &its, nullptr);
    }
}

static void remove_signals() {
    if (g_timer_ok) timer_delete(g_timer);
    g_timer_ok = false;
    for (int i = 0; i < 5; ++i) sigaction(kSignals[i], &g_old[i], nullptr);
    sigaction(kTickSignal, &g_old_tick, nullptr);
    sigaltstack(&g_old_alt, nullptr);
}

// ---- the launch -----------------------------------------------------------------------------
static uint32_t* g_order;  // block order of a shuffled launch (kept between launches)
static size_t g_order_cap;

static int run_one_block(uint32_t x, uint32_t y, uint32_t z) {
    emu_builtins.block = uint3{x, y, z};
    // Poison shared memory (0xFF bytes read as NaN): reading it before writing shows.
    if (g_sh_size) memset(reinterpret_cast<void*>(g_sh_lo), 0xFF, g_sh_size);
    if (g_dyn_size) memset(emu_dynamic_shared, 0xFF, g_dyn_size);
    if (!run_block()) return g_fault.kind;
    g_cnt.threads += static_cast<uint64_t>(g_nthreads);
    ++g_cnt.blocks;
    return 0;
}

static uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int run_grid(const uint32_t* grid) {
    const uint64_t n = uint64_t(grid[0]) * grid[1] * grid[2];
    if (!g_cfg.shuffle_blocks) {  // blockIdx.x fastest, as a GPU numbers them
        for (uint32_t z = 0; z < grid[2]; ++z)
            for (uint32_t y = 0; y < grid[1]; ++y)
                for (uint32_t x = 0; x < grid[0]; ++x)
                    if (int rc = run_one_block(x, y, z)) return rc;
        return 0;
    }
    // A GPU runs blocks in no promised order: a shuffled order shows what depends on it
    // (atomicAdd into one float sums in a different order: different rounding, run to run).
    if (n > (1u << 26)) {
        set_fault(F_CONFIG, nullptr, nullptr, 0, "shuffled block order: at most %u blocks",
                  1u << 26);
        return F_CONFIG;
    }
    if (n > g_order_cap) {
        free(g_order);
        g_order = static_cast<uint32_t*>(malloc(n * sizeof(uint32_t)));
        g_order_cap = g_order ? n : 0;
        if (!g_order) return F_CONFIG;
    }
    for (uint64_t i = 0; i < n; ++i) g_order[i] = static_cast<uint32_t>(i);
    uint64_t state = g_cfg.seed;
    for (uint64_t i = n - 1; i > 0; --i) {  // Fisher-Yates
        uint64_t j = splitmix64(state) % (i + 1);
        uint32_t tmp = g_order[i];
        g_order[i] = g_order[j];
        g_order[j] = tmp;
    }
    for (uint64_t i = 0; i < n; ++i) {
        const uint32_t b = g_order[i];
        if (int rc = run_one_block(b % grid[0], b / grid[0] % grid[1], b / grid[0] / grid[1]))
            return rc;
    }
    return 0;
}

EMU_API int emu_launch(void (*launcher)(void**), void** args, const uint32_t* grid,
                       const uint32_t* block, uint64_t shared_bytes, const Buf* bufs, int nbuf,
                       const Config* cfg, Counters* out) {
    memset(&g_fault, 0, sizeof g_fault);
    memset(&g_cnt, 0, sizeof g_cnt);
    g_failed = 0;
    g_interrupted = 0;
    g_cur = nullptr;
    g_cfg = *cfg;
    const uint64_t n = uint64_t(block[0]) * block[1] * block[2];
    if (n == 0 || n > kMaxThreads || nbuf > kMaxArgs) {
        set_fault(F_CONFIG, nullptr, nullptr, 0, "block of %llu threads (1..%d allowed)",
                  (unsigned long long)n, kMaxThreads);
        return F_CONFIG;
    }
    size_t stack = size_t(cfg->stack_kib > 0 ? cfg->stack_kib : 64) * 1024;
    if (!ensure_stacks(static_cast<int>(n), stack)) {
        set_fault(F_CONFIG, nullptr, nullptr, 0, "could not map %llu fiber stacks of %zu KiB",
                  (unsigned long long)n, stack / 1024);
        return F_CONFIG;
    }
    if (g_nmod < 0) find_module_ranges();
    g_launcher = launcher, g_args = args, g_bufs = bufs, g_nbuf = nbuf;
    g_nthreads = static_cast<int>(n);
    emu_builtins.block_dim = dim3(block[0], block[1], block[2]);
    emu_builtins.grid_dim = dim3(grid[0], grid[1], grid[2]);
    for (int t = 0; t < g_nthreads; ++t) {
        g_fibers[t].idx = uint3{static_cast<unsigned>(t % block[0]),
                                static_cast<unsigned>(t / block[0] % block[1]),
                                static_cast<unsigned>(t / (block[0] * block[1]))};
    }
    // Shared memory: the static section of this module and the dynamic buffer of this launch.
    if (shared_bytes > g_dyn_cap) {
        free(emu_dynamic_shared);
        emu_dynamic_shared = static_cast<char*>(aligned_alloc(128, (shared_bytes + 127) & ~127ull));
        g_dyn_cap = emu_dynamic_shared ? shared_bytes : 0;
    }
    g_dyn_lo = reinterpret_cast<uintptr_t>(emu_dynamic_shared);
    g_dyn_size = shared_bytes;
    const size_t k = static_cast<size_t>(cfg->kernel) % kMaxKernels;
    if (g_static_by_kernel[k] + shared_bytes > (cfg->shared_opt_in ? 227 : 48) * 1024) {
        set_fault(F_CONFIG, nullptr, nullptr, 0,
                  "shared memory over a GPU's limit: %zu bytes static + %llu dynamic (at most "
                  "48 KiB together unless max_dynamic_shared_size_bytes is raised; 227 KiB "
                  "then, on an H100)",
                  g_static_by_kernel[k], (unsigned long long)shared_bytes);
        return F_CONFIG;
    }
    size_t shadow = (kArena + g_dyn_size + 3) / 4;  // calloc'd pages stay untouched until used
    if (cfg->race_check && shadow > g_shadow_cap) {
        free(g_shadow);
        g_shadow = static_cast<Shadow*>(calloc(shadow, sizeof(Shadow)));
        g_shadow_cap = g_shadow ? shadow : 0;
        g_bepoch = 0;
    }
    if (shadow > g_shadow_cap) g_cfg.race_check = 0;  // no shadow memory: no race check
    if (cfg->race_check && g_bepoch > 0xF0000000u) {  // epochs about to wrap: start afresh
        memset(g_shadow, 0, g_shadow_cap * sizeof(Shadow));
        g_bepoch = 0;
    }
    g_launch_first_epoch = g_bepoch + 1;
    for (int i = 0; i < g_nbuf; ++i) {  // global memory's shadow, one per argument buffer
        if (g_cfg.race_check && g_cfg.counted)
            g_gshadow[i] = static_cast<Shadow*>(calloc((bufs[i].size + 3) / 4, sizeof(Shadow)));
    }

    clock_gettime(CLOCK_MONOTONIC, &g_t0);
    g_launch_tid = static_cast<pid_t>(syscall(SYS_gettid));
    install_signals();
    int rc;
    if (sigsetjmp(g_jmp, 1) == 0) {
        g_in_launch = 1;
        rc = run_grid(grid);
    } else {
        rc = g_fault.kind ? g_fault.kind : F_SIGNAL;  // arrived from a signal handler
    }
    g_in_launch = 0;
    g_cur = nullptr;
    remove_signals();
    for (int i = 0; i < kMaxArgs; ++i) free(g_gshadow[i]), g_gshadow[i] = nullptr;
    g_nbuf = 0;  // the argument buffers belong to the caller: forget them
    *out = g_cnt;
    return rc;
}

EMU_API const Fault* emu_fault() { return &g_fault; }
EMU_API uint64_t emu_static_shared(int kernel) {
    return g_static_by_kernel[static_cast<size_t>(kernel) % kMaxKernels];
}
EMU_API int emu_abi_version() { return 1; }
