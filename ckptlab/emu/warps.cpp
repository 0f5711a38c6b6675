// warps.cpp: the warp operations (shuffles, votes, __syncwarp) and the traps (__trap,
// assert, abort) a kernel thread calls. A warp operation completes when every lane of its mask
// has arrived; a lane that exited or is missing, or lanes at different operations, are errors.
#include "runtime.h"

void warp_pending_check(Fiber* f) {
    // Thread f is about to exit. Lanes of its warp waiting for it would wait forever.
    const int t = f->tid;
    Warp& wp = worker_of(f)->warps[t / 32];
    unsigned bit = 1u << (t % 32);
    if (wp.active && (wp.mask & bit) && !(wp.arrived & bit)) {
        set_fault(worker_of(f), F_WARP, nullptr, wp.file, wp.line,
                  "lane %d exits while other lanes of its warp wait for it at a warp operation "
                  "at %s:%d (mask 0x%08x includes it)",
                  t % 32, wp.file, wp.line, wp.mask);
        abort_fiber(f);
    }
}

static const char* op_name(int op) {
    static const char* names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                  "__shfl_xor_sync", "__ballot_sync", "__any_sync",
                                  "__all_sync", "__syncwarp", "an nvcuda::wmma call"};
    return op >= 0 && op <= EMU_WMMA ? names[op] : "warp op";
}

static bool is_shuffle(int op) { return op <= EMU_SHFL_XOR; }

static void complete_warp(Fiber* f, Warp& wp, int base, const char* file, int line) {
    unsigned long long ballot = 0;
    for (int j = 0; j < 32; ++j)
        if ((wp.mask >> j) & 1u) ballot |= static_cast<unsigned long long>(wp.val[j] != 0) << j;
    const bool shuffle = is_shuffle(wp.op);
    Fiber* fibers = worker_of(f)->fibers;
    for (int j = 0; j < 32; ++j) {
        if (!((wp.mask >> j) & 1u)) continue;
        int src = j;
        if (shuffle) {
            const int width = wp.width[j];
            if (width < 1 || width > 32 || (width & (width - 1))) {
                set_fault(worker_of(f), F_WARP, nullptr, file, line,
                          "%s: width %d is not a power of two in [1, 32]", op_name(wp.op), width);
                abort_fiber(f);
            }
            // width is a power of two: j - j % width, and arg modulo width in [0, width)
            const int seg = j & ~(width - 1), arg = wp.arg[j];
            switch (wp.op) {
                case EMU_SHFL_IDX: src = seg + (arg & (width - 1)); break;
                case EMU_SHFL_UP: src = j - arg >= seg ? j - arg : j; break;
                case EMU_SHFL_DOWN: src = j + arg < seg + width ? j + arg : j; break;
                case EMU_SHFL_XOR: src = (j ^ arg) < seg + width ? (j ^ arg) : j; break;
                default: break;
            }
            if (src < 0 || src > 31 || !((wp.mask >> src) & 1u)) {
                set_fault(worker_of(f), F_WARP, nullptr, file, line,
                          "%s: lane %d reads lane %d, which is not in the mask 0x%08x "
                          "(undefined on a GPU)",
                          op_name(wp.op), j, src, wp.mask);
                abort_fiber(f);
            }
            wp.result[j] = wp.val[src];
        } else if (wp.op == EMU_BALLOT) {
            wp.result[j] = ballot;
        } else if (wp.op == EMU_ANY) {
            wp.result[j] = ballot != 0;
        } else if (wp.op == EMU_ALL) {
            wp.result[j] = ballot == wp.mask;
        } else if (wp.op == EMU_WMMA) {
            wp.result[j] = wp.val[0];
        }
        if (j + base != f->tid) fibers[base + j].state = READY;
    }
}

static unsigned long long warp_op(int op, unsigned mask, unsigned long long bits, int arg,
                                  int width, const char* file, int line) {
    Fiber* f = self_fiber();
    Worker* w = worker_of(f);
    if (g_stop) stop_here(f, nullptr, file, line);
    const int t = f->tid, lane = t % 32, base = t - lane;
    Warp& wp = w->warps[t / 32];
    if (!((mask >> lane) & 1u)) {
        set_fault(w, F_WARP, nullptr, file, line,
                  "%s called by lane %d with mask 0x%08x, which does not include the lane",
                  op_name(op), lane, mask);
        abort_fiber(f);
    }
    // The lanes of the mask are checked when the first of them arrives: a later lane with the
    // same mask would find nothing new (a lane that exits in between is stopped by
    // warp_pending_check), and one with another mask is checked as the first was.
    const bool check = !wp.active || wp.mask != mask;
    for (int j = 0; j < 32 && check; ++j) {
        if (!((mask >> j) & 1u)) continue;
        if (base + j >= g_nthreads) {
            set_fault(w, F_WARP, nullptr, file, line,
                      "%s mask 0x%08x names lane %d, which does not exist (the block has %d "
                      "threads): use a mask of the lanes that exist",
                      op_name(op), mask, j, g_nthreads);
            abort_fiber(f);
        }
        if (w->fibers[base + j].state == EXITED) {
            set_fault(w, F_WARP, nullptr, file, line,
                      "%s mask 0x%08x names lane %d, which has already exited", op_name(op),
                      mask, j);
            abort_fiber(f);
        }
    }
    if (!wp.active) {
        wp.active = true, wp.op = op, wp.mask = mask, wp.arrived = 0, wp.file = file;
        wp.line = line;
    } else if (wp.op != op || wp.mask != mask || (op != EMU_SYNCWARP && wp.line != line)) {
        set_fault(w, F_WARP, nullptr, file, line,
                  "lanes of one warp reached different warp operations: %s (mask 0x%08x) at "
                  "%s:%d and %s (mask 0x%08x) at %s:%d",
                  op_name(wp.op), wp.mask, wp.file, wp.line, op_name(op), mask, file, line);
        abort_fiber(f);
    }
    wp.val[lane] = bits, wp.arg[lane] = arg, wp.width[lane] = width;
    wp.arrived |= 1u << lane;
    if (wp.arrived == wp.mask) {
        complete_warp(f, wp, base, file, line);
        wp.active = false;
        // Only __syncwarp orders the lanes' memory accesses (CUDA documents no ordering for
        // shuffles or votes), and only among the lanes of its mask.
        if (op == EMU_SYNCWARP) {
            const uint32_t id = ++sync_id(w);
            const bool races = g_cfg.race_check && g_cfg.counted;  // common's one reader
            for (int a = 0; a < 32 && races; ++a)
                if ((mask >> a) & 1u)
                    for (int b = 0; b < 32; ++b)
                        if ((mask >> b) & 1u) w->common[t / 32][a][b] = id;
        }
        return wp.result[lane];
    }
    f->state = AT_WARP, f->file = file, f->line = line;
    yield_fiber(f);
    return wp.result[lane];
}

extern "C" unsigned long long emu_warp_exchange(int op, unsigned mask, unsigned long long bits,
                                                int arg, int width, const char* file, int line) {
    return warp_op(op, mask, bits, arg, width, file, line);
}
extern "C" void emu_syncwarp(const char* file, int line, unsigned mask) {
    warp_op(EMU_SYNCWARP, mask, 0, 0, 32, file, line);
}
extern "C" unsigned emu_activemask(void) {
    const Fiber* f = self();
    unsigned m = 0;
    const int base = f->tid - f->tid % 32;
    for (int j = 0; j < 32 && base + j < g_nthreads; ++j)
        if (worker_of(f)->fibers[base + j].state != EXITED) m |= 1u << j;
    return m;
}
// A warp-collective library call (wmma::*, emu/include/mma.h) misused by the warp: a lane's
// arguments differ from the others', or a tile is misaligned. The caller found it; this
// reports it as a warp fault at the kernel's line and ends the launch.
extern "C" [[noreturn]] void emu_warp_fault(const char* file, int line, const char* message) {
    Fiber* f = self();
    set_fault(worker_of(f), F_WARP, nullptr, file, line, "%s", message);
    abort_fiber(f);
}
extern "C" void emu_trap(const char* what, const char* file, int line) {
    Fiber* f = self();
    set_fault(worker_of(f), F_TRAP, __builtin_return_address(0), file, line, "%s executed", what);
    abort_fiber(f);
}
extern "C" void emu_kernel_abort(const char* file, int line) {
    Fiber* f = self();
    if (!f) ::abort();  // not a kernel thread: glibc's
    set_fault(worker_of(f), F_TRAP, nullptr, file, line, "abort() called");
    abort_fiber(f);
}
// assert() in a kernel lands here (the module binds its own definition first).
extern "C" __attribute__((noreturn)) void __assert_fail(const char* expr, const char* file,
                                                        unsigned line, const char*) noexcept {
    Fiber* f = self();
    if (!f) ::abort();
    set_fault(worker_of(f), F_TRAP, __builtin_return_address(0), file, static_cast<int>(line),
              "assertion failed: %s", expr);
    abort_fiber(f);
}
