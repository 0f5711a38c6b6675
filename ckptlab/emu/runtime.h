// runtime.h: what the emulator's runtime files share: the state of a launch, the structures
// Python reads (Buf, Config, Counters, Fault), and the few functions one file gives another.
//
//   scheduler.cpp  fibers, the block scheduler, __syncthreads and the warp operations
//   memory.cpp     the memory hooks: classification, byte counts, bounds, races, atomics,
//                  and the static shared-memory arena
//   launch.cpp     emu_launch, faults, signals (stack overflow, SIGSEGV, watchdog, Ctrl-C)
//
// All of it is compiled WITHOUT the sanitizer (its own loads and stores must not call the
// hooks) and linked into every emulated kernel module. A launch is serial and may be abandoned
// by siglongjmp, so its state lives in globals, defined in launch.cpp.
#pragma once
#include "shim.h"  // includes abi.h: fault and warp-op codes, limits, the ctypes structures

#include <setjmp.h>
#include <signal.h>
#include <time.h>

#define EMU_API extern "C" __attribute__((visibility("default")))

// Everything declared below is internal to the module: hidden visibility lets the compiler
// reach the globals directly (PC-relative) instead of through the GOT, on the hot paths.
#pragma GCC visibility push(hidden)

constexpr int kMaxThreads = EMU_MAX_BLOCK_THREADS;
constexpr int kMaxArgs = EMU_MAX_ARGS;
constexpr size_t kGuard = 64 * 1024;  // PROT_NONE below each fiber stack
constexpr size_t kArena = 1 << 20;    // the module's static shared memory (memory.cpp)
constexpr size_t kMaxKernels = 256;

using Buf = EmuBuf;
using Config = EmuConfig;
using Counters = EmuCounters;
using Fault = EmuFault;

enum State : uint8_t { READY, AT_BARRIER, AT_WARP, EXITED, ABORTED };
// fault kinds, by their short names (abi.h defines them)
enum FaultKind {
    F_NONE = EMU_F_NONE, F_BARRIER = EMU_F_BARRIER, F_WARP = EMU_F_WARP, F_ACCESS = EMU_F_ACCESS,
    F_RACE = EMU_F_RACE, F_STACK = EMU_F_STACK, F_SIGNAL = EMU_F_SIGNAL,
    F_WATCHDOG = EMU_F_WATCHDOG, F_INTERRUPT = EMU_F_INTERRUPT, F_TRAP = EMU_F_TRAP,
    F_CONFIG = EMU_F_CONFIG
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
constexpr uint16_t kManyWarps = 0xFFFF;

// ---- the state of a launch (defined in launch.cpp) ------------------------------------------
// Static shared memory: every `__shared__` declaration of the module gets its place in this
// arena the first time it executes (emu_shared_alloc); blocks run one after another, so one copy
// is right. (A linker section would be simpler, but GCC ignores section attributes on the
// static locals of template instantiations.) Dynamic shared memory is a separate buffer.
extern char* g_arena;
extern size_t g_static_by_kernel[kMaxKernels];  // static shared bytes each kernel declared
extern Fiber g_fibers[kMaxThreads];
extern Warp g_warps[kMaxThreads / 32];
// __syncwarp bookkeeping for the race check: every completed __syncwarp gets an id, and
// g_common[w][a][b] is the latest id in which lanes a and b of warp w took part together.
extern uint32_t g_sync_id;
extern uint32_t g_common[kMaxThreads / 32][32][32];
extern uint32_t g_block_first_epoch, g_launch_first_epoch;  // epochs: newer = this block/launch
extern Shadow* g_gshadow[kMaxArgs];  // per argument buffer, fresh each launch (race check)
// Unique bytes (counted mode): one bit per byte of each argument buffer, for what the launch
// read and what it wrote (an atomic sets both); popcounted when the launch ends.
extern uint64_t* g_touched_read[kMaxArgs];
extern uint64_t* g_touched_write[kMaxArgs];
extern size_t g_stack_size;        // usable bytes per fiber stack
extern int g_nstacks;
extern void* g_sched_sp;
extern Fiber* volatile g_cur;      // the running fiber, or null in the scheduler
extern int g_cur_tid;
extern int g_nthreads;
extern void (*g_launcher)(void**);
extern void** g_args;
extern Config g_cfg;
extern Counters g_cnt;
extern Fault g_fault;
extern volatile sig_atomic_t g_failed, g_in_launch, g_interrupted;
extern sigjmp_buf g_jmp;
extern const Buf* g_bufs;
extern int g_nbuf;
extern uintptr_t g_sh_lo, g_dyn_lo;  // static arena (g_sh_size bytes in use), dynamic buffer
extern size_t g_sh_size, g_dyn_size, g_dyn_cap;
extern Shadow* g_shadow;
extern size_t g_shadow_cap;
extern uint32_t g_bepoch;          // barrier epoch: +1 per block and per released barrier
extern int g_reduce_result;
extern int g_n_exited, g_n_waiting;  // threads of the block that exited / wait at a barrier
extern uintptr_t g_mod_lo[16], g_mod_hi[16];
extern int g_nmod;
extern struct timespec g_t0;

// ---- switching between the scheduler and a fiber (scheduler.cpp) ---------------------------
#if defined(__x86_64__)
extern "C" void emu_switch(void** save_sp, void* new_sp);  // scheduler.cpp
inline void switch_to_fiber(Fiber& f) { emu_switch(&g_sched_sp, f.sp); }
inline void switch_to_scheduler() { emu_switch(&g_cur->sp, g_sched_sp); }
#else
#include <ucontext.h>
extern ucontext_t g_sched_ctx, g_ctx[kMaxThreads];
inline void switch_to_fiber(Fiber& f) { swapcontext(&g_sched_ctx, &g_ctx[&f - g_fibers]); }
inline void switch_to_scheduler() { swapcontext(&g_ctx[g_cur_tid], &g_sched_ctx); }
#endif

// ---- what one file gives another ------------------------------------------------------------
// launch.cpp
uint64_t pc_offset(void* pc);
void set_fault(int kind, void* pc, const char* file, int line, const char* fmt, ...);
[[noreturn]] void abort_fiber();
void describe_thread(char* out, size_t n, int t);
// scheduler.cpp
bool ensure_stacks(int n, size_t stack_size);
bool run_block();
// memory.cpp
void find_module_ranges();
void describe_address(char* out, size_t n, uintptr_t a, size_t size);
bool alloc_touched(int nbuf);  // the unique-byte bitmaps of this launch's buffers
void count_touched(Counters& out);  // popcount them into out, then free them

#pragma GCC visibility pop
