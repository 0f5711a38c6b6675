// launch.cpp: emu_launch. Checks the launch, stages the arguments (counted mode), starts the
// workers (the calling thread is worker 0), each of which takes the next block until the grid
// is done or a fault stops them all, then merges the counters and copies results back.
#include "runtime.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <sys/mman.h>

// ---- the state of a launch (runtime.h says what each is) -------------------------------------
Fiber* g_fibers;
uintptr_t g_fbase;
uint64_t g_fspan;
int g_fshift, g_wshift;
uint64_t g_wmask;
uintptr_t g_arena_base, g_shadow_base;
Worker* g_wbase;
size_t g_stack_size;
Worker* g_workers[kMaxWorkers];
int g_nworkers;
extern "C" {
uintptr_t emu_fbase;  // the same as g_fbase, g_fshift, the fibers' heads..., for kernels
uint64_t emu_fshift, emu_wmask;
EmuHead* emu_heads;
EmuDims emu_dims;
uintptr_t emu_arena_base;
}
void (*g_launcher)(void**);
void** g_args_array;
Config g_cfg;
int g_nthreads;
ArgBuf g_args[kMaxArgs];
int g_nargs;
Region g_regions[kMaxArgs];
int g_nregions;
uintptr_t g_arg_base;
uint64_t g_arg_span;
int g_arg_shift;
SharedDecl g_shdecl[kMaxShared];
int g_nshdecl;
uint64_t g_slot_size[kMaxShared + 1];
SlotInfo g_slots[kMaxShared + 1];
uint64_t& g_dyn_size = g_slot_size[0];
uint64_t g_static_by_kernel[kMaxKernels];
volatile int g_stop, g_stop_kind, g_fault_owner = -1;
Fault g_fault;
struct timespec g_t0;

static uint32_t g_grid[3];
static uint64_t g_nblocks;
// The next block to run, taken by every worker: a cache line of its own (no false sharing with
// g_stop, which every memory hook reads).
static struct alignas(64) { uint64_t value; } g_next;
static uint32_t* g_order;  // block order of a shuffled launch (kept between launches)
static size_t g_order_cap;

// ---- workers ----------------------------------------------------------------------------------
// Workers' state and shared arenas each in one region, so that a memory hook finds its worker's
// from the stack pointer by arithmetic alone (memory.cpp). The arenas' region grows (afresh:
// shared memory holds nothing from one block to the next) when a launch wants more workers.
// Worker k's arena sits k strides of 1 << g_wshift (as its stacks do in the fiber region) from
// the arenas' base: the hot path masks the stack offset instead of shifting it (memory.cpp).
static int g_arena_workers, g_arena_wshift;

static bool ensure_workers(int n) {
    if (!g_wbase) {
        void* m = mmap(nullptr, sizeof(Worker) * kMaxWorkers, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return false;
        g_wbase = static_cast<Worker*>(m);
    }
    if (n > g_arena_workers || g_wshift != g_arena_wshift) {
        if (g_arena_base)
            munmap(reinterpret_cast<void*>(g_arena_base), size_t(g_arena_workers) << g_arena_wshift);
        void* a = mmap(nullptr, size_t(n) << g_wshift, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        g_arena_base = emu_arena_base = a == MAP_FAILED ? 0 : reinterpret_cast<uintptr_t>(a);
        g_arena_workers = a == MAP_FAILED ? 0 : n;
        g_arena_wshift = g_wshift;
        for (int k = 0; k < kMaxWorkers; ++k) g_workers[k] = nullptr;
        if (a == MAP_FAILED) return false;
    }
    for (int k = 0; k < n; ++k) {
        Worker* w = &g_wbase[k];
        w->index = k;
        w->fibers = g_fibers + size_t(k) * kMaxThreads;
        w->arena = reinterpret_cast<char*>(g_arena_base + (uint64_t(k) << g_wshift));
        g_workers[k] = w;
    }
    return true;
}

static void start_block(Worker* w, uint64_t b) {
    const uint3 idx{static_cast<unsigned>(b % g_grid[0]),
                    static_cast<unsigned>(b / g_grid[0] % g_grid[1]),
                    static_cast<unsigned>(b / g_grid[0] / g_grid[1])};
    w->block_linear = b, w->block = idx;
    for (int t = 0; t < g_nthreads; ++t) w->fibers[t].block = idx;
    poison_shared(w);
}

// A worker runs blocks until the grid is done or a fault stops every worker; true if its thread
// must retire: a signal stopped it inside the C library, where it may be in the middle of
// something, so it runs no more blocks: it ends after saying it is done.
static sem_t g_done;
static bool g_alive[kMaxWorkers];  // worker k has a thread (pool_thread, below)

static bool work(Worker* w) {
    worker_signals(w, true);
    bool retire = false;
    if (sigsetjmp(w->jmp, 1) == 0) {
        while (!g_stop) {
            const uint64_t i = __atomic_fetch_add(&g_next.value, 1, __ATOMIC_RELAXED);
            if (i >= g_nblocks || shared_over_limit()) break;
            start_block(w, g_cfg.shuffle_blocks ? g_order[i] : i);
            if (!run_block(w)) break;
            w->cnt.threads += static_cast<uint64_t>(g_nthreads);
            ++w->cnt.blocks;
        }
    } else {
        retire = w->pending_retire;
        record_pending_fault(w);  // arrived from a signal handler
    }
    w->cur = nullptr;
    worker_signals(w, false);  // from here on no signal reaches this thread
    if (retire) g_alive[w->index] = false;  // before the launch ends: the next starts another
    sem_post(&g_done);
    return retire;
}

// The workers' OS threads live as long as the module (a pool): a thread woken for each launch
// keeps its caches and saves a thread's creation per launch. Between launches they block every
// signal. A forked child has none of them: the pool is started afresh there.
static sem_t g_go[kMaxWorkers];
static pid_t g_pool_pid;

static void* pool_thread(void* arg) {
    Worker* w = static_cast<Worker*>(arg);
    const int k = w->index;  // (each launch writes w->index again while this thread waits)
    for (;;) {
        while (sem_wait(&g_go[k]) != 0) {}
        if (work(w)) break;
    }
    // Retired: the thread ends (after work() said it is done and blocked every signal), so that
    // its stack and mappings are released and the next launch starts another in its place, and
    // faults repeated launch after launch cannot pile up parked threads. A lock of glibc's that
    // it held stays held, as it would have parked (and as on the calling thread, which goes on).
    return nullptr;
}

static void init_pool() {
    if (g_pool_pid == getpid()) return;  // else the first launch, or a forked child
    for (int k = 0; k < kMaxWorkers; ++k) {
        g_alive[k] = false;
        sem_init(&g_go[k], 0, 0);
    }
    sem_init(&g_done, 0, 0);
    g_pool_pid = getpid();
}

static bool start_workers(int n) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;  // a new thread starts with every signal blocked, like an idle one
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int k = 0;
    for (; k < n; ++k) {
        if (g_alive[k]) continue;
        pthread_t thread;
        if (pthread_create(&thread, &attr, pool_thread, g_workers[k])) break;
        g_alive[k] = true;
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    pthread_attr_destroy(&attr);
    return k == n;
}

static uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// A GPU runs blocks in no promised order: a shuffled order shows what depends on it (atomicAdd
// into one float sums in a different order: different rounding, run to run).
static bool shuffle_order() {
    const uint64_t n = g_nblocks;
    if (n > (1u << 26)) {
        set_fault(nullptr, F_CONFIG, nullptr, nullptr, 0,
                  "shuffled block order: at most %u blocks", 1u << 26);
        return false;
    }
    if (n > g_order_cap) {
        free(g_order);
        g_order = static_cast<uint32_t*>(malloc(n * sizeof(uint32_t)));
        g_order_cap = g_order ? n : 0;
        if (!g_order) return false;
    }
    for (uint64_t i = 0; i < n; ++i) g_order[i] = static_cast<uint32_t>(i);
    uint64_t state = g_cfg.seed;
    for (uint64_t i = n - 1; i > 0; --i) {  // Fisher-Yates
        const uint64_t j = splitmix64(state) % (i + 1);
        std::swap(g_order[i], g_order[j]);
    }
    return true;
}

// ---- the launch -------------------------------------------------------------------------------
static int refuse(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static int refuse(const char* fmt, ...) {
    char text[sizeof g_fault.message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    set_fault(nullptr, F_CONFIG, nullptr, nullptr, 0, "%s", text);
    return F_CONFIG;
}

static int prepare(const uint32_t* grid, const uint32_t* block, uint64_t shared_bytes,
                   const Buf* bufs, int nbuf, void** args) {
    const uint64_t n = uint64_t(block[0]) * block[1] * block[2];
    if (n == 0 || n > kMaxThreads)
        return refuse("block of %llu threads (1..%d allowed)", (unsigned long long)n, kMaxThreads);
    if (nbuf > kMaxArgs)
        return refuse("%d pointer parameters; the emulator tracks at most %d", nbuf, kMaxArgs);
    g_nblocks = uint64_t(grid[0]) * grid[1] * grid[2];
    const int asked = g_cfg.workers < 0 ? -g_cfg.workers : g_cfg.workers;
    g_nworkers = asked < 1 ? 1 : (asked > kMaxWorkers ? kMaxWorkers : asked);
    if (uint64_t(g_nworkers) > g_nblocks) g_nworkers = static_cast<int>(g_nblocks);
    if (g_cfg.workers < 0 && g_nblocks * n < EMU_AUTO_MIN_THREADS) g_nworkers = 1;
    const size_t stack = size_t(g_cfg.stack_kib > 0 ? g_cfg.stack_kib : 64) * 1024;
    if (!ensure_fibers(g_nworkers, static_cast<int>(n), stack))
        return refuse("could not map %llu fiber stacks of %zu KiB",
                      (unsigned long long)(n * g_nworkers), stack / 1024);
    g_nthreads = static_cast<int>(n);
    for (int i = 0; i < 3; ++i) g_grid[i] = grid[i];
    emu_dims.block_dim = dim3(block[0], block[1], block[2]);
    emu_dims.grid_dim = dim3(grid[0], grid[1], grid[2]);
    if (shared_bytes > kShMaxObj)
        return refuse("%llu bytes of dynamic shared memory: at most %zu",
                      (unsigned long long)shared_bytes, kShMaxObj);
    g_dyn_size = shared_bytes;
    g_slots[0] = SlotInfo{static_cast<uint32_t>(emu_slot_start(0)),
                          static_cast<uint32_t>(shared_bytes)};
    const size_t k = static_cast<size_t>(g_cfg.kernel) % kMaxKernels;
    if (g_static_by_kernel[k] + shared_bytes >
        (g_cfg.shared_opt_in ? EMU_SHARED_OPTIN_LIMIT : EMU_SHARED_STATIC_LIMIT))
        return refuse("shared memory over a GPU's limit: %llu bytes static + %llu dynamic (at "
                      "most 48 KiB together unless max_dynamic_shared_size_bytes is raised; "
                      "227 KiB then, on an H100)", (unsigned long long)g_static_by_kernel[k],
                      (unsigned long long)shared_bytes);
    if (!ensure_workers(g_nworkers))
        return refuse("out of memory for %d workers' shared memory", g_nworkers);
    if (g_cfg.race_check && g_cfg.counted && !ensure_shadows(g_nworkers))
        return refuse("out of memory for %d workers' race check", g_nworkers);
    for (int kw = 0; kw < g_nworkers; ++kw) {
        Worker* w = g_workers[kw];
        memset(&w->cnt, 0, sizeof w->cnt);
        memset(shared_counts(w->arena), 0, 3 * sizeof(uint64_t));
        w->cur = nullptr, w->tid = 0;
        w->busy = 0;
        for (int t = 0; t < g_nthreads; ++t) {
            Fiber& f = w->fibers[t];
            f.idx = uint3{static_cast<unsigned>(t % block[0]),
                          static_cast<unsigned>(t / block[0] % block[1]),
                          static_cast<unsigned>(t / (block[0] * block[1]))};
            f.tid = static_cast<uint16_t>(t);
        }
    }
    if (!stage_args(bufs, nbuf, args)) return refuse("could not stage %d arguments", nbuf);
    if (g_cfg.counted && !alloc_touched())
        return refuse("out of memory for the unique-byte bitmaps");
    for (int i = 0; i < g_nargs && g_cfg.race_check && g_cfg.counted; ++i) {
        g_args[i].shadow = static_cast<Shadow*>(calloc((g_args[i].size + 3) / 4 + 1,
                                                       sizeof(Shadow)));
        if (!g_args[i].shadow)
            return refuse("out of memory for the race check of %llu bytes",
                          (unsigned long long)g_args[i].size);
    }
    if (!trace_start()) return refuse("the access trace needs counted mode");
    if (g_cfg.shuffle_blocks && !shuffle_order()) return F_CONFIG;
    return 0;
}

static void finish(Counters* out) {
    memset(out, 0, sizeof *out);
    for (int k = 0; k < g_nworkers; ++k) {  // sums: the same whatever worker ran what
        const Counters& c = g_workers[k]->cnt;
        for (int i = 0; i < kMaxArgs; ++i) {
            out->read[i] += c.read[i], out->write[i] += c.write[i];
            out->atomic_ops[i] += c.atomic_ops[i], out->atomic_bytes[i] += c.atomic_bytes[i];
        }
        const uint64_t* sh = shared_counts(g_workers[k]->arena);
        out->shared_read += sh[0], out->shared_write += sh[1], out->shared_atomics += sh[2];
        out->threads += c.threads, out->blocks += c.blocks;
    }
    out->workers = static_cast<uint64_t>(g_nworkers);
    count_touched(*out);
    trace_finish();
    for (int i = 0; i < g_nargs; ++i) free(g_args[i].shadow), g_args[i].shadow = nullptr;
    unstage_args();
    g_nargs = 0;  // the argument buffers belong to the caller: forget them
}

EMU_API int emu_launch(void (*launcher)(void**), void** args, const uint32_t* grid,
                       const uint32_t* block, uint64_t shared_bytes, const Buf* bufs, int nbuf,
                       const Config* cfg, Counters* out) {
    memset(&g_fault, 0, sizeof g_fault);
    g_fault_owner = -1;
    g_stop = 0;
    g_stop_kind = 0;
    g_nworkers = 0, g_nargs = 0;
    g_cfg = *cfg;
    g_launcher = launcher, g_args_array = args;
    find_module_ranges();
    int rc = prepare(grid, block, shared_bytes, bufs, nbuf, args);
    if (rc) {
        finish(out);
        return rc;
    }
    reset_stripes();
    reset_heap_lock();
    g_next.value = 0;
    clock_gettime(CLOCK_MONOTONIC, &g_t0);
    // This thread supervises (the watchdog's timer ticks here); the workers run the blocks.
    install_signals(0);
    // One worker: the calling thread itself (no thread to wake; a fault inside the C library is
    // then survived without retiring a thread). More: the pool's threads.
    int started = 0;
    init_pool();
    if (g_nworkers == 1) {
        work(g_workers[0]);
        while (sem_wait(&g_done) != 0) {}
    } else {
        if (start_workers(g_nworkers))
            for (; started < g_nworkers; ++started) sem_post(&g_go[started]);
        if (!started)
            set_fault(nullptr, F_CONFIG, nullptr, nullptr, 0, "could not start a worker thread");
        for (int done = 0; done < started;)
            if (sem_wait(&g_done) == 0) ++done;  // else EINTR: a timer tick
    }
    const int kind = g_stop_kind;
    remove_signals();
    if (g_fault_owner < 0) shared_over_limit();  // declarations this launch made
    if (g_fault_owner < 0 && kind)  // asked to stop, and it ended before a thread could say where
        set_fault(nullptr, kind, nullptr, nullptr, 0, kind == F_WATCHDOG
                  ? "watchdog: the launch ran longer than the limit" : "interrupted (Ctrl-C)");
    finish(out);
    return g_fault_owner >= 0 ? g_fault.kind : 0;
}

EMU_API const Fault* emu_fault() { return &g_fault; }
EMU_API uint64_t emu_static_shared(int kernel) {
    return g_static_by_kernel[static_cast<size_t>(kernel) % kMaxKernels];
}
EMU_API int emu_abi_version() { return EMU_ABI_VERSION; }
// "Struct.field@offset+size,..." for every field Python's ctypes mirrors (ckptlab/emu/abi.py)
EMU_API const char* emu_abi_layout() {
    static char out[4096];  // (the layout is about 900 characters)
    int n = 0;
#define EMU_FIELD(S, f)                                                                       \
    n += snprintf(out + n, sizeof out - n, "%s%s.%s@%zu+%zu", n ? "," : "", #S, #f,         \
                  offsetof(S, f), sizeof(((S*)nullptr)->f))
    EMU_FIELD(Buf, lo); EMU_FIELD(Buf, size); EMU_FIELD(Buf, arg); EMU_FIELD(Buf, param);
    EMU_FIELD(Buf, readonly);
    EMU_FIELD(Config, counted); EMU_FIELD(Config, race_check); EMU_FIELD(Config, stack_kib);
    EMU_FIELD(Config, shuffle_blocks); EMU_FIELD(Config, watchdog_s); EMU_FIELD(Config, seed);
    EMU_FIELD(Config, kernel); EMU_FIELD(Config, shared_opt_in); EMU_FIELD(Config, workers);
    EMU_FIELD(Config, fiber_region); EMU_FIELD(Config, trace); EMU_FIELD(Config, trace_cap);
    EMU_FIELD(Counters, read); EMU_FIELD(Counters, write); EMU_FIELD(Counters, atomic_ops);
    EMU_FIELD(Counters, atomic_bytes); EMU_FIELD(Counters, unique_read);
    EMU_FIELD(Counters, unique_write); EMU_FIELD(Counters, shared_read);
    EMU_FIELD(Counters, shared_write); EMU_FIELD(Counters, shared_atomics);
    EMU_FIELD(Counters, threads); EMU_FIELD(Counters, blocks); EMU_FIELD(Counters, workers);
    EMU_FIELD(Fault, kind); EMU_FIELD(Fault, has_thread); EMU_FIELD(Fault, block);
    EMU_FIELD(Fault, thread); EMU_FIELD(Fault, pc); EMU_FIELD(Fault, line);
    EMU_FIELD(Fault, file); EMU_FIELD(Fault, message);
    EMU_FIELD(FiberRegion, base); EMU_FIELD(FiberRegion, span);
    EMU_FIELD(FiberRegion, stack_size); EMU_FIELD(FiberRegion, shift);
    EMU_FIELD(FiberRegion, workers); EMU_FIELD(FiberRegion, mapped);
    EMU_FIELD(TraceEvent, where); EMU_FIELD(TraceEvent, block); EMU_FIELD(TraceEvent, thread);
    EMU_FIELD(TraceEvent, arg); EMU_FIELD(TraceEvent, kind);
#undef EMU_FIELD
    return out;
}
