// runtime.h: what the emulator's runtime files share: the state of a launch and of its workers,
// the objects kernel memory is made of, and the few functions one file gives another.
//
//   scheduler.cpp  fibers, the block scheduler, __syncthreads
//   warps.cpp      the warp operations, __trap, assert, abort
//   memory.cpp     the memory hooks: classification, byte counts, bounds, atomics' checks
//   atomics.cpp    CUDA's atomics and the C++ atomics of the kernel file
//   races.cpp      the race check's shadow memory
//   objects.cpp    the objects accesses are checked against: staged kernel arguments, shared
//                  arrays, __device__ variables, device malloc blocks
//   regions.cpp    where the module's code and data lie, and the runtime's own
//   signals.cpp    faults, signals (stack overflow, SIGSEGV, abort), the watchdog, Ctrl-C
//   trace.cpp      the access trace: who read or wrote each byte of each kernel argument
//   workers.cpp    the workers: their pool of threads, the blocks they take, in what order
//   launch.cpp     emu_launch: checks, stages, runs the grid on the workers, merges the counts
//
// All of it is compiled WITHOUT the sanitizer (its own loads and stores must not call the
// hooks) and linked into every emulated kernel module, its code and data renamed into sections
// of their own (build.py), so that the runtime can tell the kernel's code and data from its own.
#pragma once
#include "shim.h"  // includes abi.h: fault and warp-op codes, limits, the ctypes structures
// The runtime itself uses glibc's (shim.h points kernels at its checked versions).
#undef malloc
#undef free
#undef abort

#include <setjmp.h>
#include <signal.h>
#include <time.h>

#define EMU_API extern "C" __attribute__((visibility("default")))

// Everything declared below is internal to the module: hidden visibility lets the compiler
// reach the globals directly (PC-relative) instead of through the GOT, on the hot paths.
#pragma GCC visibility push(hidden)

constexpr int kMaxThreads = EMU_MAX_BLOCK_THREADS;
constexpr int kMaxArgs = EMU_MAX_ARGS;
constexpr int kMaxWorkers = EMU_MAX_WORKERS;
constexpr size_t kGuard = 64 * 1024;  // PROT_NONE below each fiber stack
constexpr size_t kMaxKernels = 256;
// Shared memory: each worker has an arena of 1 MiB slots (kShShift, shim.h), slot 0 the dynamic
// buffer and slot 1 + id the static declaration id, its data in the middle (kShHalf): an index
// that leaves an array by less than 512 KiB lands in that array's own slot and is reported
// against it.
constexpr size_t kShMaxObj = 256 * 1024;  // > EMU_SHARED_OPTIN_LIMIT: shadow entries per slot
constexpr int kMaxShared = 255;           // static __shared__ declarations per module
constexpr uint64_t kArenaSpan = uint64_t(kMaxShared + 1) << kShShift;
static_assert(kArenaSpan == uint64_t(1) << kArenaShift, "an arena is 2^kArenaShift bytes");
// What the hot path needs of its worker sits at the start of the worker's arena, in slot 0's
// front margin, where it is found with no pointer to follow (an access is checked before it
// happens, so a kernel never reaches it): the shared-memory byte counts, and for the race check
// the current epoch and __syncwarp id.
struct ArenaHead {
    uint64_t shared[3];  // bytes read, written; atomics
    uint64_t epoch;      // (block_seq << kEpochBits) | bepoch of the worker's block
    uint32_t sync_id;    // completed __syncwarps (the race check's warp-level ordering)
};
inline ArenaHead* arena_head(const char* arena) {
    return reinterpret_cast<ArenaHead*>(const_cast<char*>(arena));
}
inline uint64_t* shared_counts(const char* arena) { return arena_head(arena)->shared; }

using Buf = EmuBuf;
using Config = EmuConfig;
using Counters = EmuCounters;
using Fault = EmuFault;
using FiberRegion = EmuFiberRegion;

enum State : uint8_t { READY, AT_BARRIER, AT_WARP, EXITED, ABORTED };
enum FaultKind {
    F_NONE = EMU_F_NONE, F_BARRIER = EMU_F_BARRIER, F_WARP = EMU_F_WARP, F_ACCESS = EMU_F_ACCESS,
    F_RACE = EMU_F_RACE, F_STACK = EMU_F_STACK, F_SIGNAL = EMU_F_SIGNAL,
    F_WATCHDOG = EMU_F_WATCHDOG, F_INTERRUPT = EMU_F_INTERRUPT, F_TRAP = EMU_F_TRAP,
    F_CONFIG = EMU_F_CONFIG
};

struct Worker;
struct Conflict { const char* theirs; size_t byte; int other_tid; bool other_block; };
// One CUDA thread. g_fibers[k * kMaxThreads + t] is thread t of worker k, and its stack is slot
// k * kMaxThreads + t of the fiber region: a fiber finds itself from its stack pointer (self()).
// One cache line each; kernels read idx and block through shim.h's EmuHead.
struct alignas(64) Fiber {
    uint3 idx;            // threadIdx
    uint3 block;          // blockIdx
    void* sp;             // saved while it waits
    void* sched_sp;       // its worker's scheduler's, saved while it runs
    const char* file;     // where it waits
    int line;
    int pred;             // __syncthreads_count/and/or argument
    uint16_t tid;         // linear thread index in the block
    uint8_t state;
};
static_assert(sizeof(Fiber) == sizeof(EmuHead) && offsetof(Fiber, idx) == offsetof(EmuHead, idx) &&
                  offsetof(Fiber, block) == offsetof(EmuHead, block),
              "shim.h's EmuHead is the head of a Fiber");
struct Warp {
    bool active;
    int op, line;
    unsigned mask, arrived;
    const char* file;
    unsigned long long val[32], result[32];
    int arg[32], width[32];
};
// Race check: one per 4 bytes of shared memory or of a kernel argument. An epoch is
// (identity << 24 | barrier epoch of the block): identity = the block's linear index + 1 for
// global memory (a fresh shadow each launch), the worker's block count for shared memory.
// 32 bytes: never across two cache lines.
struct Shadow {
    uint64_t w_epoch, r_epoch;  // of the last write, of the current readers
    uint32_t r_lanes;           // reader lanes, when every reader is in warp r_warp
    uint16_t w_sync, r_sync;    // __syncwarp id (low 16 bits) at the write / the latest read
    uint16_t r_other;           // identity (low 16 bits) of a read by another block (global)
    uint16_t w_tid;             // the writer; bit 15: it was an atomic (never races another)
    uint16_t r_warp;            // the readers' warp, or kManyWarps
    uint8_t bytes;              // bytes of the granule written (low 4 bits) / read (high 4)
    uint8_t pad;
    int w_thread() const { return w_tid & 0x7FFF; }
    bool w_atomic() const { return w_tid >> 15; }
    uint8_t w_bytes() const { return bytes & 15; }
    uint8_t r_bytes() const { return bytes >> 4; }
};
// a __syncwarp id later than `then` (16-bit ids, compared modulo 2^16)
inline bool synced_after(uint32_t common, uint16_t then) {
    return static_cast<int16_t>(static_cast<uint16_t>(common) - then) > 0;
}
static_assert(sizeof(Shadow) == EMU_SHADOW_BYTES, "abi.h's EMU_SHADOW_BYTES: Python's estimate");
constexpr uint16_t kManyWarps = 0xFFFF;
constexpr int kEpochBits = 24;

// One OS thread running blocks, each with its own fiber scheduler and shared memory.
struct Worker {
    int index;
    pid_t tid;                        // its OS thread, while a launch runs
    Fiber* fibers;                    // &g_fibers[index * kMaxThreads]
    Fiber* cur;                       // the fiber a scheduler-side fault or a signal names
    int n_exited, n_waiting;          // threads of the block that exited / wait at a barrier
    int reduce_result;                // __syncthreads_count's
    uint32_t bepoch;                  // barrier epoch within the block
    uint64_t block_seq;               // blocks this worker ever ran (shared memory's identity)
    uint64_t block_linear;            // the current block's linear index in the grid
    uint3 block;                      // its blockIdx
    Counters cnt;                     // merged into the launch's when it ends
    char* arena;                      // shared memory: kArenaSpan bytes of slots (kShShift)
    Shadow* shadow;                   // shared-memory race shadow, kShMaxObj / 4 per slot
    Warp warps[kMaxThreads / 32];
    uint32_t common[kMaxThreads / 32][32][32];  // latest __syncwarp id lanes a, b shared
    Conflict conflict;                // the race check's finding
    sigjmp_buf jmp;                   // a fault raised by a signal lands here
    int pending_kind;                 // ... after recording what it was
    void *pending_pc, *pending_addr;
    int pending_sig;
    bool pending_retire;              // stopped inside the C library: park the thread after
    volatile int busy;                // inside a runtime lock: no siglongjmp now
    char* altstack;                   // sigaltstack of the worker's OS thread
    stack_t old_altstack;
};

// Kernel arguments (counted mode): staged copies, each region (overlapping arguments merged) in
// a slot of its own with wide margins, so an access is checked against its own argument.
struct ArgBuf {
    uintptr_t lo, orig;               // staged and caller's addresses
    uint64_t size;
    int counter, param;               // counter index (0..63) and parameter index
    bool readonly;                    // a const parameter
    bool traced;                      // its accesses are recorded (trace.cpp)
    bool full_path;                   // every access takes arg_access: shadow or traced
    Shadow* shadow;                   // race check, fresh each launch
    uint64_t *touched_r, *touched_w;  // unique bytes
};
struct Region {
    uintptr_t lo, orig;
    uint64_t size;
    int first, n;                     // its buffers: g_args[first .. first + n)
    bool writable;                    // some parameter in it is not const
};
struct SharedDecl { const char* name; };

// ---- module-wide state (objects.cpp, launch.cpp, signals.cpp define them) ----------------------
extern Fiber* g_fibers;               // kMaxThreads per worker
extern uintptr_t g_fbase;             // the fiber stack region: slot s at g_fbase + (s << g_fshift)
extern uint64_t g_fspan;
extern int g_fshift;
extern int g_wshift;                  // g_fshift + log2(kMaxThreads): stack offset -> worker
extern uint64_t g_wmask;              // ~((1 << g_wshift) - 1)
extern uintptr_t g_arena_base;        // worker k's shared arena: g_arena_base + (k << g_wshift)
extern uintptr_t g_shadow_base;       // its race shadow: g_shadow_base + (k << (g_wshift + 2))
extern Worker* g_wbase;               // every worker's state, one after another
extern size_t g_stack_size;           // usable bytes per fiber stack
extern Worker* g_workers[kMaxWorkers];
extern int g_nworkers;                // workers of this launch
extern EmuDims emu_dims;              // blockDim, gridDim (shim.h)
extern void (*g_launcher)(void**);
extern void** g_args_array;
extern Config g_cfg;
extern int g_nthreads;
// arguments
extern ArgBuf g_args[kMaxArgs];
extern int g_nargs;
extern Region g_regions[kMaxArgs];
extern int g_nregions;
extern uintptr_t g_arg_base;
extern uint64_t g_arg_span;
extern int g_arg_shift;
// shared memory
extern SharedDecl g_shdecl[kMaxShared];
extern int g_nshdecl;
extern uint64_t g_slot_size[kMaxShared + 1];  // bytes of each arena slot: 0 dynamic, 1 + id
struct SlotInfo { uint32_t start, size; };     // the same, with where the data starts
extern SlotInfo g_slots[kMaxShared + 1];
extern uint64_t& g_dyn_size;                  // g_slot_size[0]
extern uint64_t g_static_by_kernel[kMaxKernels];
// stopping
extern volatile int g_stop;           // a fault, the watchdog or Ctrl-C: every worker stops
extern volatile int g_stop_kind;      // F_WATCHDOG / F_INTERRUPT when asked from outside
extern volatile int g_fault_owner;    // the worker whose fault is reported, or -1
extern Fault g_fault;
extern struct timespec g_t0;

// ---- the running fiber, from the stack pointer ----------------------------------------------
__attribute__((always_inline)) inline uintptr_t stack_pointer() { return emu_sp(); }  // shim.h
// The fiber running on this stack, or null outside a kernel thread (the scheduler, Python).
__attribute__((always_inline)) inline Fiber* self() {
    const uint64_t o = stack_pointer() - g_fbase;
    return o < g_fspan ? &g_fibers[o >> g_fshift] : nullptr;
}
// The same where only a kernel thread can be calling (barriers, warp operations).
__attribute__((always_inline)) inline Fiber* self_fiber() {
    return &g_fibers[(stack_pointer() - g_fbase) >> g_fshift];
}

// Fiber t's stack top sits at a different offset modulo 128 KiB for each fiber ("colouring"),
// spread over every cache line of that span (97 is odd: t -> 97 t mod 2048 is one to one):
// with identical offsets every fiber's saved registers would fall into the same cache sets and
// evict each other at every switch (measured: ~2x slower barriers), and with offsets bunched
// into a few pages they crowd the L2's sets (measured: 1.3x slower SGEMM).
inline size_t colour(int t) { return size_t(t * 97 % 2048) * 64; }
constexpr size_t kMaxColour = 2047 * 64;
// The worker a fiber belongs to.
inline Worker* worker_of(const Fiber* f) {
    return &g_wbase[static_cast<size_t>(f - g_fibers) / kMaxThreads];
}
// A fiber's usable stack: [stack_lo, stack_lo + g_stack_size); PROT_NONE below.
inline char* stack_lo(const Fiber& f) {
    const size_t slot = static_cast<size_t>(&f - g_fibers);
    return reinterpret_cast<char*>(g_fbase + (slot << g_fshift)) + kGuard + colour(f.tid);
}

// ---- switching between a worker's scheduler and a fiber (scheduler.cpp) -----------------------
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
extern "C" void emu_switch(void** save_sp, void* new_sp);
inline void switch_to_fiber(Worker*, Fiber& f) { emu_switch(&f.sched_sp, f.sp); }
inline void switch_to_scheduler(Fiber* f) { emu_switch(&f->sp, f->sched_sp); }
inline void switch_between(Fiber* f, Fiber& next) {
    next.sched_sp = f->sched_sp;
    emu_switch(&f->sp, next.sp);
}
#else
void switch_to_fiber(Worker* w, Fiber& f);
void switch_to_scheduler(Fiber* f);
void switch_between(Fiber* f, Fiber& next);
#endif

// ---- what one file gives another --------------------------------------------------------------
// workers.cpp
uint64_t set_grid(const uint32_t* grid);  // the launch's grid; returns its number of blocks
bool ensure_workers(int n);                // n workers' state and shared arenas, mapped
bool shuffle_order();                      // a seeded block order (g_cfg.seed), else a fault
void run_blocks();                         // every block of the grid, on g_nworkers workers
// memory.cpp
void on_atomic(void* p, size_t size, void* pc);  // check and count one atomic access
// regions.cpp
uint64_t pc_offset(void* pc);
bool in_kernel_code(uintptr_t pc);
bool in_runtime_data(uintptr_t a);
bool in_module(uintptr_t a);
void find_module_ranges();
// signals.cpp
void set_fault(Worker* w, int kind, void* pc, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 6, 7)));
[[noreturn]] void abort_fiber(Fiber* f);
[[noreturn]] void stop_here(Fiber* f, void* pc, const char* file, int line);
void stop_message(Worker* w, int kind, void* pc, const char* file, int line);  // if async
void describe_thread(char* out, size_t n, const Fiber& f);
void request_stop(int kind);
void install_signals(int watchdog_ms);
void remove_signals();
void worker_signals(Worker* w, bool on);  // its alternate signal stack
void record_pending_fault(Worker* w);     // after a signal's siglongjmp
// scheduler.cpp
bool ensure_fibers(int workers, int threads, size_t stack_size);
bool run_block(Worker* w);
void wait_here(Fiber* f, uint8_t state, const char* file, int line);
void yield_fiber(Fiber* f);  // f has stopped running: to the next READY thread
// warps.cpp
void warp_pending_check(Fiber* f);  // a thread about to exit: no lane may wait for it
// memory.cpp
bool alloc_touched();
void count_touched(Counters& out);
// trace.cpp
using TraceEvent = EmuTraceEvent;
bool trace_start();                   // from g_cfg: false if it asks for what cannot be done
void trace_access(const Worker* w, const Fiber* f, const ArgBuf* b, uint64_t off, size_t n,
                  int kind);
void trace_finish();
// races.cpp
// true on a conflict, described in w->conflict (report it once no lock is held)
bool race_check_shared(Worker* w, int tid, Shadow* shadow, size_t off, size_t size, int kind);
bool race_check_global(Worker* w, int tid, Shadow* shadow, size_t off, size_t size, int kind);
[[noreturn]] void report_race(Fiber* f, const Conflict& c, int kind, int param, void* pc);
void reset_stripes();
void lock_stripe(int arg, size_t off, size_t size);
void unlock_stripe(int arg, size_t off, size_t size);
// objects.cpp
bool stage_args(const Buf* bufs, int nbuf, void** args);
void unstage_args();
bool ensure_shadows(int workers);  // the race check's, for shared memory
void poison_shared(Worker* w);  // before each block
bool shared_over_limit();       // records the fault
enum ObjKind { OBJ_NONE, OBJ_DEVICE, OBJ_HEAP };
struct Found { int kind; uintptr_t lo; uint64_t size; const char* name; };
Found find_object(uintptr_t a, bool wait = true);  // a __device__ variable or malloc block
void describe_address(char* out, size_t n, Fiber* f, uintptr_t a, size_t size);
void reset_heap_lock();

inline uint32_t& sync_id(Worker* w) { return arena_head(w->arena)->sync_id; }
// The block's epoch changed (a new block, a released barrier): the hot path's copy too.
inline void set_epoch(Worker* w) {
    arena_head(w->arena)->epoch = (w->block_seq << kEpochBits) | w->bepoch;
}

#pragma GCC visibility pop
