// trace.cpp: the access trace (ckptlab.emu.trace()): one event per access of a thread to a
// kernel argument, naming the argument, the bytes, the block, the thread and whether it read,
// wrote or did an atomic. Counted mode only: the events are recorded by arg_access
// (memory.cpp), the full path every access of a traced argument takes.
//
// The events go to an array Python owns (Config.trace, trace_cap events of 16 bytes). Workers
// claim slots with one atomic counter, so events of blocks on different workers interleave
// (each names its block and thread: the order is not the information). Past trace_cap the
// counter goes on, and nothing more is stored: emu_trace_events(), the accesses the launch
// made, says by how much the trace was cut short. The kernel itself runs on unchanged.
#include "runtime.h"

static TraceEvent* g_trace;           // null: the trace is off
static uint64_t g_trace_cap;
static uint64_t g_trace_next;         // events claimed (atomic: workers share it)
static uint64_t g_trace_total;        // the last launch's, for emu_trace_events()
constexpr size_t kMaxPiece = size_t(1) << (EMU_TRACE_SIZE_BITS - 1);  // bytes per event
static_assert(sizeof(TraceEvent) == 16, "abi.h: a trace event is 16 bytes");
static_assert(EMU_ACCESS_READ == 0 && EMU_ACCESS_WRITE == 1 && EMU_ACCESS_ATOMIC == 2,
              "the hooks' kind (0 read, 1 write, 2 atomic) is abi.h's EmuAccessKind");

bool trace_start() {
    g_trace = reinterpret_cast<TraceEvent*>(g_cfg.trace);
    g_trace_cap = g_trace ? g_cfg.trace_cap : 0;
    g_trace_next = 0;
    if (g_trace && !g_cfg.counted) return false;  // the plain build has no hooks to record from
    for (int i = 0; i < g_nargs; ++i) {
        g_args[i].traced = g_trace != nullptr;
        g_args[i].full_path = g_args[i].traced || g_args[i].shadow;
    }
    return true;
}

// n bytes at offset off of argument b (in bounds: arg_access checked them first).
void trace_access(const Worker* w, const Fiber* f, const ArgBuf* b, uint64_t off, size_t n,
                  int kind) {
    const uint64_t pieces = (n + kMaxPiece - 1) / kMaxPiece;
    uint64_t i = __atomic_fetch_add(&g_trace_next, pieces, __ATOMIC_RELAXED);
    for (; n && i < g_trace_cap; ++i) {
        const size_t size = n < kMaxPiece ? n : kMaxPiece;
        g_trace[i] = TraceEvent{off << EMU_TRACE_SIZE_BITS | size,
                                static_cast<uint32_t>(w->block_linear), f->tid,
                                static_cast<uint8_t>(b->counter), static_cast<uint8_t>(kind)};
        off += size, n -= size;
    }
}

void trace_finish() {
    g_trace_total = g_trace ? g_trace_next : 0;
    g_trace = nullptr, g_trace_cap = 0;
    for (int i = 0; i < g_nargs; ++i) g_args[i].traced = g_args[i].full_path = false;
}

// The accesses the last launch made to traced arguments, recorded or not (more than its
// Config.trace_cap: the trace was cut short). A getter, as emu_fault() is, rather than a field
// of EmuCounters: each worker holds a Counters, and a field there would move the worker's
// other fields, which the hot paths reach, for a number only the launch needs.
EMU_API uint64_t emu_trace_events() { return g_trace_total; }
