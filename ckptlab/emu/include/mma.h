// mma.h for ckptlab's CPU emulator: nvcuda::wmma, the warp-level matrix multiply-accumulate
// API of CUDA's tensor cores, with a GPU's semantics on the CPU.
//
//   fragment<matrix_a | matrix_b | accumulator, 16, 16, 16, __half | __nv_bfloat16 | float>
//   fragment<matrix_a | matrix_b | accumulator, 16, 16, 8, precision::tf32 | float>
//   fill_fragment, load_matrix_sync, store_matrix_sync, mma_sync, __float_to_tf32;
//   x[i] and num_elements on every fragment.
//
// What a GPU promises, the emulator enforces:
//   * Every call is warp-collective: all 32 lanes of the warp make it, with the same arguments
//     (pointer, ldm, layout, fill value). A lane that skips it, exits, or passes other
//     arguments is an EmuError naming kernel, block, thread and the kernel's line.
//   * The pointer is 256-bit (32-byte) aligned and ldm a multiple of 16 bytes (8 halves or
//     4 floats) (CUDA C++ Programming Guide, "Warp Matrix Functions"): else an EmuError.
//   * D = A B + C: products of half, bf16 or tf32 inputs are exact in fp32 (at most 11 x 11
//     significant bits < 24), and they are summed in fp32 (in k order here; the hardware's
//     order is its own). tf32: mma_sync reads only the top 19 bits of each float (sign,
//     exponent, 10 fraction bits), the low 13 are dropped; __float_to_tf32 rounds to nearest,
//     ties away from zero (PTX cvt.rna.tf32.f32), as CUDA's does.
//   * Which lane holds which element (the fragment layout) is unspecified by CUDA; the
//     emulator has its own (see `owner` below: matrix_a interleaved by rows, matrix_b by
//     columns, the accumulator in blocks of 8). Code that only does the same thing to every
//     x[i] is correct on both; code that assumes a layout is wrong on both.
//
// Where the emulator differs from a GPU (code written to CUDA's contract runs the same on both):
//   * num_elements of __half / __nv_bfloat16 matrix_a and matrix_b fragments (m16n16k16):
//     CUDA's are 16 per lane (its layouts hold some elements in more than one lane), the
//     emulator's 8 (each of the 256 elements once). Accumulators (8 floats a lane) agree. A
//     loop to num_elements that does the same to every x[i] is right on both; code that
//     hard-codes 16, or copies x[i] between fragments of different kinds, is not.
//   * Summation: the emulator adds the k products to C one by one in k order, each addition
//     rounded to nearest in fp32. Tensor cores add a whole group of products at once, aligned
//     to the largest exponent, and truncate the bits shifted out instead of rounding (V100, T4,
//     A100: Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor cores",
//     PeerJ Computer Science 7:e330, 2021). So a GPU's fp32 sums can differ from the
//     emulator's in the last bits and drift toward zero, by up to about one fp32 ulp of the
//     largest term per group; error bounds set by 16-bit rounding (2^-9 for bf16, 2^-12 for
//     half, relative) are 2^11 or more times larger and hold on both, while a test that
//     compares fp32 accumulators bit for bit with the emulator's holds on the emulator only.
//
// Bytes: each lane loads and stores only its own elements of a tile, so the memory hooks count
// a 16 x 16 half tile as 512 bytes once per warp, as a GPU moves it, not 32 times. mma_sync
// exchanges the fragments through a per-warp staging buffer in thread-local storage (a block's
// fibers never leave their OS thread), in helpers the hooks do not see: registers, not memory.
// The lanes wait for each other with the emulator's warp exchange, which (like the tensor core)
// orders no memory: a lane reading what another lane stored needs __syncwarp, as on a GPU.
#pragma once

#include <source_location>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

// ckptlab/emu/scheduler.cpp: report a misused warp-collective call as a warp fault at the
// kernel's line and end the launch.
extern "C" [[noreturn]] void emu_warp_fault(const char* file, int line, const char* message);

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
}

namespace emu {
// the tile a fragment holds: matrix_a is m x k, matrix_b k x n, the accumulator m x n
template <class Use, int m, int n, int k> struct tile;
template <int m, int n, int k> struct tile<matrix_a, m, n, k> { static constexpr int rows = m, cols = k; };
template <int m, int n, int k> struct tile<matrix_b, m, n, k> { static constexpr int rows = k, cols = n; };
template <int m, int n, int k> struct tile<accumulator, m, n, k> { static constexpr int rows = m, cols = n; };

template <class T> struct storage { using type = T; };
template <> struct storage<precision::tf32> { using type = float; };

template <class Use, int m, int n, int k, class T, class Layout>
constexpr bool supported() {
    if (m != 16 || n != 16 || (k != 16 && k != 8)) return false;
    if constexpr (std::is_same_v<Use, accumulator>) {
        return std::is_same_v<T, float> && std::is_void_v<Layout>;
    } else {
        const bool layout = std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>;
        const bool half = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
        return layout && (k == 16 ? half : std::is_same_v<T, precision::tf32>);
    }
}

// The emulator's fragment layout: element (r, c) of the tile is x[i] of lane `lane`.
//   matrix_a     row-major order e = r*cols + c, dealt out like cards: lane e % 32, slot e / 32
//   matrix_b     column-major order e = c*rows + r, dealt the same way
//   accumulator  row-major order in blocks: lane e / per_lane holds slots e % per_lane
template <class Use, int rows, int cols>
struct owner {
    static constexpr int per_lane = rows * cols / 32;
    static void rc(int lane, int i, int& r, int& c) {
        if constexpr (std::is_same_v<Use, matrix_a>) {
            const int e = lane + 32 * i;
            r = e / cols, c = e % cols;
        } else if constexpr (std::is_same_v<Use, matrix_b>) {
            const int e = lane + 32 * i;
            c = e / rows, r = e % rows;
        } else {
            const int e = lane * per_lane + i;
            r = e / cols, c = e % cols;
        }
    }
};
}  // namespace emu

template <class Use, int m, int n, int k, class T, class Layout = void>
class fragment {
    static_assert(emu::supported<Use, m, n, k, T, Layout>(),
                  "ckptlab's emulator has wmma m16n16k16 with __half or __nv_bfloat16 inputs "
                  "(row_major or col_major) and float accumulators (Layout void), and m16n16k8 "
                  "with precision::tf32 inputs and float accumulators");

public:
    using element_type = T;
    using storage_element_type = typename emu::storage<T>::type;
    static constexpr int rows = emu::tile<Use, m, n, k>::rows;
    static constexpr int cols = emu::tile<Use, m, n, k>::cols;
    enum { num_elements = rows * cols / 32, num_storage_elements = rows * cols / 32 };
    storage_element_type x[num_elements];
};

inline float __float_to_tf32(float f) {  // round to nearest, ties away from zero (cvt.rna)
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0x1000u) & ~0x1fffu;  // inf, NaN unchanged
    std::memcpy(&f, &b, 4);
    return f;
}

namespace emu {
#define EMU_WMMA_HIDDEN __attribute__((no_sanitize_thread, no_sanitize_address, noinline))

struct Args {
    const void* p;
    unsigned ldm;
    int layout;
    uint32_t value;  // fill_fragment's value, as bits
};
// Per warp of the block: the fragments mma_sync exchanges, and each lane's arguments of its
// latest two calls (slot = its call count mod 2).
struct Stage {
    float a[16 * 16], b[16 * 16], c[16 * 16];
    Args args[2][32];
    unsigned calls[32];
};
inline thread_local Stage stage[EMU_MAX_BLOCK_THREADS / 32];

inline int thread_rank() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// Wait until all 32 lanes of this warp arrive here; returns lane 0's `bits`. A lane missing,
// exited or waiting elsewhere is the emulator's warp fault, named at the kernel's line.
EMU_WMMA_HIDDEN inline unsigned long long sync(const std::source_location& loc,
                                               unsigned long long bits = 0) {
    return emu_warp_exchange(EMU_WMMA, 0xffffffffu, bits, 0, 32, loc.file_name(),
                             (int)loc.line());
}

[[noreturn]] EMU_WMMA_HIDDEN inline void fail(const std::source_location& loc, const char* msg) {
    emu_warp_fault(loc.file_name(), (int)loc.line(), msg);
}

// Every lane of the warp calls with the same arguments, or the launch fails here. Each lane
// files its arguments under its call count; the exchange hands every lane lane 0's count, so
// each compares with lane 0's arguments of this very call: lane 0 can file its next call's only
// in the other slot, and the one after that only once every lane has come to the next call.
EMU_WMMA_HIDDEN inline void collective(const char* what, const Args& mine,
                                       const std::source_location& loc) {
    const int t = thread_rank(), lane = t % 32;
    Stage& w = stage[t / 32];
    const unsigned mine_slot = w.calls[lane]++ % 2;
    w.args[mine_slot][lane] = mine;
    const Args& z = w.args[sync(loc, mine_slot)][0];
    if (mine.p != z.p || mine.ldm != z.ldm || mine.layout != z.layout || mine.value != z.value) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "%s is warp-collective: every lane must pass the same arguments, but lane 0 "
                 "passed (pointer %p, ldm %u, layout %d, value bits 0x%x) and lane %d passed "
                 "(pointer %p, ldm %u, layout %d, value bits 0x%x)",
                 what, z.p, z.ldm, z.layout, z.value, lane, mine.p, mine.ldm, mine.layout,
                 mine.value);
        fail(loc, msg);
    }
}

// CUDA's requirements on a tile's address and leading dimension.
EMU_WMMA_HIDDEN inline void check_tile(const char* what, const void* p, unsigned ldm,
                                       size_t elem, const std::source_location& loc) {
    char msg[384];
    if (reinterpret_cast<uintptr_t>(p) % 32) {
        snprintf(msg, sizeof msg, "%s: the pointer %p is not 256-bit (32-byte) aligned, as CUDA "
                 "requires (a shared array needs __align__(32))", what, p);
        fail(loc, msg);
    }
    if ((ldm * elem) % 16) {
        snprintf(msg, sizeof msg, "%s: ldm = %u elements of %zu bytes is not a multiple of 16 "
                 "bytes, as CUDA requires", what, ldm, elem);
        fail(loc, msg);
    }
}

template <class S>
inline float to_float(S v) { return static_cast<float>(v); }
inline float tf32_bits(float f) {  // what the tensor core reads of a tf32 operand
    uint32_t b;
    std::memcpy(&b, &f, 4);
    b &= ~0x1fffu;
    std::memcpy(&f, &b, 4);
    return f;
}

// D = A B + C for the warp: each lane puts its elements of A, B, C into the warp's staging
// buffer, then computes its own elements of D from the whole tiles.
template <class Frag_d, class Frag_a, class Frag_b, class Frag_c>
EMU_WMMA_HIDDEN void mma(Frag_d& d, const Frag_a& a, const Frag_b& b, const Frag_c& c,
                         const std::source_location& loc) {
    constexpr int M = Frag_a::rows, K = Frag_a::cols, N = Frag_b::cols;
    constexpr bool tf32 = std::is_same_v<typename Frag_a::element_type, precision::tf32>;
    const int t = thread_rank(), lane = t % 32;
    Stage& w = stage[t / 32];
    int r, col;
    for (int i = 0; i < Frag_a::num_elements; ++i) {
        owner<matrix_a, M, K>::rc(lane, i, r, col);
        w.a[r * K + col] = tf32 ? tf32_bits(to_float(a.x[i])) : to_float(a.x[i]);
    }
    for (int i = 0; i < Frag_b::num_elements; ++i) {
        owner<matrix_b, K, N>::rc(lane, i, r, col);
        w.b[r * N + col] = tf32 ? tf32_bits(to_float(b.x[i])) : to_float(b.x[i]);
    }
    for (int i = 0; i < Frag_c::num_elements; ++i) {
        owner<accumulator, M, N>::rc(lane, i, r, col);
        w.c[r * N + col] = c.x[i];
    }
    sync(loc);  // the whole A, B and C are staged
    for (int i = 0; i < Frag_d::num_elements; ++i) {
        owner<accumulator, M, N>::rc(lane, i, r, col);
        float acc = w.c[r * N + col];
        for (int kk = 0; kk < K; ++kk) acc += w.a[r * K + kk] * w.b[kk * N + col];  // exact products
        d.x[i] = acc;
    }
    sync(loc);  // every lane has read the staging buffer before any lane's next mma_sync refills it
}
#undef EMU_WMMA_HIDDEN
}  // namespace emu

// ---- the API ------------------------------------------------------------------------------------
// Each call takes the caller's source location as a hidden last argument, for the error messages.
using emu_here = std::source_location;

template <class Use, int m, int n, int k, class T, class L>
inline void fill_fragment(fragment<Use, m, n, k, T, L>& f,
                          const typename emu::storage<T>::type& v,
                          emu_here loc = emu_here::current()) {
    using S = typename emu::storage<T>::type;
    uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof(S));
    emu::collective("wmma::fill_fragment", {nullptr, 0, 0, bits}, loc);
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = v;
}

// matrix_a / matrix_b: the memory layout is the fragment's Layout (row_major or col_major).
// Each lane reads its own elements: element (r, c) is p[r*ldm + c] (row) or p[c*ldm + r] (col).
template <class Use, int m, int n, int k, class T, class L>
inline void load_matrix_sync(fragment<Use, m, n, k, T, L>& f,
                             const typename emu::storage<T>::type* p, unsigned ldm,
                             emu_here loc = emu_here::current()) {
    static_assert(!std::is_same_v<Use, accumulator>,
                  "wmma::load_matrix_sync of an accumulator takes a layout_t as 4th argument");
    using F = fragment<Use, m, n, k, T, L>;
    constexpr bool row = std::is_same_v<L, row_major>;
    emu::collective("wmma::load_matrix_sync", {p, ldm, row ? 0 : 1, 0}, loc);
    emu::check_tile("wmma::load_matrix_sync", p, ldm, sizeof(*p), loc);
    const int lane = emu::thread_rank() % 32;
    for (int i = 0; i < F::num_elements; ++i) {
        int r, c;
        emu::owner<Use, F::rows, F::cols>::rc(lane, i, r, c);
        f.x[i] = row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    }
}

template <int m, int n, int k>
inline void load_matrix_sync(fragment<accumulator, m, n, k, float>& f, const float* p,
                             unsigned ldm, layout_t layout, emu_here loc = emu_here::current()) {
    using F = fragment<accumulator, m, n, k, float>;
    emu::collective("wmma::load_matrix_sync", {p, ldm, (int)layout, 0}, loc);
    emu::check_tile("wmma::load_matrix_sync", p, ldm, sizeof(float), loc);
    const int lane = emu::thread_rank() % 32;
    for (int i = 0; i < F::num_elements; ++i) {
        int r, c;
        emu::owner<accumulator, F::rows, F::cols>::rc(lane, i, r, c);
        f.x[i] = layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    }
}

template <int m, int n, int k>
inline void store_matrix_sync(float* p, const fragment<accumulator, m, n, k, float>& f,
                              unsigned ldm, layout_t layout, emu_here loc = emu_here::current()) {
    using F = fragment<accumulator, m, n, k, float>;
    emu::collective("wmma::store_matrix_sync", {p, ldm, (int)layout, 0}, loc);
    emu::check_tile("wmma::store_matrix_sync", p, ldm, sizeof(float), loc);
    const int lane = emu::thread_rank() % 32;
    for (int i = 0; i < F::num_elements; ++i) {
        int r, c;
        emu::owner<accumulator, F::rows, F::cols>::rc(lane, i, r, c);
        (layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.x[i];
    }
}

template <int m, int n, int k, class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, m, n, k, float>& d,
                     const fragment<matrix_a, m, n, k, T, LA>& a,
                     const fragment<matrix_b, m, n, k, T, LB>& b,
                     const fragment<accumulator, m, n, k, float>& c,
                     emu_here loc = emu_here::current()) {
    emu::mma(d, a, b, c, loc);
}

}  // namespace wmma
}  // namespace nvcuda
