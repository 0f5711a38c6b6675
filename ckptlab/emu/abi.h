// abi.h: what the emulator's C++ runtime and its Python side (ckptlab/emu/abi.py) share, in
// one place: fault codes, warp-operation codes, the GPU limits the emulator enforces, and the
// structures passed through ctypes. Python reads the constants from this file
// (ckptlab.cdefs) and checks its ctypes structures against emu_abi_layout(), so the two sides
// cannot drift apart silently. Change a structure here: bump EMU_ABI_VERSION.
#pragma once
#include <stdint.h>

#define EMU_ABI_VERSION 8

// ---- limits of a CUDA launch (CUDA C++ Programming Guide, "Compute Capabilities" table) ----
#define EMU_MAX_BLOCK_THREADS 1024   // threads per block
#define EMU_MAX_BLOCK_X 1024
#define EMU_MAX_BLOCK_Y 1024
#define EMU_MAX_BLOCK_Z 64
#define EMU_MAX_GRID_X 2147483647    // 2^31 - 1
#define EMU_MAX_GRID_Y 65535
#define EMU_MAX_GRID_Z 65535
// Shared memory per block: 48 KiB static (ptxas refuses more) and static + dynamic within
// 48 KiB unless the kernel opts in (cudaFuncAttributeMaxDynamicSharedMemorySize); then up to
// 227 KiB on sm_90 (H100/H200; 163 KiB on sm_80).
#define EMU_SHARED_STATIC_LIMIT (48 * 1024)
#define EMU_SHARED_OPTIN_LIMIT (227 * 1024)
// Kernel arguments the emulator tracks: pointer parameters per kernel.
#define EMU_MAX_ARGS 64
// OS threads running the blocks of one launch (ckptlab.emu.settings(workers=...)). Config.workers
// < 0: automatic, up to -workers, and one (the calling thread) for a launch of fewer threads
// than EMU_AUTO_MIN_THREADS (waking workers costs ~50-100 us; 4096 threads take longer).
#define EMU_MAX_WORKERS 256
#define EMU_AUTO_MIN_THREADS 4096
// Bytes of race-check shadow per 4 bytes of memory checked (runtime.h: struct Shadow).
#define EMU_SHADOW_BYTES 32

// ---- fault kinds: emu_launch's return code and Fault.kind -----------------------------------
enum EmuFaultKind {
    EMU_F_NONE = 0,
    EMU_F_BARRIER = 1,    // __syncthreads misuse (divergent, some threads exited)
    EMU_F_WARP = 2,       // warp operation misuse (missing or exited lane, mixed operations)
    EMU_F_ACCESS = 3,     // out-of-bounds or otherwise invalid memory access
    EMU_F_RACE = 4,       // shared- or global-memory race
    EMU_F_STACK = 5,      // fiber stack overflow
    EMU_F_SIGNAL = 6,     // SIGSEGV, SIGBUS, SIGFPE, SIGILL outside a known cause
    EMU_F_WATCHDOG = 7,   // the launch ran longer than watchdog_s
    EMU_F_INTERRUPT = 8,  // Ctrl-C
    EMU_F_TRAP = 9,       // __trap(), assert()
    EMU_F_CONFIG = 10     // a launch the emulator refuses (block size, shared memory, ...)
};

// ---- warp operations: the op argument of emu_warp_exchange ----------------------------------
enum EmuWarpOp {
    EMU_SHFL_IDX = 0,
    EMU_SHFL_UP = 1,
    EMU_SHFL_DOWN = 2,
    EMU_SHFL_XOR = 3,
    EMU_BALLOT = 4,
    EMU_ANY = 5,
    EMU_ALL = 6,
    EMU_SYNCWARP = 7,
    EMU_WMMA = 8          // an nvcuda::wmma call's exchange (emu/include/mma.h): lane 0's bits
};

// ---- the access trace (ckptlab.emu.trace()): one event per access to a kernel argument -------
enum EmuAccessKind {
    EMU_ACCESS_READ = 0,
    EMU_ACCESS_WRITE = 1,
    EMU_ACCESS_ATOMIC = 2  // reads and writes its bytes
};
// EmuTraceEvent.where = (byte offset into the argument) << EMU_TRACE_SIZE_BITS | bytes accessed.
// An access of 2^(EMU_TRACE_SIZE_BITS - 1) bytes or more (only a copy of a large object makes
// one) is recorded as several events of at most that many bytes.
#define EMU_TRACE_SIZE_BITS 16

// ---- structures passed between Python (ctypes) and emu_launch -------------------------------
// (named Emu*: shim.h includes this file into every kernel, whose own names must stay free)
struct EmuBuf {                // one pointer argument
    uint64_t lo, size;
    int32_t arg;              // its counters' index: 0 .. EMU_MAX_ARGS - 1, in parameter order
    int32_t param;            // its parameter index (messages name it "{argN}")
    int32_t readonly;         // 1 for a const parameter: a write through it is an error
    int32_t pad;
};
struct EmuConfig {
    int32_t counted, race_check, stack_kib, shuffle_blocks;
    double watchdog_s;
    uint64_t seed;            // of the block order when shuffle_blocks
    int32_t kernel;           // which kernel of the module (its static shared memory)
    int32_t shared_opt_in;    // 1 if max_dynamic_shared_size_bytes was raised above 48 KiB
    int32_t workers;          // OS threads running blocks (1 = one after another; < 0: auto)
    int32_t pad;
    uint64_t fiber_region;    // the process's EmuFiberRegion (Python owns it)
    uint64_t trace;           // an array of trace_cap EmuTraceEvents (Python owns it), or 0: off
    uint64_t trace_cap;
};
// The fibers' stacks: one region for the whole process, used by every module's launches in
// turn (launches run one at a time), not one per module: each stack's guard splits the region
// into two mappings, and a process may hold only vm.max_map_count (65530) of them.
struct EmuFiberRegion {
    uint64_t base, span;      // slot s at base + (s << shift): kMaxThreads slots per worker
    uint64_t stack_size;      // usable bytes per stack
    int32_t shift, workers;   // slots' size, workers with slots
    int32_t mapped[EMU_MAX_WORKERS];  // stacks made usable, per worker
};
struct EmuCounters {
    uint64_t read[EMU_MAX_ARGS], write[EMU_MAX_ARGS];
    uint64_t atomic_ops[EMU_MAX_ARGS], atomic_bytes[EMU_MAX_ARGS];
    // distinct bytes the launch read / wrote per argument (an atomic counts as both)
    uint64_t unique_read[EMU_MAX_ARGS], unique_write[EMU_MAX_ARGS];
    uint64_t shared_read, shared_write, shared_atomics, threads, blocks;
    uint64_t workers;         // OS threads that ran the blocks
};
struct EmuTraceEvent {        // one access of one thread to one kernel argument: 16 bytes
    uint64_t where;           // offset << EMU_TRACE_SIZE_BITS | size, in bytes
    uint32_t block;           // linear block index: blockIdx.x fastest, then y, then z
    uint16_t thread;          // linear thread index in its block: threadIdx.x fastest
    uint8_t arg;              // EmuBuf.arg of the argument
    uint8_t kind;             // EmuAccessKind
};
struct EmuFault {
    int32_t kind, has_thread;
    uint32_t block[3], thread[3];
    uint64_t pc;  // offset of the faulting instruction in this module (for addr2line), or 0
    int32_t line, pad;
    char file[256];
    char message[2048];
};
