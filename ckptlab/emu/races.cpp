// races.cpp: the race check. A shadow entry per 4 bytes holds the last writer and the readers
// of the current barrier epoch, and which bytes of the granule they touched. An epoch is
// (identity << 24 | the block's barrier count): the identity says which block (global memory:
// its linear index + 1, in a shadow fresh each launch; shared memory: the worker's block count,
// so entries of the worker's earlier blocks are stale). A conflict (write against anything,
// read against a write, atomic against plain):
//   shared memory  another thread of the block in the same epoch, unless both lanes of one
//                  warp took part in a __syncwarp since the earlier access (or since a read
//                  that a __syncwarp orders after it: readers so ordered are folded into the
//                  latest one);
//   global memory  the same, or any other block of this launch: blocks run in no promised
//                  order (or at once) on a GPU, so only atomics may touch what another writes.
// Workers share the global shadows: an access locks its stripe of the argument first.
#include "runtime.h"

static bool ordered(Worker* w, int t, int other_tid, uint16_t other_sync) {
    return other_tid == t || (other_tid / 32 == t / 32 &&
                              synced_after(w->common[t / 32][t % 32][other_tid % 32], other_sync));
}

static bool readers_ordered(Worker* w, int t, const Shadow& s) {
    if (s.r_warp == kManyWarps) return false;  // a reader in another warp, no barrier since
    if (s.r_warp != t / 32) return false;
    for (int lane = 0; lane < 32; ++lane)  // every reader lane synced with us since its read
        if (((s.r_lanes >> lane) & 1u) && lane != t % 32 &&
            !synced_after(w->common[t / 32][t % 32][lane], s.r_sync))
            return false;
    return true;
}

// kind: 0 read, 1 write, 2 atomic. True (and w->conflict filled) on a conflict; the caller
// reports it once it holds no lock.
template <bool global>
__attribute__((always_inline)) static inline bool check(Worker* w, int t, Shadow* shadow,
                                                        size_t off, size_t size, int kind) {
    const uint64_t identity = global ? w->block_linear + 1 : w->block_seq;
    Conflict* out = &w->conflict;
    const uint64_t epoch = (identity << kEpochBits) | w->bepoch;
    const uint16_t other = static_cast<uint16_t>(identity) ? static_cast<uint16_t>(identity) : 1;
    const uint16_t sync = static_cast<uint16_t>(sync_id(w));
    const bool write = kind != 0, atomic = kind == 2;
    for (size_t g = off / 4; g <= (off + size - 1) / 4; ++g) {
        const size_t lo = g * 4 > off ? g * 4 : off;
        const size_t hi = g * 4 + 4 < off + size ? g * 4 + 4 : off + size;
        const uint8_t m = static_cast<uint8_t>(((1u << (hi - lo)) - 1) << (lo - g * 4));
        Shadow& s = shadow[g];
        const uint64_t w_id = s.w_epoch >> kEpochBits, r_id = s.r_epoch >> kEpochBits;
        if (w_id && (s.w_bytes() & m) && !(atomic && s.w_atomic())) {
            const char* theirs = s.w_atomic() ? "updated atomically" : "wrote";
            if (w_id != identity) {  // another block's (global) or stale (shared)
                if (global) return *out = {theirs, lo, -1, true}, true;
            } else if (s.w_epoch == epoch && !ordered(w, t, s.w_thread(), s.w_sync)) {
                return *out = {theirs, lo, s.w_thread(), false}, true;
            }
        }
        if (write && r_id && (s.r_bytes() & m)) {
            if (r_id != identity) {
                if (global) return *out = {"read", lo, -1, true}, true;
            } else if (s.r_epoch == epoch && !readers_ordered(w, t, s)) {
                const bool one = s.r_warp == t / 32 && __builtin_popcount(s.r_lanes) == 1;
                return *out = {"read", lo, one ? t - t % 32 + __builtin_ctz(s.r_lanes) : -1,
                               false}, true;
            }
        }
        if (write && global && s.r_other && s.r_other != other)
            return *out = {"read", lo, -1, true}, true;
        if (write) {
            const uint16_t me = static_cast<uint16_t>(t | (atomic ? 0x8000 : 0));
            if (s.w_epoch == epoch && s.w_thread() == t) s.bytes |= m;
            else s.w_epoch = epoch, s.bytes = static_cast<uint8_t>((s.bytes & 0xF0) | m);
            s.w_tid = me;
            s.w_sync = sync;
        } else if (s.r_epoch != epoch) {
            if (global && r_id && r_id != identity)
                s.r_other = static_cast<uint16_t>(r_id) ? static_cast<uint16_t>(r_id) : 1;
            s.r_epoch = epoch, s.r_warp = static_cast<uint16_t>(t / 32);
            s.r_lanes = 1u << (t % 32), s.r_sync = sync;
            s.bytes = static_cast<uint8_t>((s.bytes & 0x0F) | (m << 4));
        } else if (s.r_warp == t / 32 && s.r_sync != sync && readers_ordered(w, t, s)) {
            // every earlier reader's read is ordered before this one by a __syncwarp: this read
            // stands for theirs (an access ordered after it is ordered after them: the ordering
            // is transitive). Remembering them with this read's __syncwarp id would call a later
            // write by this lane racing with them. Their bytes stay (a later access to a byte
            // only they read is then checked against this reader: stricter, never looser).
            s.r_lanes = 1u << (t % 32);
            s.r_sync = sync;
            s.bytes |= static_cast<uint8_t>(m << 4);
        } else {
            if (s.r_warp != t / 32) s.r_warp = kManyWarps;
            s.r_lanes |= 1u << (t % 32);
            s.r_sync = sync;
            s.bytes |= static_cast<uint8_t>(m << 4);
        }
    }
    return false;
}
bool race_check_shared(Worker* w, int tid, Shadow* shadow, size_t off, size_t size, int kind) {
    return check<false>(w, tid, shadow, off, size, kind);
}
bool race_check_global(Worker* w, int tid, Shadow* shadow, size_t off, size_t size, int kind) {
    return check<true>(w, tid, shadow, off, size, kind);
}

[[noreturn]] void report_race(Fiber* f, const Conflict& c, int kind, int param, void* pc) {
    char where[64], who[64] = "another thread";
    if (param >= 0) snprintf(where, sizeof where, "byte +%zu of argument {arg%d}", c.byte, param);
    else snprintf(where, sizeof where, "shared byte +%zu", c.byte);
    if (c.other_block) {
        snprintf(who, sizeof who, "another block");
    } else if (c.other_tid >= 0) {
        strcpy(who, "thread ");
        describe_thread(who + 7, sizeof who - 7, worker_of(f)->fibers[c.other_tid]);
    }
    const char* mine = kind == 2 ? "updates atomically" : (kind ? "writes" : "reads");
    set_fault(worker_of(f), F_RACE, pc, nullptr, 0,
              "%s-memory race: this thread %s %s, which %s %s earlier %s",
              param >= 0 ? "global" : "shared", mine, where, who, c.theirs,
              c.other_block ? "in this launch (blocks run in no fixed order on a GPU: use "
                              "atomics, or give each element one writer)"
                            : "with no __syncthreads in between");
    abort_fiber(f);
}

// ---- stripes: workers check global memory one stripe of 256 bytes at a time ------------------
constexpr int kStripes = 4096;
static volatile int g_stripe[kStripes];

static int stripe_of(int arg, size_t off) {
    return static_cast<int>(((off >> 8) * 0x9E3779B1u + static_cast<size_t>(arg) * 977u) %
                            kStripes);
}
static void lock1(int s) {
    while (__atomic_exchange_n(&g_stripe[s], 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&g_stripe[s], __ATOMIC_RELAXED)) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
}
static void unlock1(int s) { __atomic_store_n(&g_stripe[s], 0, __ATOMIC_RELEASE); }

// Locks are reset when a launch starts: a worker abandoned mid-check cannot leave one held.
void reset_stripes() { memset(const_cast<int*>(g_stripe), 0, sizeof g_stripe); }

void lock_stripe(int arg, size_t off, size_t size) {
    int a = stripe_of(arg, off), b = stripe_of(arg, off + size - 1);
    if (a == b) return lock1(a);
    if (a > b) std::swap(a, b);  // in order: no deadlock between two workers
    lock1(a);
    lock1(b);
}
void unlock_stripe(int arg, size_t off, size_t size) {
    const int a = stripe_of(arg, off), b = stripe_of(arg, off + size - 1);
    unlock1(a);
    if (b != a) unlock1(b);
}
