// shim.h: the CUDA vocabulary as host C++, force-included (-include shim.h) before every kernel
// file the emulator compiles. Kernels are the same .cu files nvcc/NVRTC compile for a GPU.
//
// Execution model (runtime.h): every CUDA thread of a block is a fiber; a block's fibers run on
// one OS thread (a worker), and workers take blocks until the grid is done. __syncthreads and
// warp operations switch back to the worker's scheduler, which releases threads when the whole
// block (or the warp mask) has arrived. Every load and store in the kernel file is seen by the
// runtime (GCC's -fsanitize=thread hooks), which counts global bytes per kernel argument,
// checks each access against the object it belongs to, and looks for races.
#pragma once

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "abi.h"  // warp-operation codes and limits, shared with the runtime and Python

// ---- qualifiers ---------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
#define __constant__ static
// Shared memory. The loader rewrites each `__shared__ T name[dims];` (in the kernel file and
// in the headers it includes) into a slot of the worker's shared arena: an id taken the first
// time the declaration executes (emu_shared_declare) and a reference to its slot through
// emu_launder, so that every access is a pointer access GCC's hooks see (they skip a static
// array at a constant index). `extern __shared__ T name[];` becomes a pointer to the block's
// dynamic shared buffer (slot 0). A __shared__ the loader could not rewrite stops the compile:
#define __shared__ \
    _Pragma("GCC error \"ckptlab.emu: write shared memory as '__shared__ TYPE name[dims];' (several comma-separated names are fine)\"")
extern "C" int emu_shared_declare(size_t size, size_t align, const char* name);
constexpr int kShShift = 20;                         // 1 MiB slots ...
constexpr size_t kShHalf = size_t(1) << (kShShift - 1);  // ... the data in the middle
constexpr int kArenaShift = 28;                      // an arena's bytes: 1 << 28
// Where slot s's data starts in the slot: the middle, offset by a cache line per slot modulo
// 4 KiB, so that two arrays never share their addresses' low 12 bits (4K aliasing, the same
// cache sets: measured 7% slower SGEMM without).
constexpr size_t emu_slot_start(size_t slot) { return kShHalf + (((slot * 16) & 63) << 6); }
// A `__device__ T name[dims] = init;` variable: the loader keeps the initial value under
// another name and binds `name` to a copy in an object of its own (emu_device_object).
extern "C" void* emu_device_object(const void* init, size_t size, size_t align,
                                   const char* name);
template <class T>
__attribute__((always_inline)) inline T* emu_launder(T* p) {
    asm("" : "+r"(p));  // the compiler can no longer see which object p points to
    return p;
}

// ---- device malloc/free and abort(): the runtime's, so that they are checked and stoppable --
// (__FILE__ and __LINE__ travel: an error names the line even where the call is a tail call)
extern "C" void* emu_device_malloc(size_t size, const char* file, int line);
extern "C" void emu_device_free(void* p, const char* file, int line);
extern "C" [[noreturn]] void emu_kernel_abort(const char* file, int line);
namespace std {
using ::emu_device_free;
using ::emu_device_malloc;
using ::emu_kernel_abort;
}  // namespace std
#define malloc(n) emu_device_malloc((n), __FILE__, __LINE__)
#define free(p) emu_device_free((p), __FILE__, __LINE__)
#define abort() emu_kernel_abort(__FILE__, __LINE__)

// ---- built-in variables -------------------------------------------------------------------
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
        : x(x_), y(y_), z(z_) {}
};
// Each fiber's threadIdx and blockIdx, in a table indexed by its stack slot: a fiber finds its
// own from its stack pointer (runtime.h, self()). blockDim, gridDim: the launch's.
struct EmuHead { uint3 idx, block; char rest[40]; };  // the head of runtime.h's Fiber
struct EmuDims { dim3 block_dim, grid_dim; };
extern "C" __attribute__((visibility("hidden"))) uintptr_t emu_fbase;
extern "C" __attribute__((visibility("hidden"))) uint64_t emu_fshift;
extern "C" __attribute__((visibility("hidden"))) EmuHead* emu_heads;
extern "C" __attribute__((visibility("hidden"))) EmuDims emu_dims;
extern "C" __attribute__((visibility("hidden"))) uint64_t emu_wmask;
extern "C" __attribute__((visibility("hidden"))) uintptr_t emu_arena_base;
// A load the memory hooks do not see, and that the compiler may reuse across stores: these
// values do not change while a kernel thread runs.
template <class T>
__attribute__((always_inline)) inline T emu_pure_load(const T* p) {
#if defined(__x86_64__)
    T v;
    if constexpr (sizeof(T) == 8) asm("movq (%1), %0" : "=r"(v) : "r"(p));
    else asm("movl (%1), %0" : "=r"(v) : "r"(p));
    return v;
#else
    return *p;
#endif
}
// The stack pointer: which fiber (and worker) is running, by arithmetic alone.
__attribute__((always_inline)) inline uintptr_t emu_sp() {
#if defined(__x86_64__)
    uintptr_t sp;
    asm("mov %%rsp, %0" : "=r"(sp));
    return sp;
#else
    return reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
#endif
}
__attribute__((always_inline)) inline const EmuHead* emu_head() {
    const uintptr_t sp = emu_sp();
    const uintptr_t base = emu_pure_load(&emu_fbase);
    const uint64_t shift = emu_pure_load(&emu_fshift);
    return emu_pure_load(&emu_heads) + ((sp - base) >> shift);
}
__attribute__((always_inline)) inline uint3 emu_uint3(const uint3* p) {
    return uint3{emu_pure_load(&p->x), emu_pure_load(&p->y), emu_pure_load(&p->z)};
}
__attribute__((always_inline)) inline dim3 emu_dim3(const dim3* p) {
    return dim3(emu_pure_load(&p->x), emu_pure_load(&p->y), emu_pure_load(&p->z));
}
// The running worker's shared arena, from the stack pointer as emu_head().
__attribute__((always_inline)) inline char* emu_arena() {
    const uintptr_t sp = emu_sp();
    // worker k's stacks and its arena are both k strides of (1 << g_wshift) from their bases
    const uint64_t k_stride = (sp - emu_pure_load(&emu_fbase)) & emu_pure_load(&emu_wmask);
    return reinterpret_cast<char*>(emu_pure_load(&emu_arena_base) + k_stride);
}
__attribute__((always_inline)) inline char* emu_shared_at(int id) {
    return emu_arena() + (size_t(id + 1) << kShShift) + emu_slot_start(size_t(id + 1));
}
__attribute__((always_inline)) inline char* emu_dynamic_shared() {
    return emu_arena() + emu_slot_start(0);
}
#define threadIdx (emu_uint3(&emu_head()->idx))
#define blockIdx (emu_uint3(&emu_head()->block))
#define blockDim (emu_dim3(&emu_dims.block_dim))
#define gridDim (emu_dim3(&emu_dims.grid_dim))
constexpr int warpSize = 32;

// ---- vector types ---------------------------------------------------------------------------
struct __align__(8) float2 { float x, y; };
struct float3 { float x, y, z; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(8) uint2 { unsigned int x, y; };
struct __align__(16) uint4 { unsigned int x, y, z, w; };
struct __align__(16) double2 { double x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline dim3 make_dim3(unsigned x, unsigned y, unsigned z) { return dim3(x, y, z); }

// ---- synchronisation (scheduler.cpp); __FILE__/__LINE__ travel so errors name the line -----
extern "C" void emu_syncthreads(const char* file, int line);
extern "C" int emu_syncthreads_reduce(int op, int pred, const char* file, int line);
extern "C" void emu_syncwarp(const char* file, int line, unsigned mask);
extern "C" unsigned long long emu_warp_exchange(int op, unsigned mask, unsigned long long bits,
                                                int arg, int width, const char* file, int line);
extern "C" unsigned emu_activemask(void);
extern "C" void emu_trap(const char* what, const char* file, int line);

#define __syncthreads() emu_syncthreads(__FILE__, __LINE__)
#define __syncthreads_count(p) emu_syncthreads_reduce(0, (p), __FILE__, __LINE__)
#define __syncthreads_and(p) emu_syncthreads_reduce(1, (p), __FILE__, __LINE__)
#define __syncthreads_or(p) emu_syncthreads_reduce(2, (p), __FILE__, __LINE__)
#define __syncwarp(...) emu_syncwarp_(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
inline void emu_syncwarp_(const char* f, int l, unsigned mask = 0xffffffffu) {
    emu_syncwarp(f, l, mask);
}
#define __activemask() emu_activemask()
#define __threadfence() ((void)0)
#define __threadfence_block() ((void)0)
#define __trap() emu_trap("__trap()", __FILE__, __LINE__)
#define __brkpt() emu_trap("__brkpt()", __FILE__, __LINE__)

template <class T>
inline T emu_shfl(int op, const char* f, int l, unsigned mask, T var, int arg, int width = 32) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of a value > 8 bytes");
    unsigned long long bits = 0;
    std::memcpy(&bits, &var, sizeof(T));
    bits = emu_warp_exchange(op, mask, bits, arg, width, f, l);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
#define __shfl_sync(...) emu_shfl(EMU_SHFL_IDX, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) emu_shfl(EMU_SHFL_UP, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) emu_shfl(EMU_SHFL_DOWN, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) emu_shfl(EMU_SHFL_XOR, __FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, pred) \
    ((unsigned)emu_warp_exchange(EMU_BALLOT, (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(mask, pred) \
    ((int)emu_warp_exchange(EMU_ANY, (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, pred) \
    ((int)emu_warp_exchange(EMU_ALL, (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))

// ---- atomics (atomics.cpp; memory.cpp counts them, since the runtime is not instrumented) --
float atomicAdd(float* a, float v);
double atomicAdd(double* a, double v);
int atomicAdd(int* a, int v);
unsigned atomicAdd(unsigned* a, unsigned v);
unsigned long long atomicAdd(unsigned long long* a, unsigned long long v);
int atomicSub(int* a, int v);
unsigned atomicSub(unsigned* a, unsigned v);
int atomicMax(int* a, int v);
unsigned atomicMax(unsigned* a, unsigned v);
int atomicMin(int* a, int v);
unsigned atomicMin(unsigned* a, unsigned v);
int atomicExch(int* a, int v);
unsigned atomicExch(unsigned* a, unsigned v);
float atomicExch(float* a, float v);
int atomicCAS(int* a, int compare, int v);
unsigned atomicCAS(unsigned* a, unsigned compare, unsigned v);
unsigned long long atomicCAS(unsigned long long* a, unsigned long long compare,
                             unsigned long long v);
int atomicAnd(int* a, int v);
int atomicOr(int* a, int v);
int atomicXor(int* a, int v);

// ---- math intrinsics: fast-math forms map to the libm functions -----------------------------
// (glibc declares __expf/__logf itself, so these must be macros, not functions)
#define __expf(x) expf(x)
#define __exp10f(x) exp10f(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __log10f(x) log10f(x)
#define __powf(x, y) powf((x), (y))
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __fdividef(a, b) ((a) / (b))
#define __frcp_rn(x) (1.0f / (x))
#define __fsqrt_rn(x) sqrtf(x)
#define __fmaf_rn(a, b, c) fmaf((a), (b), (c))
#define __fmul_rn(a, b) ((a) * (b))
#define __fadd_rn(a, b) ((a) + (b))
#define __fsub_rn(a, b) ((a) - (b))
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
    using T = std::common_type_t<A, B>;
    return (T)a < (T)b ? (T)a : (T)b;
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
    using T = std::common_type_t<A, B>;
    return (T)a > (T)b ? (T)a : (T)b;
}

// ---- bit and integer intrinsics -------------------------------------------------------------
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline unsigned __float2uint_rz(float x) { return (unsigned)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
template <class T>
inline T __ldg(const T* p) { return *p; }

// ---- launching (used by the code the loader appends to each kernel file) --------------------
// Each kernel gets `extern "C" void emu_launch_<i>(void** args)` that unpacks a cuLaunchKernel-
// style argument array using the kernel's own parameter types, and `emu_sig_<i>`, a string of
// those types ("const float*,int,float") that Python checks arguments against.
#define EMU_UNCOUNTED_ __attribute__((no_sanitize_thread, no_sanitize_address)) inline
template <class T> struct emu_type { static constexpr const char* name = nullptr; };
#define EMU_TYPE(T, S) template <> struct emu_type<T> { static constexpr const char* name = S; };
EMU_TYPE(float, "float") EMU_TYPE(double, "double") EMU_TYPE(int, "int")
EMU_TYPE(unsigned int, "unsigned int") EMU_TYPE(long long, "long long")
EMU_TYPE(unsigned long long, "unsigned long long") EMU_TYPE(long, "long")
EMU_TYPE(unsigned long, "unsigned long") EMU_TYPE(short, "short")
EMU_TYPE(unsigned short, "unsigned short") EMU_TYPE(char, "char")
EMU_TYPE(signed char, "signed char") EMU_TYPE(unsigned char, "unsigned char")
EMU_TYPE(bool, "bool") EMU_TYPE(float2, "float2") EMU_TYPE(float4, "float4")
EMU_TYPE(int2, "int2") EMU_TYPE(int4, "int4") EMU_TYPE(uint2, "uint2") EMU_TYPE(uint4, "uint4")
EMU_TYPE(double2, "double2")
#undef EMU_TYPE

template <class T>
constexpr bool emu_known() {
    using U = std::remove_cv_t<std::remove_pointer_t<std::remove_cv_t<T>>>;
    return emu_type<U>::name != nullptr;
}
template <class T>
inline void emu_append_type(char* out, size_t cap) {
    using P = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<P>) {
        using E = std::remove_pointer_t<P>;
        if (std::is_const_v<E>) strncat(out, "const ", cap - strlen(out) - 1);
        strncat(out, emu_type<std::remove_cv_t<E>>::name, cap - strlen(out) - 1);
        strncat(out, "*", cap - strlen(out) - 1);
    } else {
        strncat(out, emu_type<P>::name, cap - strlen(out) - 1);
    }
}
template <class... A>
inline const char* emu_signature(void (*)(A...)) {
    static_assert((emu_known<A>() && ...),
                  "the emulator supports kernel parameters of scalar, vector and pointer-to-those "
                  "types only");
    static char sig[32 * sizeof...(A) + 8];  // the longest type name is 25 characters
    if (sig[0] == 0) {
        // "const float*,int,float": a comma before every type but the first
        ((sig[0] ? (void)strncat(sig, ",", sizeof sig - strlen(sig) - 1) : (void)0,
          emu_append_type<A>(sig, sizeof sig)),
         ...);
        if (sig[0] == 0) strcpy(sig, "void");
    }
    return sig;
}
template <class... A, size_t... I>
EMU_UNCOUNTED_ void emu_call(void (*k)(A...), void** args,
                                                          std::index_sequence<I...>) {
    k(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}
template <class... A>
EMU_UNCOUNTED_ void emu_invoke(void (*k)(A...), void** args) {
    emu_call(k, args, std::index_sequence_for<A...>{});
}
#define EMU_EXPORT extern "C" __attribute__((visibility("default")))
// The launchers read the argument array Python built: not kernel memory, so not counted.
#define EMU_UNCOUNTED __attribute__((no_sanitize_thread, no_sanitize_address, noinline))
