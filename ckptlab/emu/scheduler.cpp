// scheduler.cpp: CUDA threads as fibers on one OS thread, the block scheduler, __syncthreads
// and the warp operations.
//
//   scheduler    runs every READY fiber until it blocks (barrier, warp op) or exits; releases a
//                __syncthreads when every live thread waits at the same one; a warp operation
//                completes when every lane of its mask has arrived; anything else (some threads
//                exited, different barriers, a lane missing) is an error.
#include "runtime.h"

#include <sys/mman.h>

// ---- fibers ---------------------------------------------------------------------------------
#if defined(__x86_64__)
// Switch stacks: save the callee-saved registers on the old stack, store its sp, load the new
// sp, restore. ~30 cycles; MXCSR and the x87 control word are never changed by kernels, so
// they are not saved (ucontext's swapcontext would also make a sigprocmask syscall: ~10x slower).
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
#else
ucontext_t g_sched_ctx, g_ctx[kMaxThreads];
extern "C" void emu_fiber_main();
static void fiber_init(Fiber& f) {
    int t = static_cast<int>(&f - g_fibers);
    getcontext(&g_ctx[t]);
    g_ctx[t].uc_stack.ss_sp = f.lo;
    g_ctx[t].uc_stack.ss_size = f.hi - f.lo;
    g_ctx[t].uc_link = nullptr;
    makecontext(&g_ctx[t], emu_fiber_main, 0);
}
#endif

// Stack t's top sits at a different offset modulo 64 KiB for each fiber ("colouring"): with
// identical offsets every fiber's saved registers would fall into the same cache sets and
// evict each other at every switch (measured: ~2x slower barriers).
static size_t colour(int t) { return size_t(t % 64) * 64 + size_t(t / 64 % 16) * 4096; }

bool ensure_stacks(int n, size_t stack_size) {
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

bool run_block() {
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
    return op >= 0 && op <= EMU_SYNCWARP ? names[op] : "warp op";
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
    } else if (w.op != op || w.mask != mask || (op != EMU_SYNCWARP && w.line != line)) {
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
        if (op == EMU_SYNCWARP) {
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
    warp_op(EMU_SYNCWARP, mask, 0, 0, 32, file, line);
}
extern "C" unsigned emu_activemask(void) {
    unsigned m = 0;
    int base = g_cur_tid - g_cur_tid % 32;
    for (int j = 0; j < 32 && base + j < g_nthreads; ++j)
        if (g_fibers[base + j].state != EXITED) m |= 1u << j;
    return m;
}
// A warp-collective library call (wmma::*, emu/include/mma.h) misused by the warp: a lane's
// arguments differ from the others', or a tile is misaligned. The caller found it; this
// reports it as a warp fault at the kernel's line and ends the launch.
extern "C" [[noreturn]] void emu_warp_fault(const char* file, int line, const char* message) {
    set_fault(F_WARP, nullptr, file, line, "%s", message);
    abort_fiber();
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
