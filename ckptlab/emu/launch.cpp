// launch.cpp: emu_launch. Checks the launch, stages the arguments (counted mode), runs the grid
// on the workers (workers.cpp: each takes the next block until the grid is done or a fault
// stops them all), then merges the counters and copies results back.
#include "runtime.h"

#include <stdarg.h>

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
    const uint64_t nblocks = set_grid(grid);
    const int asked = g_cfg.workers < 0 ? -g_cfg.workers : g_cfg.workers;
    g_nworkers = asked < 1 ? 1 : (asked > kMaxWorkers ? kMaxWorkers : asked);
    if (uint64_t(g_nworkers) > nblocks) g_nworkers = static_cast<int>(nblocks);
    if (g_cfg.workers < 0 && nblocks * n < EMU_AUTO_MIN_THREADS) g_nworkers = 1;
    const size_t stack = size_t(g_cfg.stack_kib > 0 ? g_cfg.stack_kib : 64) * 1024;
    if (!ensure_fibers(g_nworkers, static_cast<int>(n), stack))
        return refuse("could not map %llu fiber stacks of %zu KiB",
                      (unsigned long long)(n * g_nworkers), stack / 1024);
    g_nthreads = static_cast<int>(n);
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
    clock_gettime(CLOCK_MONOTONIC, &g_t0);
    // This thread supervises (the watchdog's timer ticks here); the workers run the blocks.
    install_signals(0);
    run_blocks();
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
