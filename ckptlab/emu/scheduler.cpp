// scheduler.cpp: CUDA threads as fibers, a block's fibers on one worker (an OS thread), the
// block scheduler, __syncthreads and the warp operations.
//
//   scheduler    runs every READY fiber until it blocks (barrier, warp op) or exits; releases a
//                __syncthreads when every live thread waits at the same one; a warp operation
//                completes when every lane of its mask has arrived; anything else (some threads
//                exited, different barriers, a lane missing) is an error.
#include "runtime.h"

#include <sys/mman.h>

// ---- fibers ---------------------------------------------------------------------------------
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
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
    const uintptr_t hi = reinterpret_cast<uintptr_t>(stack_lo(f)) + g_stack_size;
    uint64_t* sp = reinterpret_cast<uint64_t*>(hi & ~uintptr_t(15));
    *--sp = 0;                                                // padding
    *--sp = reinterpret_cast<uint64_t>(&emu_fiber_entry);     // where the first switch returns
    for (int i = 0; i < 6; ++i) *--sp = 0;                    // rbp rbx r12-r15
    f.sp = sp;
}
#else
#include <ucontext.h>
static ucontext_t* g_ctx;  // one per fiber, and one per worker's scheduler after them
extern "C" void emu_fiber_main();
static ucontext_t& ctx_of(Fiber& f) { return g_ctx[&f - g_fibers]; }
static ucontext_t& sched_ctx(Worker* w) { return g_ctx[kMaxWorkers * kMaxThreads + w->index]; }
static void fiber_init(Fiber& f) {
    ucontext_t& c = ctx_of(f);
    getcontext(&c);
    c.uc_stack.ss_sp = stack_lo(f);
    c.uc_stack.ss_size = g_stack_size;
    c.uc_link = nullptr;
    makecontext(&c, emu_fiber_main, 0);
}
void switch_to_fiber(Worker* w, Fiber& f) { swapcontext(&sched_ctx(w), &ctx_of(f)); }
void switch_to_scheduler(Fiber* f) { swapcontext(&ctx_of(*f), &sched_ctx(worker_of(f))); }
void switch_between(Fiber* f, Fiber& next) { swapcontext(&ctx_of(*f), &ctx_of(next)); }
#endif


// The fiber region (abi.h: EmuFiberRegion, one per process): kMaxThreads slots per worker, each
// a guard range and a stack, at base + (slot << shift), so that a fiber finds its slot from its
// stack pointer. This module's globals copy it at each launch.
static bool ensure_region(FiberRegion& R, int workers, int threads, size_t stack_size) {
    const size_t need = kGuard + stack_size + kMaxColour;
    int shift = 18;  // at least: g_wshift = shift + 10 >= kArenaShift
    while ((size_t(1) << shift) < need) ++shift;
    if (stack_size != R.stack_size || workers > R.workers || !R.base) {  // a new region
        if (R.base) munmap(reinterpret_cast<void*>(R.base), R.span);
        R.base = 0, R.span = 0, R.workers = 0;
        const uint64_t span = uint64_t(workers) * kMaxThreads << shift;
        void* m = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (m == MAP_FAILED) return false;
        for (int k = 0; k < kMaxWorkers; ++k) R.mapped[k] = 0;
        R.base = reinterpret_cast<uintptr_t>(m), R.span = span, R.stack_size = stack_size;
        R.shift = shift, R.workers = workers;
    }
    for (int k = 0; k < workers; ++k) {
        for (; R.mapped[k] < threads; ++R.mapped[k]) {
            const int t = R.mapped[k];
            const size_t slot = size_t(k) * kMaxThreads + size_t(t);
            char* base = reinterpret_cast<char*>(R.base + (slot << shift));
            // the stack starts at base + kGuard + colour(t): PROT_NONE below (< 4 KiB of slack)
            char* rw = base + kGuard + colour(t) / 4096 * 4096;
            if (mprotect(rw, (size_t(1) << shift) - size_t(rw - base), PROT_READ | PROT_WRITE))
                return false;
        }
    }
    return true;
}

bool ensure_fibers(int workers, int threads, size_t stack_size) {
    FiberRegion* R = reinterpret_cast<FiberRegion*>(g_cfg.fiber_region);
    if (!R || !ensure_region(*R, workers, threads, stack_size)) return false;
    if (!g_fibers) {  // this module's fibers: one per slot of the region
        const size_t bytes = size_t(kMaxWorkers) * kMaxThreads * sizeof(Fiber);
        void* fibers = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (fibers == MAP_FAILED) return false;
        g_fibers = static_cast<Fiber*>(fibers);
        emu_heads = reinterpret_cast<EmuHead*>(g_fibers);
#if !(defined(__x86_64__) && !defined(EMU_UCONTEXT))
        g_ctx = static_cast<ucontext_t*>(calloc(size_t(kMaxWorkers) * (kMaxThreads + 1),
                                                sizeof(ucontext_t)));
        if (!g_ctx) return false;
#endif
    }
    g_stack_size = R->stack_size, g_fshift = R->shift;
    g_wshift = R->shift + 10;  // >= 28: an arena fits in a worker's stride
    static_assert(kMaxThreads == 1 << 10, "g_wshift");
    emu_wmask = g_wmask = ~((uint64_t(1) << g_wshift) - 1);
    g_fspan = R->span;
    emu_fshift = static_cast<uint64_t>(R->shift);
    emu_fbase = g_fbase = R->base;
    return true;
}

// ---- the scheduler --------------------------------------------------------------------------

extern "C" __attribute__((used)) void emu_fiber_main() {
    g_launcher(g_args_array);
    Fiber* f = self();
    warp_pending_check(f);  // may abort: a lane waits for this one at a warp op
    f->state = EXITED;
    yield_fiber(f);
    __builtin_unreachable();
}

// A thread that stops running (at a barrier, a warp operation, its end) hands the worker to the
// next READY thread of this pass itself, or back to the scheduler when the pass is over: one
// switch per thread and pass instead of two (a fault or a stop goes to the scheduler).
// Before it switches it asks for the top of the stack of the thread after that one: its saved
// registers and the frames it returns through, which left the cache since its last turn (a
// block's stacks do not fit in L1) and would stall it once it runs (SGEMM 256^3 fast, one
// worker: 80 -> 65-68 CPU ms, 2 to 6 lines about equal, 8 and 12 slower).
constexpr int kPrefetchLines = 4;
void yield_fiber(Fiber* f) {
    Worker* w = worker_of(f);
    w->n_waiting += f->state == AT_BARRIER;
    w->n_exited += f->state == EXITED;
    if (!g_stop) {
        Fiber* fib = w->fibers;
        for (int t = f->tid + 1; t < g_nthreads; ++t)
            if (fib[t].state == READY) {
                if (t + 1 < g_nthreads) {
                    const char* sp = static_cast<const char*>(fib[t + 1].sp);
                    for (int i = 0; i < kPrefetchLines; ++i) __builtin_prefetch(sp + 64 * i, 1);
                }
                return switch_between(f, fib[t]);
            }
    }
    switch_to_scheduler(f);
}

static void barrier_error(Worker* w) {
    // Nobody can run. Explain why: exited threads, different barriers, or a stuck warp op.
    Fiber* fib = w->fibers;
    int exited = 0, waiting = 0, first = -1, other = -1;
    for (int t = 0; t < g_nthreads; ++t) {
        const Fiber& f = fib[t];
        if (f.state == EXITED) { ++exited; continue; }
        if (f.state == AT_WARP) {
            const Warp& wp = w->warps[t / 32];
            unsigned missing = wp.mask & ~wp.arrived;
            int m = __builtin_ctz(missing ? missing : 1) + (t / 32) * 32;
            char who[32], miss[32];
            describe_thread(who, sizeof who, f);
            describe_thread(miss, sizeof miss, fib[m]);
            const Fiber& mf = fib[m];
            w->cur = &fib[t];
            set_fault(w, F_WARP, nullptr, f.file, f.line,
                      "deadlock: thread %s waits at a warp operation (mask 0x%08x) at %s:%d for "
                      "lane %d, thread %s, which %s %s:%d",
                      who, wp.mask, f.file, f.line, m % 32, miss,
                      mf.state == AT_BARRIER ? "waits at __syncthreads at" : "waits at",
                      mf.file ? mf.file : "?", mf.line);
            w->cur = nullptr;
            return;
        }
        ++waiting;
        if (first < 0) first = t;
        else if (other < 0 && (f.line != fib[first].line || f.file != fib[first].file))
            other = t;
    }
    const Fiber& f = fib[first];
    w->cur = &fib[first];
    if (exited) {
        set_fault(w, F_BARRIER, nullptr, f.file, f.line,
                  "__syncthreads at %s:%d reached by %d of %d threads; the other %d exited "
                  "(undefined behaviour on a GPU: it may hang or silently skip the barrier)",
                  f.file, f.line, waiting, g_nthreads, exited);
    } else {
        char a[32], b[32];
        describe_thread(a, sizeof a, f);
        describe_thread(b, sizeof b, fib[other]);
        set_fault(w, F_BARRIER, nullptr, f.file, f.line,
                  "threads wait at different __syncthreads: thread %s at %s:%d, thread %s at "
                  "%s:%d (a barrier inside divergent code)",
                  a, f.file, f.line, b, fib[other].file, fib[other].line);
    }
    w->cur = nullptr;
}

static bool release_barrier(Worker* w) {
    // Every thread has exited or waits at a barrier. Release them if all live threads wait at
    // the same __syncthreads (one barrier epoch further); anything else is an error.
    if (w->n_exited) { barrier_error(w); return false; }
    Fiber* fib = w->fibers;
    const Fiber& first = fib[0];
    int count = 0;
    for (int t = 0; t < g_nthreads; ++t) {
        Fiber& f = fib[t];
        if (f.line != first.line || f.file != first.file) { barrier_error(w); return false; }
        count += f.pred;
        f.state = READY;
    }
    w->reduce_result = count;  // emu_syncthreads_reduce turns it into count/and/or
    w->n_waiting = 0;
    ++w->bepoch;
    set_epoch(w);
    return true;
}

// A stop asked from outside (watchdog, Ctrl-C) while the block's threads wait: the first one
// that waits somewhere names the place.
static bool stop_block(Worker* w) {
    for (int t = 0; t < g_nthreads && g_fault_owner < 0; ++t) {
        Fiber& f = w->fibers[t];
        if (f.file && f.state != EXITED) {
            w->cur = &f;
            stop_message(w, g_stop_kind, nullptr, f.file, f.line);
            w->cur = nullptr;
        }
    }
    return false;
}

// Run the worker's current block (w->fibers' idx and block set). False: a fault, or a stop.
bool run_block(Worker* w) {
    w->bepoch = 0;
    ++w->block_seq;
    set_epoch(w);
    Fiber* fib = w->fibers;
    for (int t = 0; t < g_nthreads; ++t) {
        Fiber& f = fib[t];
        f.state = READY;
        f.file = nullptr;
        f.line = 0;
        fiber_init(f);
    }
    for (int k = 0; k < (g_nthreads + 31) / 32; ++k) w->warps[k].active = false;
    w->n_exited = w->n_waiting = 0;
    for (;;) {
        // One pass: every READY thread runs until it blocks or exits, in order, each handing
        // over to the next (yield_fiber). A completed warp operation may make lanes before the
        // current one READY: the next pass runs them.
        int first = 0;
        while (first < g_nthreads && fib[first].state != READY) ++first;
        if (first < g_nthreads) {
            if (g_stop) return stop_block(w);
            switch_to_fiber(w, fib[first]);
            if (g_fault_owner >= 0) return false;  // a fault, this worker's or another's
            if (g_stop) return stop_block(w);
        }
        if (w->n_exited == g_nthreads) return true;
        if (w->n_exited + w->n_waiting == g_nthreads) {
            if (!release_barrier(w)) return false;
        } else if (first == g_nthreads) {
            barrier_error(w);  // threads stuck at warp operations
            return false;
        }
    }
}

// ---- __syncthreads and warp operations (called from fibers) --------------------------------
void wait_here(Fiber* f, uint8_t state, const char* file, int line) {
    if (g_stop) stop_here(f, nullptr, file, line);
    f->state = state, f->file = file, f->line = line;
    yield_fiber(f);
}
extern "C" void emu_syncthreads(const char* file, int line) {
    Fiber* f = self_fiber();
    f->pred = 0;
    wait_here(f, AT_BARRIER, file, line);
}
extern "C" int emu_syncthreads_reduce(int op, int pred, const char* file, int line) {
    Fiber* f = self_fiber();
    f->pred = pred != 0;
    wait_here(f, AT_BARRIER, file, line);
    if (op == 0) return worker_of(f)->reduce_result;
    if (op == 1) return worker_of(f)->reduce_result == g_nthreads;  // no thread may have exited
    return worker_of(f)->reduce_result != 0;
}

