// atomics.cpp: CUDA's atomics (atomicAdd, Sub, Max, Min, Exch, And, Or, Xor, CAS) and the
// C++ atomics GCC's instrumentation turns a kernel file's std::atomic into.
//
//   CUDA's    real atomics: the workers run at once. Each is checked and counted first by
//             on_atomic (memory.cpp: bounds, alignment, an atomic access of its size; the
//             runtime is not instrumented, so they do not pass through the hooks).
//   C++'s     the guard of a function's static, std::atomic: not counted, done in full.
#include "runtime.h"

template <class T>
static T rmw(T* a, T v, int op) {  // op: + - max min exch & | ^
    using U = std::conditional_t<sizeof(T) == 8, unsigned long long, unsigned>;
    U* p = reinterpret_cast<U*>(a);
    U old = __atomic_load_n(p, __ATOMIC_RELAXED), next;
    for (;;) {
        T o, n;
        memcpy(&o, &old, sizeof o);
        switch (op) {
            case 0: n = o + v; break;
            case 1: n = o - v; break;
            case 2: n = o > v ? o : v; break;
            case 3: n = o < v ? o : v; break;
            default: n = v; break;
        }
        memcpy(&next, &n, sizeof n);
        if (__atomic_compare_exchange_n(p, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return o;
    }
}
#define EMU_ATOMIC(T, NAME, OP)                               \
    T NAME(T* a, T v) {                                       \
        on_atomic(a, sizeof(T), __builtin_return_address(0)); \
        return rmw<T>(a, v, OP);                              \
    }
EMU_ATOMIC(float, atomicAdd, 0)
EMU_ATOMIC(double, atomicAdd, 0)
EMU_ATOMIC(int, atomicAdd, 0)
EMU_ATOMIC(unsigned, atomicAdd, 0)
EMU_ATOMIC(unsigned long long, atomicAdd, 0)
EMU_ATOMIC(int, atomicSub, 1)
EMU_ATOMIC(unsigned, atomicSub, 1)
EMU_ATOMIC(int, atomicMax, 2)
EMU_ATOMIC(unsigned, atomicMax, 2)
EMU_ATOMIC(int, atomicMin, 3)
EMU_ATOMIC(unsigned, atomicMin, 3)
EMU_ATOMIC(int, atomicExch, 4)
EMU_ATOMIC(unsigned, atomicExch, 4)
EMU_ATOMIC(float, atomicExch, 4)
#define EMU_BITWISE(NAME, FN)                                 \
    int NAME(int* a, int v) {                                 \
        on_atomic(a, sizeof(int), __builtin_return_address(0)); \
        return FN(a, v, __ATOMIC_RELAXED);                    \
    }
EMU_BITWISE(atomicAnd, __atomic_fetch_and)
EMU_BITWISE(atomicOr, __atomic_fetch_or)
EMU_BITWISE(atomicXor, __atomic_fetch_xor)
#define EMU_CAS(T)                                                                         \
    T atomicCAS(T* a, T compare, T v) {                                                    \
        on_atomic(a, sizeof(T), __builtin_return_address(0));                              \
        __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); \
        return compare;                                                                    \
    }
EMU_CAS(int)
EMU_CAS(unsigned)
EMU_CAS(unsigned long long)

// C++ atomics in the kernel file (the guard of a function's static, std::atomic): GCC calls
// these instead of the plain hooks. Not CUDA's atomics: not counted, done in full (seq_cst).
#define EMU_TSAN_ATOMICS(N, T)                                                                  \
    extern "C" T __tsan_atomic##N##_load(const volatile T* a, int) {                            \
        return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                            \
    }                                                                                           \
    extern "C" void __tsan_atomic##N##_store(volatile T* a, T v, int) {                         \
        __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                               \
    }                                                                                           \
    extern "C" T __tsan_atomic##N##_exchange(volatile T* a, T v, int) {                         \
        return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                     \
    }                                                                                           \
    extern "C" T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) {                        \
        return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                      \
    }                                                                                           \
    extern "C" T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) {                        \
        return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                      \
    }                                                                                           \
    extern "C" T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) {                        \
        return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                      \
    }                                                                                           \
    extern "C" T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) {                         \
        return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                       \
    }                                                                                           \
    extern "C" T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) {                        \
        return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                      \
    }                                                                                           \
    extern "C" int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int,    \
                                                              int) {                            \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
    }                                                                                           \
    extern "C" int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int,      \
                                                            int) {                              \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
    }                                                                                           \
    extern "C" T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {   \
        __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);       \
        return c;                                                                               \
    }
EMU_TSAN_ATOMICS(8, uint8_t)
EMU_TSAN_ATOMICS(16, uint16_t)
EMU_TSAN_ATOMICS(32, uint32_t)
EMU_TSAN_ATOMICS(64, uint64_t)
extern "C" void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
extern "C" void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
