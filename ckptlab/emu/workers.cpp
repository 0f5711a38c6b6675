// workers.cpp: the workers that run a launch's blocks, and the order they take them in.
//
//   workers   each worker's state and shared arena in one region, found from the stack pointer
//             by arithmetic (memory.cpp); worker 0 is the calling thread, the rest a pool of
//             OS threads that lives as long as the module, woken once a launch.
//   blocks    every worker takes the next block (one atomic counter) until the grid is done or
//             a fault stops them all; in a shuffled launch, in a seeded random order.
#include "runtime.h"

#include <pthread.h>
#include <semaphore.h>
#include <sys/mman.h>

#include <utility>

static uint32_t g_grid[3];
static uint64_t g_nblocks;
// The next block to run, taken by every worker: a cache line of its own (no false sharing with
// g_stop, which every memory hook reads).
static struct alignas(64) { uint64_t value; } g_next;
static uint32_t* g_order;  // block order of a shuffled launch (kept between launches)
static size_t g_order_cap;

uint64_t set_grid(const uint32_t* grid) {
    for (int i = 0; i < 3; ++i) g_grid[i] = grid[i];
    return g_nblocks = uint64_t(grid[0]) * grid[1] * grid[2];
}

// ---- workers ----------------------------------------------------------------------------------
// Workers' state and shared arenas each in one region, so that a memory hook finds its worker's
// from the stack pointer by arithmetic alone (memory.cpp). The arenas' region grows (afresh:
// shared memory holds nothing from one block to the next) when a launch wants more workers.
// Worker k's arena sits k strides of 1 << g_wshift (as its stacks do in the fiber region) from
// the arenas' base: the hot path masks the stack offset instead of shifting it (memory.cpp).
static int g_arena_workers, g_arena_wshift;

bool ensure_workers(int n) {
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
bool shuffle_order() {
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

// The whole grid, from its first block. One worker: the calling thread itself (no thread to
// wake; a fault inside the C library is then survived without retiring a thread). More: the
// pool's threads, which this thread waits for (a timer tick interrupts the wait: EINTR).
void run_blocks() {
    g_next.value = 0;
    init_pool();
    if (g_nworkers == 1) {
        work(g_workers[0]);
        while (sem_wait(&g_done) != 0) {}
        return;
    }
    int started = 0;
    if (start_workers(g_nworkers))
        for (; started < g_nworkers; ++started) sem_post(&g_go[started]);
    if (!started)
        set_fault(nullptr, F_CONFIG, nullptr, nullptr, 0, "could not start a worker thread");
    for (int done = 0; done < started;)
        if (sem_wait(&g_done) == 0) ++done;
}
