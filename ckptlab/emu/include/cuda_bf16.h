// cuda_bf16.h for ckptlab's CPU emulator: the part of CUDA's bfloat16 header the kernels use.
//
//   __nv_bfloat16   bfloat16 (1 sign, 8 exponent, 7 fraction bits): the upper half of a float,
//                   stored as its 16 bits (g++ has no host bf16 type)
//   __nv_bfloat162  two of them (x low, y high)
//   conversions     __float2bfloat16 (round to nearest even; float's range, so no overflow
//                   but from rounding the largest floats up to inf), __bfloat162float (exact:
//                   the bits shifted up), the _rn form, raw bits
//   arithmetic      __hadd/__hsub/__hmul/__hdiv/__hfma... overloaded for bf16 as in CUDA, and
//                   the operators: in float, rounded once (float's 24 bits >= 2*8 + 2: rounding
//                   twice is innocuous for + - * /, as for half); __hfma and the conversions
//                   from double through float rounded to odd, as in cuda_fp16.h
#pragma once

#include "cuda_fp16.h"

inline unsigned short emu_float_to_bf16_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN: CUDA's canonical bf16 NaN
    // round the low 16 bits away, ties to even; a carry moves into the exponent (up to inf)
    return static_cast<unsigned short>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float emu_bf16_bits_to_float(unsigned short b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

struct __nv_bfloat16_raw {
    unsigned short x;
};

struct __align__(2) __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
    __nv_bfloat16(float f) : __x(emu_float_to_bf16_bits(f)) {}
    __nv_bfloat16(double f) : __x(emu_float_to_bf16_bits(emu_double_to_float_odd(f))) {}
    __nv_bfloat16(int i) : __x(emu_float_to_bf16_bits(static_cast<float>(i))) {}
    operator float() const { return emu_bf16_bits_to_float(__x); }
    operator __nv_bfloat16_raw() const { return {__x}; }
};

struct __align__(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
using nv_bfloat16 = __nv_bfloat16;
using nv_bfloat162 = __nv_bfloat162;

inline __nv_bfloat16 emu_bf16_from_bits(unsigned short b) {
    __nv_bfloat16 h;
    h.__x = b;
    return h;
}

// ---- conversions ------------------------------------------------------------------------------
inline __nv_bfloat16 __float2bfloat16(float f) { return emu_bf16_from_bits(emu_float_to_bf16_bits(f)); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rz(float f) {  // truncation: toward zero
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return emu_bf16_from_bits(0x7fff);
    return emu_bf16_from_bits(static_cast<unsigned short>(x >> 16));
}
inline float __bfloat162float(__nv_bfloat16 h) { return emu_bf16_bits_to_float(h.__x); }
inline __nv_bfloat16 __double2bfloat16(double d) {
    return __float2bfloat16(emu_double_to_float_odd(d));
}
inline __nv_bfloat16 __int2bfloat16_rn(int i) { return __float2bfloat16(static_cast<float>(i)); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return emu_bf16_from_bits(b); }

inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 lo, __nv_bfloat16 hi) { return {lo, hi}; }
inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return {x, y}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return {__float2bfloat16(lo), __float2bfloat16(hi)};
}
inline __nv_bfloat162 __float2bfloat162_rn(float f) { return {__float2bfloat16(f), __float2bfloat16(f)}; }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 h) { return {h, h}; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
inline float __low2float(__nv_bfloat162 h) { return __bfloat162float(h.x); }
inline float __high2float(__nv_bfloat162 h) { return __bfloat162float(h.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {__bfloat162float(h.x), __bfloat162float(h.y)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }

// ---- arithmetic: in float, rounded once ---------------------------------------------------------
inline __nv_bfloat16 emu_bf16_op(float r) { return __float2bfloat16(r); }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return emu_bf16_op(float(a) + float(b)); }
inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return emu_bf16_op(float(a) - float(b)); }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return emu_bf16_op(float(a) * float(b)); }
inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) { return emu_bf16_op(float(a) / float(b)); }
inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return emu_bf16_from_bits(a.__x ^ 0x8000u); }
inline __nv_bfloat16 __habs(__nv_bfloat16 a) { return emu_bf16_from_bits(a.__x & 0x7fffu); }
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
    return emu_bf16_op(emu_double_to_float_odd(emu_fma_odd(float(a), float(b), float(c))));
}
inline __nv_bfloat16 __hmax(__nv_bfloat16 a, __nv_bfloat16 b) { return emu_bf16_op(fmaxf(float(a), float(b))); }
inline __nv_bfloat16 __hmin(__nv_bfloat16 a, __nv_bfloat16 b) { return emu_bf16_op(fminf(float(a), float(b))); }
inline bool __hisnan(__nv_bfloat16 a) { return (a.__x & 0x7fffu) > 0x7f80u; }
inline bool __heq(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) == float(b); }
inline bool __hlt(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) < float(b); }
inline bool __hgt(__nv_bfloat16 a, __nv_bfloat16 b) { return float(a) > float(b); }

inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) { return {__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) { return {__hsub(a.x, b.x), __hsub(a.y, b.y)}; }
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) { return {__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
    return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}

inline __nv_bfloat16 operator+(__nv_bfloat16 a, __nv_bfloat16 b) { return __hadd(a, b); }
inline __nv_bfloat16 operator-(__nv_bfloat16 a, __nv_bfloat16 b) { return __hsub(a, b); }
inline __nv_bfloat16 operator*(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmul(a, b); }
inline __nv_bfloat16 operator/(__nv_bfloat16 a, __nv_bfloat16 b) { return __hdiv(a, b); }
inline __nv_bfloat16 operator-(__nv_bfloat16 a) { return __hneg(a); }
inline __nv_bfloat16& operator+=(__nv_bfloat16& a, __nv_bfloat16 b) { return a = __hadd(a, b); }
inline __nv_bfloat16& operator*=(__nv_bfloat16& a, __nv_bfloat16 b) { return a = __hmul(a, b); }
inline bool operator==(__nv_bfloat16 a, __nv_bfloat16 b) { return __heq(a, b); }
inline bool operator<(__nv_bfloat16 a, __nv_bfloat16 b) { return __hlt(a, b); }
inline bool operator>(__nv_bfloat16 a, __nv_bfloat16 b) { return __hgt(a, b); }
inline __nv_bfloat162 operator+(__nv_bfloat162 a, __nv_bfloat162 b) { return __hadd2(a, b); }
inline __nv_bfloat162 operator*(__nv_bfloat162 a, __nv_bfloat162 b) { return __hmul2(a, b); }

// kernel parameters of these types: the loader checks arrays against the name (ml_dtypes.bfloat16)
template <> struct emu_type<__nv_bfloat16> { static constexpr const char* name = "__nv_bfloat16"; };
