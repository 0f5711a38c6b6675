// objects.cpp: the objects a kernel's memory is made of, each with its own bounds, so that an
// access is checked against the object its address belongs to and an index that runs off one
// object is reported against it, never counted against a neighbour.
//
//   arguments     (counted mode) staged copies: each region (overlapping arguments merged)
//                 in a slot of its own with margins wider than any argument; copied back after
//                 the launch, const ones excepted (a write through them is an error)
//   shared        each worker's arena: a 1 MiB slot per __shared__ declaration, data in the
//                 middle; slot 0 holds the dynamic buffer (extern __shared__)
//   __device__    variables the loader moved into objects of their own, between PROT_NONE pages
//   device heap   malloc/free in kernels: blocks with redzones, in a registry (double free and
//                 use after free are errors)
#include "runtime.h"

#include <sys/mman.h>

#include <map>

static size_t page_up(size_t n) { return (n + 4095) & ~size_t(4095); }

// ---- kernel arguments -------------------------------------------------------------------------
// The staging reservation: kMaxArgs slots of 2^g_staging_shift bytes, region r's pages mapped
// for g_mapped_bytes[r] bytes from the middle of slot r.
static uintptr_t g_staging;
static int g_staging_shift;
static uint64_t g_mapped_bytes[kMaxArgs];

// Slots for n regions of 2^shift bytes (0, 0: give everything back).
static bool reserve_staging(int n, int shift) {
    if (g_staging && n && shift == g_staging_shift) return true;
    if (g_staging) munmap(reinterpret_cast<void*>(g_staging), uint64_t(kMaxArgs) << g_staging_shift);
    g_staging = 0, g_staging_shift = 0;
    for (int r = 0; r < kMaxArgs; ++r) g_mapped_bytes[r] = 0;
    if (!n) return true;
    void* m = mmap(nullptr, uint64_t(kMaxArgs) << shift, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    g_staging = reinterpret_cast<uintptr_t>(m), g_staging_shift = shift;
    return true;
}

bool stage_args(const Buf* bufs, int nbuf, void** args) {
    g_nargs = nbuf, g_nregions = 0, g_arg_span = 0, g_arg_base = 0;
    int order[kMaxArgs];
    for (int i = 0; i < nbuf; ++i) order[i] = i;
    for (int i = 1; i < nbuf; ++i)  // by address (insertion sort: at most 64)
        for (int j = i; j > 0 && bufs[order[j]].lo < bufs[order[j - 1]].lo; --j)
            std::swap(order[j], order[j - 1]);
    uint64_t biggest = 0;
    for (int i = 0; i < nbuf; ++i) {
        const Buf& b = bufs[order[i]];
        g_args[i] = ArgBuf{b.lo, b.lo, b.size, b.arg, b.param, b.readonly != 0, false, false,
                           nullptr, nullptr, nullptr};
        Region* r = g_nregions ? &g_regions[g_nregions - 1] : nullptr;
        if (r && b.size && r->size && b.lo < r->orig + r->size) {  // overlaps: one region
            r->size = b.lo + b.size - r->orig > r->size ? b.lo + b.size - r->orig : r->size;
            ++r->n;
            r->writable |= !b.readonly;
        } else {
            g_regions[g_nregions++] = Region{0, b.lo, b.size, i, 1, !b.readonly};
        }
        biggest = g_regions[g_nregions - 1].size > biggest ? g_regions[g_nregions - 1].size
                                                           : biggest;
    }
    if (!g_cfg.counted || !nbuf) return true;  // fast mode: the caller's memory, unchecked
    // Slots of 2^shift bytes, data in the middle: margins of at least twice the biggest region.
    int shift = 24;
    while ((uint64_t(1) << shift) < 4 * biggest + (uint64_t(1) << 22)) ++shift;
    if (!reserve_staging(g_nregions, shift)) return false;
    for (int r = 0; r < g_nregions; ++r) {
        Region& R = g_regions[r];
        R.lo = g_staging + (uint64_t(r) << shift) + (uint64_t(1) << (shift - 1));
        if (R.size > g_mapped_bytes[r]) {  // pages for it (kept for the next launches)
            void* d = mmap(reinterpret_cast<void*>(R.lo), page_up(R.size), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (d == MAP_FAILED) return false;
            g_mapped_bytes[r] = page_up(R.size);
        }
        if (R.size) memcpy(reinterpret_cast<void*>(R.lo), reinterpret_cast<void*>(R.orig), R.size);
        for (int i = R.first; i < R.first + R.n; ++i) {
            g_args[i].lo = R.lo + (g_args[i].orig - R.orig);
            *static_cast<uintptr_t*>(args[g_args[i].param]) = g_args[i].lo;  // the kernel's pointer
        }
    }
    g_arg_base = g_staging, g_arg_shift = shift, g_arg_span = uint64_t(g_nregions) << shift;
    return true;
}

// Results back into the caller's arrays (after a fault too: a GPU keeps partial writes). The
// staging stays mapped for the next launch (mmap/munmap per launch cost more than the copies,
// with workers' TLBs to shoot down), unless it holds more than 256 MiB.
void unstage_args() {
    if (g_arg_span) {
        for (int r = 0; r < g_nregions; ++r)
            if (g_regions[r].writable && g_regions[r].size)
                memcpy(reinterpret_cast<void*>(g_regions[r].orig),
                       reinterpret_cast<void*>(g_regions[r].lo), g_regions[r].size);
        uint64_t held = 0;
        for (int r = 0; r < kMaxArgs; ++r) held += g_mapped_bytes[r];
        if (held > (uint64_t(256) << 20)) reserve_staging(0, 0);
    }
    g_arg_base = 0, g_arg_span = 0, g_nregions = 0;
}

// ---- shared memory ----------------------------------------------------------------------------
// The race check's shadows of shared memory: worker k's at g_shadow_base + (k << (g_wshift + 2))
// (kShMaxObj / 4 entries per slot: 640 MiB of address space each, touched where used).
static int g_shadow_workers, g_shadow_wshift;

bool ensure_shadows(int n) {
    static_assert(size_t(kMaxShared + 1) * (kShMaxObj / 4) * sizeof(Shadow) <= size_t(1) << 30,
                  "a worker's shadow fits its stride (g_wshift >= 28)");
    if (n > g_shadow_workers || g_wshift != g_shadow_wshift) {
        if (g_shadow_base)
            munmap(reinterpret_cast<void*>(g_shadow_base),
                   size_t(g_shadow_workers) << (g_shadow_wshift + 2));
        void* m = mmap(nullptr, size_t(n) << (g_wshift + 2), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        g_shadow_base = m == MAP_FAILED ? 0 : reinterpret_cast<uintptr_t>(m);
        g_shadow_workers = m == MAP_FAILED ? 0 : n;
        g_shadow_wshift = g_wshift;
        if (m == MAP_FAILED) return false;
    }
    for (int k = 0; k < n; ++k)
        g_workers[k]->shadow = reinterpret_cast<Shadow*>(g_shadow_base +
                                                         (uint64_t(k) << (g_wshift + 2)));
    return true;
}

static char* slot_data(const Worker* w, int slot) {
    return w->arena + (size_t(slot) << kShShift) + emu_slot_start(size_t(slot));
}

// Shared memory is poisoned (0xFF bytes read as NaN) before each block: the dynamic buffer
// and every declaration the module has run so far (emu_shared_declare poisons a new one).
void poison_shared(Worker* w) {
    const int n = __atomic_load_n(&g_nshdecl, __ATOMIC_ACQUIRE);
    for (int slot = 0; slot <= n && slot <= kMaxShared; ++slot)
        if (const uint64_t size = __atomic_load_n(&g_slot_size[slot], __ATOMIC_ACQUIRE))
            memset(slot_data(w, slot), 0xFF, size);
}

// The first execution of a declaration (per instantiation: it initialises a function's static)
// takes its id, counts its bytes for the kernel running (a device function's __shared__ counts
// for the first kernel that runs it) and poisons its slot in every worker's arena. It never
// stops the thread (another worker may wait for the static): a GPU's limits are checked at the
// next block and when the launch ends (shared_over_limit).
extern "C" int emu_shared_declare(size_t size, size_t align, const char* name) {
    (void)align;  // the middle of a 1 MiB slot is aligned to 512 KiB
    const int id = __atomic_fetch_add(&g_nshdecl, 1, __ATOMIC_ACQ_REL);
    if (id >= kMaxShared) return kMaxShared - 1;  // over: shared_over_limit says so
    size = size < kShMaxObj ? size : kShMaxObj;
    g_shdecl[id].name = name;
    for (int k = 0; k < kMaxWorkers; ++k)
        if (g_workers[k]) memset(slot_data(g_workers[k], id + 1), 0xFF, size);
    __atomic_fetch_add(&g_static_by_kernel[static_cast<size_t>(g_cfg.kernel) % kMaxKernels],
                       size, __ATOMIC_ACQ_REL);
    g_slots[id + 1] = SlotInfo{static_cast<uint32_t>(emu_slot_start(size_t(id) + 1)),
                               static_cast<uint32_t>(size)};
    __atomic_store_n(&g_slot_size[id + 1], size, __ATOMIC_RELEASE);
    return id;
}

// A GPU's limits: static shared memory of at most 48 KiB a kernel, and static + dynamic within
// 48 KiB unless the kernel opted in (then the H100's 227 KiB).
bool shared_over_limit() {
    const size_t k = static_cast<size_t>(g_cfg.kernel) % kMaxKernels;
    const uint64_t stat = __atomic_load_n(&g_static_by_kernel[k], __ATOMIC_ACQUIRE);
    const uint64_t limit = g_cfg.shared_opt_in ? EMU_SHARED_OPTIN_LIMIT : EMU_SHARED_STATIC_LIMIT;
    if (__atomic_load_n(&g_nshdecl, __ATOMIC_ACQUIRE) > kMaxShared) {
        set_fault(nullptr, F_CONFIG, nullptr, nullptr, 0,
                  "more than %d __shared__ declarations in one module", kMaxShared);
        return true;
    }
    if (stat <= EMU_SHARED_STATIC_LIMIT && stat + g_dyn_size <= limit) return false;
    set_fault(nullptr, F_CONFIG, nullptr, nullptr, 0,
              "shared memory over a GPU's limit: %zu bytes static + %zu dynamic; a kernel may "
              "have 48 KiB of static shared memory (ptxas refuses more), and static + dynamic "
              "within 48 KiB unless max_dynamic_shared_size_bytes is raised",
              size_t(stat), size_t(g_dyn_size));
    return true;
}

// ---- __device__ variables -------------------------------------------------------------------
struct DeviceObj { uintptr_t res_lo, res_hi, lo; uint64_t size; const char* name; };
static DeviceObj g_dev[256];
static int g_ndev;

extern "C" void* emu_device_object(const void* init, size_t size, size_t align,
                                   const char* name) {
    (void)align;  // page-aligned
    const size_t margin = page_up(size > (1u << 20) ? 2 * size : (1u << 20));
    const size_t total = 2 * margin + page_up(size);
    void* m = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return const_cast<void*>(init);
    char* lo = static_cast<char*>(m) + margin;
    if (size) mprotect(lo, page_up(size), PROT_READ | PROT_WRITE);
    memcpy(lo, init, size);
    if (g_ndev < 256)
        g_dev[g_ndev++] = DeviceObj{reinterpret_cast<uintptr_t>(m),
                                    reinterpret_cast<uintptr_t>(m) + total,
                                    reinterpret_cast<uintptr_t>(lo), size, name};
    return lo;
}

// ---- device malloc ----------------------------------------------------------------------------
constexpr size_t kRedzone = 64;
struct HeapBlock { uintptr_t raw; uint64_t size; };
static std::map<uintptr_t, HeapBlock>* g_heap;  // by the address malloc returned
static int g_nheap;                              // its size
static volatile int g_heap_lock;
static uintptr_t g_freed_lo[64];
static uint64_t g_freed_size[64];
static unsigned g_nfreed;

// While a worker holds the lock (and runs std::map's code), a timer tick must not abandon it.
static void heap_lock() {
    if (Fiber* f = self()) worker_of(f)->busy = worker_of(f)->busy + 1;
    while (__atomic_exchange_n(&g_heap_lock, 1, __ATOMIC_ACQUIRE)) {}
}
static bool heap_trylock() {
    if (Fiber* f = self()) worker_of(f)->busy = worker_of(f)->busy + 1;
    if (!__atomic_exchange_n(&g_heap_lock, 1, __ATOMIC_ACQUIRE)) return true;
    if (Fiber* f = self()) worker_of(f)->busy = worker_of(f)->busy - 1;
    return false;
}
static void heap_unlock() {
    __atomic_store_n(&g_heap_lock, 0, __ATOMIC_RELEASE);
    if (Fiber* f = self()) worker_of(f)->busy = worker_of(f)->busy - 1;
}
void reset_heap_lock() { __atomic_store_n(&g_heap_lock, 0, __ATOMIC_RELEASE); }

extern "C" void* emu_device_malloc(size_t size, const char* file, int line) {
    Fiber* f = self();
    if (f && g_stop) stop_here(f, nullptr, file, line);
    char* raw = static_cast<char*>(malloc(size + 2 * kRedzone));
    if (!raw) return nullptr;
    memset(raw, 0, kRedzone);
    heap_lock();
    if (!g_heap) g_heap = new std::map<uintptr_t, HeapBlock>();
    (*g_heap)[reinterpret_cast<uintptr_t>(raw + kRedzone)] = HeapBlock{
        reinterpret_cast<uintptr_t>(raw), size};
    __atomic_store_n(&g_nheap, static_cast<int>(g_heap->size()), __ATOMIC_RELEASE);
    heap_unlock();
    return raw + kRedzone;
}

extern "C" void emu_device_free(void* p, const char* file, int line) {
    Fiber* f = self();
    if (f && g_stop) stop_here(f, nullptr, file, line);
    if (!p) return;
    heap_lock();
    auto it = g_heap ? g_heap->find(reinterpret_cast<uintptr_t>(p)) : std::map<uintptr_t,
                                                                                HeapBlock>::iterator();
    const bool found = g_heap && it != g_heap->end();
    uintptr_t raw = 0;
    if (found) {
        raw = it->second.raw;
        g_freed_lo[g_nfreed % 64] = it->first, g_freed_size[g_nfreed % 64] = it->second.size;
        ++g_nfreed;
        g_heap->erase(it);
        __atomic_store_n(&g_nheap, static_cast<int>(g_heap->size()), __ATOMIC_RELEASE);
    }
    heap_unlock();
    if (found) return free(reinterpret_cast<void*>(raw));
    if (!f) return;
    set_fault(worker_of(f), F_ACCESS, nullptr, file, line,
              "free(%p): not an address device malloc returned, or freed already", p);
    abort_fiber(f);
}

// A __device__ variable or a live malloc block whose object (margins included) holds a.
Found find_object(uintptr_t a, bool wait) {
    for (int i = 0; i < g_ndev; ++i)
        if (a - g_dev[i].res_lo < g_dev[i].res_hi - g_dev[i].res_lo)
            return Found{OBJ_DEVICE, g_dev[i].lo, g_dev[i].size, g_dev[i].name};
    Found out{OBJ_NONE, 0, 0, nullptr};
    if (!__atomic_load_n(&g_nheap, __ATOMIC_ACQUIRE)) return out;  // no block: no lock to take
    if (wait) heap_lock();
    else if (!heap_trylock()) return out;  // describing a fault that struck inside the lock
    if (g_heap && !g_heap->empty()) {
        auto it = g_heap->upper_bound(a + kRedzone);  // the first block starting after a's zone
        if (it != g_heap->begin()) {
            --it;
            if (a - it->second.raw < it->second.size + 2 * kRedzone)
                out = Found{OBJ_HEAP, it->first, it->second.size, "malloc"};
        }
    }
    heap_unlock();
    return out;
}

// ---- what an address is, for messages ---------------------------------------------------------
static void relative(char* out, size_t n, uintptr_t a, size_t size, uintptr_t lo, uint64_t osize,
                     const char* what) {
    const long long before = static_cast<long long>(lo) - static_cast<long long>(a);
    const long long past = static_cast<long long>(a + size) - static_cast<long long>(lo + osize);
    if (before > 0)
        snprintf(out, n, "%lld bytes before the start of %s", before, what);
    else if (past <= 0)  // inside it (a misaligned access)
        snprintf(out, n, "byte %lld of %s (%llu bytes)", -before, what,
                 static_cast<unsigned long long>(osize));
    else
        snprintf(out, n, "ending %lld bytes past the end of %s (%llu bytes)", past, what,
                 static_cast<unsigned long long>(osize));
}

void describe_address(char* out, size_t n, Fiber* f, uintptr_t a, size_t size) {
    char what[128];
    const char* arena = f ? worker_of(f)->arena : nullptr;
    if (arena && a - reinterpret_cast<uintptr_t>(arena) < kArenaSpan) {
        const uint64_t so = a - reinterpret_cast<uintptr_t>(arena);
        const uint64_t slot = so >> kShShift;
        const uintptr_t lo = reinterpret_cast<uintptr_t>(slot_data(worker_of(f), int(slot)));
        if (slot) snprintf(what, sizeof what, "__shared__ '%s'", g_shdecl[slot - 1].name);
        else snprintf(what, sizeof what, "the dynamic shared memory (extern __shared__)");
        return relative(out, n, a, size, lo, g_slot_size[slot], what);
    }
    if (a - g_arg_base < g_arg_span) {
        const Region& R = g_regions[(a - g_arg_base) >> g_arg_shift];
        const ArgBuf* b = &g_args[R.first];
        for (int i = 1; i < R.n; ++i)  // the nearest of overlapping arguments
            if (a >= g_args[R.first + i].lo) b = &g_args[R.first + i];
        snprintf(what, sizeof what, "argument {arg%d}", b->param);
        return relative(out, n, a, size, b->lo, b->size, what);
    }
    const Found o = find_object(a, false);
    if (o.kind == OBJ_DEVICE) {
        snprintf(what, sizeof what, "__device__ '%s'", o.name);
        return relative(out, n, a, size, o.lo, o.size, what);
    }
    if (o.kind == OBJ_HEAP)
        return relative(out, n, a, size, o.lo, o.size, "a block from device malloc");
    for (unsigned i = 0; i < 64 && i < g_nfreed; ++i)
        if (a - g_freed_lo[i] < g_freed_size[i]) {
            snprintf(out, n, "inside a block of %llu bytes that device malloc returned and free "
                     "released (use after free)", static_cast<unsigned long long>(g_freed_size[i]));
            return;
        }
    if (in_runtime_data(a)) {
        snprintf(out, n, "inside the emulator's own memory (a wild pointer?)");
        return;
    }
    for (int i = 0; i < g_nargs && !g_arg_span; ++i) {  // fast mode: the caller's arrays
        const ArgBuf& b = g_args[i];
        if (a + (1u << 20) >= b.lo && a < b.lo + b.size + (1u << 20)) {
            snprintf(what, sizeof what, "argument {arg%d}", b.param);
            return relative(out, n, a, size, b.lo, b.size, what);
        }
    }
    snprintf(out, n, "not inside any kernel argument, shared array, __device__ variable, malloc "
             "block or the thread's stack");
}
