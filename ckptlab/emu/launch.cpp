// launch.cpp: emu_launch (a grid, block after block), faults and signals.
//
//   faults   become an EmuFault the Python side raises as EmuError; the process survives:
//            in-fiber errors switch back to the scheduler, signals (SIGSEGV, stack overflow,
//            SIGFPE, the watchdog timer, Ctrl-C) siglongjmp back to emu_launch.
#include "runtime.h"

#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdlib>

// ---- the state of a launch (runtime.h says what each is) -------------------------------------
EmuBuiltins emu_builtins;   // threadIdx, blockIdx, blockDim, gridDim (shim.h)
char* emu_dynamic_shared;   // the launch's dynamic shared memory (shim.h)
char* g_arena;
size_t g_static_by_kernel[kMaxKernels];  // static shared bytes each kernel declared
Fiber g_fibers[kMaxThreads];
Warp g_warps[kMaxThreads / 32];
// __syncwarp bookkeeping for the race check: every completed __syncwarp gets an id, and
// g_common[w][a][b] is the latest id in which lanes a and b of warp w took part together.
uint32_t g_sync_id;
uint32_t g_common[kMaxThreads / 32][32][32];
uint32_t g_block_first_epoch, g_launch_first_epoch;  // epochs: newer = this block/launch
Shadow* g_gshadow[kMaxArgs];  // per argument buffer, fresh each launch (race check)
uint64_t* g_touched_read[kMaxArgs];
uint64_t* g_touched_write[kMaxArgs];
size_t g_stack_size;        // usable bytes per fiber stack
int g_nstacks;
void* g_sched_sp;
Fiber* volatile g_cur;      // the running fiber, or null in the scheduler
int g_cur_tid;
int g_nthreads;
void (*g_launcher)(void**);
void** g_args;
Config g_cfg;
Counters g_cnt;
Fault g_fault;
volatile sig_atomic_t g_failed, g_in_launch, g_interrupted;
sigjmp_buf g_jmp;
const Buf* g_bufs;
int g_nbuf;
uintptr_t g_sh_lo, g_dyn_lo;  // static arena (g_sh_size bytes in use), dynamic buffer
size_t g_sh_size, g_dyn_size, g_dyn_cap;
Shadow* g_shadow;
size_t g_shadow_cap;
uint32_t g_bepoch;          // barrier epoch: +1 per block and per released barrier
int g_reduce_result;
int g_n_exited, g_n_waiting;  // threads of the block that exited / wait at a barrier
uintptr_t g_mod_lo[16], g_mod_hi[16];
int g_nmod = -1;
struct timespec g_t0;

// ---- faults ---------------------------------------------------------------------------------
uint64_t pc_offset(void* pc) {
    Dl_info info;
    if (pc && dladdr(pc, &info) && info.dli_fbase)
        return reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase);
    return 0;
}
void set_fault(int kind, void* pc, const char* file, int line, const char* fmt, ...) {
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
[[noreturn]] void abort_fiber() {
    g_cur->state = ABORTED;
    switch_to_scheduler();
    __builtin_unreachable();
}
void describe_thread(char* out, size_t n, int t) {
    const Fiber& f = g_fibers[t];
    snprintf(out, n, "(%u,%u,%u)", f.idx.x, f.idx.y, f.idx.z);
}

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
    if (g_static_by_kernel[k] + shared_bytes >
        (cfg->shared_opt_in ? EMU_SHARED_OPTIN_LIMIT : EMU_SHARED_STATIC_LIMIT)) {
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
    if (g_cfg.counted && !alloc_touched(nbuf)) {
        set_fault(F_CONFIG, nullptr, nullptr, 0, "out of memory for the unique-byte bitmaps");
        count_touched(g_cnt);
        for (int i = 0; i < kMaxArgs; ++i) free(g_gshadow[i]), g_gshadow[i] = nullptr;
        return F_CONFIG;
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
    count_touched(g_cnt);
    g_nbuf = 0;  // the argument buffers belong to the caller: forget them
    *out = g_cnt;
    return rc;
}

EMU_API const Fault* emu_fault() { return &g_fault; }
EMU_API uint64_t emu_static_shared(int kernel) {
    return g_static_by_kernel[static_cast<size_t>(kernel) % kMaxKernels];
}
EMU_API int emu_abi_version() { return EMU_ABI_VERSION; }
// "Struct.field@offset+size,..." for every field Python's ctypes mirrors (ckptlab/emu/abi.py)
EMU_API const char* emu_abi_layout() {
    static char out[1024];
    int n = 0;
#define EMU_FIELD(S, f)                                                                       \
    n += snprintf(out + n, sizeof out - n, "%s%s.%s@%zu+%zu", n ? "," : "", #S, #f,         \
                  offsetof(S, f), sizeof(((S*)nullptr)->f))
    EMU_FIELD(Buf, lo); EMU_FIELD(Buf, size); EMU_FIELD(Buf, arg);
    EMU_FIELD(Config, counted); EMU_FIELD(Config, race_check); EMU_FIELD(Config, stack_kib);
    EMU_FIELD(Config, shuffle_blocks); EMU_FIELD(Config, watchdog_s); EMU_FIELD(Config, seed);
    EMU_FIELD(Config, kernel); EMU_FIELD(Config, shared_opt_in);
    EMU_FIELD(Counters, read); EMU_FIELD(Counters, write); EMU_FIELD(Counters, atomic_ops);
    EMU_FIELD(Counters, atomic_bytes); EMU_FIELD(Counters, unique_read);
    EMU_FIELD(Counters, unique_write); EMU_FIELD(Counters, shared_read);
    EMU_FIELD(Counters, shared_write); EMU_FIELD(Counters, shared_atomics);
    EMU_FIELD(Counters, threads); EMU_FIELD(Counters, blocks);
    EMU_FIELD(Fault, kind); EMU_FIELD(Fault, has_thread); EMU_FIELD(Fault, block);
    EMU_FIELD(Fault, thread); EMU_FIELD(Fault, pc); EMU_FIELD(Fault, line);
    EMU_FIELD(Fault, file); EMU_FIELD(Fault, message);
#undef EMU_FIELD
    return out;
}
