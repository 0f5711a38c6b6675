// signals.cpp: faults, and the signals that end a launch without ending the process.
//
//   faults     the first one (set_fault: claimed atomically among workers) becomes the EmuError
//              Python raises; it stops every worker. In-fiber errors switch back to the
//              worker's scheduler; signals record what they saw and siglongjmp to the worker.
//   stopping   the watchdog and Ctrl-C ask every worker to stop (request_stop). A kernel thread
//              stops only where nothing it interrupted can hold a lock: at a memory hook, a
//              barrier, a warp operation, malloc/free (all in the runtime), or at a timer tick
//              that finds it in the kernel's own code; never inside libc (a malloc interrupted
//              and abandoned would leave glibc's arena locked: the next malloc would hang).
//              Ticks come every 100 ms, every 1 ms once a stop is asked. The message is written
//              after the siglongjmp; the source line is found by Python after the launch.
#include "runtime.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdarg>

// ---- faults -----------------------------------------------------------------------------------
static double elapsed_s() {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - g_t0.tv_sec) + 1e-9 * (now.tv_nsec - g_t0.tv_nsec);
}

void set_fault(Worker* w, int kind, void* pc, const char* file, int line, const char* fmt, ...) {
    int expected = -1;
    if (!__atomic_compare_exchange_n(&g_fault_owner, &expected, w ? w->index : kMaxWorkers,
                                     false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;  // keep the first fault
    g_fault.kind = kind;
    Fiber* f = self();  // the thread at fault: the running one, or one the scheduler names
    if (!f && w) f = w->cur;
    if (w) {
        g_fault.block[0] = w->block.x, g_fault.block[1] = w->block.y;
        g_fault.block[2] = w->block.z;
    }
    g_fault.has_thread = f != nullptr;
    if (f) g_fault.thread[0] = f->idx.x, g_fault.thread[1] = f->idx.y, g_fault.thread[2] = f->idx.z;
    g_fault.pc = pc_offset(pc);
    g_fault.line = line;
    snprintf(g_fault.file, sizeof g_fault.file, "%s", file ? file : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_fault.message, sizeof g_fault.message, fmt, ap);
    va_end(ap);
    request_stop(0);
}

// An error found while a fiber runs: record it (set_fault) and leave that fiber for good.
[[noreturn]] void abort_fiber(Fiber* f) {
    f->state = ABORTED;
    switch_to_scheduler(f);
    __builtin_unreachable();
}

void stop_message(Worker* w, int kind, void* pc, const char* file, int line) {
    if (kind == F_WATCHDOG)
        set_fault(w, F_WATCHDOG, pc, file, line,
                  "watchdog: the launch ran longer than %.1f s (an endless loop or a spin-wait "
                  "that no other thread can release?); change the limit with "
                  "ckptlab.emu.configure(watchdog_s=...)",
                  g_cfg.watchdog_s);
    else if (kind == F_INTERRUPT)
        set_fault(w, F_INTERRUPT, pc, file, line, "interrupted (Ctrl-C) after %.1f s",
                  elapsed_s());
}

// A kernel thread at a safe point sees a stop: the watchdog or Ctrl-C names this place.
[[noreturn]] void stop_here(Fiber* f, void* pc, const char* file, int line) {
    if (g_fault_owner < 0) stop_message(worker_of(f), g_stop_kind, pc, file, line);
    abort_fiber(f);
}

// GCC's -fsanitize=alignment (build.py) calls this where the kernel dereferences a pointer
// that is not a multiple of its type's alignment, before the access, whatever loads GCC then
// makes of it (a float4 read as four floats is still a float4 access on a GPU, and faults
// there: cudaErrorMisalignedAddress). Its arguments, as GCC lays them out; no UBSan runtime is
// linked.
struct UbsanType { uint16_t kind, info; char name[1]; };
struct UbsanMismatch {
    const char* file;
    uint32_t line, column;
    const UbsanType* type;
    unsigned char log_align, check_kind;
};
extern "C" void __ubsan_handle_type_mismatch_v1(UbsanMismatch* d, uintptr_t a) {
    static const char* const kWhat[] = {"a load of", "a store to", "a reference to",
                                        "a member access within", "a member call on",
                                        "a constructor call on"};
    Fiber* f = self();
    if (!f) return;  // (kernel code runs on fibers only)
    if (g_stop) stop_here(f, __builtin_return_address(0), d->file, int(d->line));
    const size_t align = size_t(1) << d->log_align;
    char where[320];
    describe_address(where, sizeof where, f, a, align);
    set_fault(worker_of(f), F_ACCESS, __builtin_return_address(0), d->file, int(d->line),
              "misaligned address: %s %s at %p, which its type requires to be a multiple of %zu "
              "bytes (cudaErrorMisalignedAddress on a GPU): %s",
              d->check_kind < 6 ? kWhat[d->check_kind] : "a use of", d->type->name,
              reinterpret_cast<void*>(a), align, where);
    abort_fiber(f);
}

void describe_thread(char* out, size_t n, const Fiber& f) {
    snprintf(out, n, "(%u,%u,%u)", f.idx.x, f.idx.y, f.idx.z);
}

static volatile double g_stop_time;
void request_stop(int kind) {
    int none = 0;
    if (kind) __atomic_compare_exchange_n(&g_stop_kind, &none, kind, false, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE);
    if (!__atomic_exchange_n(&g_stop, 1, __ATOMIC_ACQ_REL)) g_stop_time = elapsed_s();
}

// ---- signals ---------------------------------------------------------------------------------
static const int kTickSignal = SIGRTMIN + 4;
static const int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGINT};
constexpr int kNSignals = 6;
static struct sigaction g_old[kNSignals], g_old_tick;
static timer_t g_timer;
static bool g_timer_ok, g_fast_ticks;
static volatile int g_active, g_interrupt;  // a launch runs; Ctrl-C arrived during it
static pid_t g_launch_tid;
static sigset_t g_launch_mask;  // the launching thread's: the workers take it while they work

static pid_t gettid_() { return static_cast<pid_t>(syscall(SYS_gettid)); }
static Worker* this_worker() {
    const pid_t me = gettid_();
    for (int k = 0; k < g_nworkers; ++k)
        if (g_workers[k] && __atomic_load_n(&g_workers[k]->tid, __ATOMIC_RELAXED) == me)
            return g_workers[k];
    return nullptr;
}

static void forward(int sig, siginfo_t* si, void* uc) {  // to whoever had the signal before
    for (int i = 0; i < kNSignals; ++i) {
        if (kSignals[i] != sig) continue;
        const struct sigaction& old = g_old[i];
        if (old.sa_handler == SIG_IGN) return;
        if (old.sa_handler == SIG_DFL) {
            sigaction(sig, &old, nullptr);
            if (sig == SIGINT) raise(sig);
            return;  // a fault re-executes its instruction: the default action follows
        }
        if (old.sa_flags & SA_SIGINFO) old.sa_sigaction(sig, si, uc);
        else old.sa_handler(sig);
    }
}

// Ctrl-C may reach any thread. During a launch the launching thread's next tick stops it; if
// the launch ended meanwhile, whoever takes g_interrupt back (here, or emu_launch) passes it on.
static void on_sigint(siginfo_t* si, void* uc) {
    if (__atomic_load_n(&g_active, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&g_interrupt, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&g_active, __ATOMIC_SEQ_CST)) return;
        if (!__atomic_exchange_n(&g_interrupt, 0, __ATOMIC_SEQ_CST)) return;
    }
    forward(SIGINT, si, uc);
}

// The launching thread's timer: the watchdog, Ctrl-C, and once a stop is asked, a tick to
// each worker every 1 ms until it has stopped.
static void supervise() {
    if (__atomic_exchange_n(&g_interrupt, 0, __ATOMIC_SEQ_CST)) request_stop(F_INTERRUPT);
    else if (!g_stop && elapsed_s() >= g_cfg.watchdog_s) request_stop(F_WATCHDOG);
    if (!g_stop) return;
    if (!g_fast_ticks && g_timer_ok) {
        struct itimerspec its{};
        its.it_interval.tv_nsec = its.it_value.tv_nsec = 1000 * 1000;
        timer_settime(g_timer, 0, &its, nullptr);
        g_fast_ticks = true;
    }
    for (int k = 0; k < g_nworkers; ++k) {  // (not itself, worker 0 of a one-worker launch)
        const pid_t tid = __atomic_load_n(&g_workers[k]->tid, __ATOMIC_RELAXED);
        if (tid && tid != g_launch_tid) syscall(SYS_tgkill, getpid(), tid, kTickSignal);
    }
}

// A worker's tick: stop here only in the kernel's own code (no lock held), or after 5 s of
// trying (a thread blocked that long in libc: then it is retired).
static void tick(Worker* w, Fiber* f, uintptr_t pc) {
    if (!g_stop || !f || w->busy) return;
    const bool safe = in_kernel_code(pc);
    if (!safe && elapsed_s() - g_stop_time < 5.0) return;
    w->pending_kind = g_fault_owner < 0 ? g_stop_kind : 0;
    w->pending_sig = kTickSignal;
    w->pending_pc = reinterpret_cast<void*>(pc + 1);  // Python looks up pc - 1
    w->pending_retire = !safe;
    w->cur = f;
    siglongjmp(w->jmp, 1);
}

static void on_signal(int sig, siginfo_t* si, void* ucv) {
    const int saved_errno = errno;
    if (sig == SIGINT) {
        on_sigint(si, ucv);
        errno = saved_errno;
        return;
    }
    Worker* w = g_active ? this_worker() : nullptr;
    uintptr_t pc = 0, sp = 0;
#if defined(__x86_64__)
    pc = static_cast<uintptr_t>(static_cast<ucontext_t*>(ucv)->uc_mcontext.gregs[REG_RIP]);
    sp = static_cast<uintptr_t>(static_cast<ucontext_t*>(ucv)->uc_mcontext.gregs[REG_RSP]);
#elif defined(__aarch64__)
    pc = static_cast<uintptr_t>(static_cast<ucontext_t*>(ucv)->uc_mcontext.pc);
    sp = static_cast<uintptr_t>(static_cast<ucontext_t*>(ucv)->uc_mcontext.sp);
#endif
    // the fiber interrupted, from its stack pointer (its stack's guard included)
    Fiber* f = w && sp - g_fbase < g_fspan ? &g_fibers[(sp - g_fbase) >> g_fshift] : nullptr;
    if (sig == kTickSignal) {
        if (g_active && gettid_() == g_launch_tid) supervise();
        if (w) tick(w, f, pc);  // (the launching thread is worker 0 of a one-worker launch)
        errno = saved_errno;
        return;
    }
    if (!f) {  // not from a kernel thread
        forward(sig, si, ucv);
        errno = saved_errno;
        return;
    }
    w->pending_kind = F_SIGNAL, w->pending_sig = sig;
    w->pending_pc = reinterpret_cast<void*>(pc + 1);
    w->pending_addr = si->si_addr;
    // Inside the C library (glibc's abort on a corrupted heap, a bad pointer in memcpy): it may
    // hold a lock. The kernel's code and the runtime's hold none of glibc's.
    w->pending_retire = !in_module(pc);
    w->cur = f;
    request_stop(0);
    siglongjmp(w->jmp, 1);
}

// After a siglongjmp: the message, now that no handler runs and no lock is held.
void record_pending_fault(Worker* w) {
    Fiber* f = w->cur;
    void* pc = w->pending_pc;
    const int sig = w->pending_sig;
    if (w->pending_kind == F_WATCHDOG || w->pending_kind == F_INTERRUPT)
        return stop_message(w, w->pending_kind, pc, nullptr, 0);
    if (w->pending_kind != F_SIGNAL) return;  // stopped for another worker's fault
    const uintptr_t a = reinterpret_cast<uintptr_t>(w->pending_addr);
    if ((sig == SIGSEGV || sig == SIGBUS) && f &&
        a + kGuard + (1u << 20) >= reinterpret_cast<uintptr_t>(stack_lo(*f)) &&
        a < reinterpret_cast<uintptr_t>(stack_lo(*f))) {
        set_fault(w, F_STACK, pc, nullptr, 0,
                  "fiber stack overflow: this thread used more than its %zu KiB stack (large "
                  "local arrays?); raise it with ckptlab.emu.configure(stack_kib=...)",
                  g_stack_size / 1024);
    } else if (sig == SIGSEGV || sig == SIGBUS) {
        char where[320];
        describe_address(where, sizeof where, f, a, 1);
        set_fault(w, F_SIGNAL, pc, nullptr, 0, "invalid memory access at %p (%s): %s",
                  w->pending_addr, sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", where);
    } else if (sig == SIGFPE) {
        set_fault(w, F_SIGNAL, pc, nullptr, 0,
                  "arithmetic exception (SIGFPE): an integer division by zero? (on a GPU it "
                  "gives garbage instead)");
    } else if (sig == SIGABRT) {
        set_fault(w, F_SIGNAL, pc, nullptr, 0,
                  "abort() (SIGABRT) inside the C library: glibc found a corrupted heap (a "
                  "free of a bad pointer?); its abort() does not expect to return, so restart "
                  "Python before trusting this process further");
    } else {
        set_fault(w, F_SIGNAL, pc, nullptr, 0, "illegal instruction (SIGILL)");
    }
}

void install_signals(int /* watchdog_ms, unused */) {
    g_launch_tid = gettid_();
    pthread_sigmask(SIG_SETMASK, nullptr, &g_launch_mask);
    g_fast_ticks = false;
    struct sigaction sa{};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < kNSignals; ++i) {  // a process that ignores Ctrl-C keeps ignoring it
        sigaction(kSignals[i], nullptr, &g_old[i]);
        if (kSignals[i] != SIGINT || g_old[i].sa_handler != SIG_IGN) sigaction(kSignals[i], &sa, 0);
    }
    sigaction(kTickSignal, &sa, &g_old_tick);
    struct sigevent sev{};
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = kTickSignal;
#ifdef sigev_notify_thread_id
    sev.sigev_notify_thread_id = g_launch_tid;
#else
    sev._sigev_un._tid = g_launch_tid;
#endif
    g_timer_ok = timer_create(CLOCK_MONOTONIC, &sev, &g_timer) == 0;
    if (g_timer_ok) {
        struct itimerspec its{};
        its.it_interval.tv_nsec = its.it_value.tv_nsec = 100 * 1000 * 1000;  // 10 ticks/s
        timer_settime(g_timer, 0, &its, nullptr);
    }
    __atomic_store_n(&g_interrupt, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_active, 1, __ATOMIC_SEQ_CST);
}

void remove_signals() {
    __atomic_store_n(&g_active, 0, __ATOMIC_SEQ_CST);
    if (g_timer_ok) timer_delete(g_timer);
    g_timer_ok = false;
    for (int i = 0; i < kNSignals; ++i) sigaction(kSignals[i], &g_old[i], nullptr);
    sigaction(kTickSignal, &g_old_tick, nullptr);
    // A Ctrl-C that arrived during the launch and stopped nothing: Python's handler gets it now.
    if (__atomic_exchange_n(&g_interrupt, 0, __ATOMIC_SEQ_CST)) raise(SIGINT);
}

// Each worker's OS thread handles its signals on a stack of its own (a fiber's overflow).
void worker_signals(Worker* w, bool on) {
    if (on) {
        pthread_sigmask(SIG_SETMASK, &g_launch_mask, nullptr);
        w->pending_retire = false;
        __atomic_store_n(&w->tid, gettid_(), __ATOMIC_RELAXED);  // the supervisor reads it
        if (!w->altstack) w->altstack = static_cast<char*>(malloc(64 * 1024));
        stack_t ss{};
        ss.ss_sp = w->altstack;
        ss.ss_size = 64 * 1024;
        sigaltstack(&ss, &w->old_altstack);
    } else {
        // A pool thread goes idle with every signal blocked (a late tick stays pending until its
        // next launch); the launching thread, worker 0 of a one-worker launch, keeps its mask.
        if (gettid_() != g_launch_tid) {
            sigset_t all;
            sigfillset(&all);
            pthread_sigmask(SIG_BLOCK, &all, nullptr);
        }
        __atomic_store_n(&w->tid, 0, __ATOMIC_RELAXED);
        sigaltstack(&w->old_altstack, nullptr);
    }
}
