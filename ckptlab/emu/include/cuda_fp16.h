// cuda_fp16.h for ckptlab's CPU emulator: the part of CUDA's half-precision header that the
// kernels use. NVRTC and nvcc use CUDA's own header; the emulator finds this one first
// (build.py puts this folder on g++'s include path). Nothing here is kernel memory: the
// conversions work on values, so the memory hooks see only the kernel's own loads and stores.
//
//   __half          IEEE 754 binary16 (1 sign, 5 exponent, 10 fraction bits) as its 16 bits
//   __half2         two of them (x low, y high), as CUDA lays them out
//   conversions     __float2half (round to nearest even, overflow to inf, subnormals kept),
//                   __half2float (exact), the _rn/_rz forms, ints, raw bits
//   arithmetic      __hadd/__hsub/__hmul/__hdiv/__hneg/__habs/__hfma, comparisons, min/max,
//                   and the operators; each correctly rounded: computed in float, then
//                   rounded once to half. (float has 24 >= 2*11 + 2 bits, so rounding twice
//                   gives the correctly rounded result for + - * /: Figueroa, "When is double
//                   rounding innocuous?", SIGNUM 1995.) __hfma and the conversions from
//                   double round once too: the exact result is rounded to odd in float (no
//                   rounding twice can go wrong from there when float keeps >= 2 more bits than
//                   the target: Boldo & Melquiond, "When double rounding is odd", 2005), then to
//                   nearest even in the 16-bit format.
//
// g++ 12 has _Float16 on x86-64 but g++ 10 (the oldest the emulator supports) does not, and
// bf16 has no host type at all: so both formats are converted here bit by bit, the same way.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

// ---- float <-> binary16 bits ------------------------------------------------------------------
inline unsigned short emu_float_to_half_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const unsigned short sign = static_cast<unsigned short>((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fff;                  // NaN: CUDA's canonical half NaN
    if (a >= 0x477ff000u) return sign | 0x7c00u;         // >= 65520 (halfway past 65504): inf
    if (a < 0x38800000u) {                               // below 2^-14: a subnormal half or 0
        // in units of 2^-24 (the subnormal step); scaling by 2^24 is exact, nearbyintf rounds
        // to nearest even; 1024 units is 2^-14, which the bits then spell as the least normal
        const float units = std::fabs(f) * 16777216.0f;
        return sign | static_cast<unsigned short>(std::nearbyint(units));
    }
    // normal: rebias the exponent (127 -> 15) and round 23 fraction bits to 10, ties to even;
    // a carry out of the fraction moves into the exponent, as it should
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return sign | static_cast<unsigned short>((rounded - (112u << 23)) >> 13);
}

inline float emu_half_bits_to_float(unsigned short h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t bits;
    if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float
        const float v = static_cast<float>(m) * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    if (e == 31) bits = sign | 0x7f800000u | (m << 13);  // inf, NaN
    else bits = sign | ((e + 112u) << 23) | (m << 13);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// ---- one rounding from double: round to odd in float, then to nearest even -------------------
inline float emu_double_to_float_odd(double d) {  // float nearest d toward 0, last bit set if inexact
    if (std::isnan(d)) return static_cast<float>(d);
    float f = static_cast<float>(d);
    if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);  // inf too
    if (static_cast<double>(f) != d) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        u |= 1u;
        std::memcpy(&f, &u, 4);
    }
    return f;
}

inline double emu_fma_odd(double a, double b, double c) {
    // a * b + c rounded to odd in double, for a * b exact in double (16-bit operands): the sum
    // rounded to nearest, its error exactly by Knuth's TwoSum, and a nonzero error makes the
    // result the odd one of its two neighbours
    const double s = a * b, r = s + c;
    if (!std::isfinite(r)) return r;
    const double bb = r - s, err = (s - (r - bb)) + (c - bb);
    uint64_t u;
    std::memcpy(&u, &r, 8);
    if (err != 0 && !(u & 1u)) return std::nextafter(r, err > 0 ? INFINITY : -INFINITY);
    return r;
}

// ---- the types --------------------------------------------------------------------------------
struct __half_raw {
    unsigned short x;
};

struct __align__(2) __half {
    unsigned short __x;
    __half() = default;
    __half(const __half_raw& r) : __x(r.x) {}
    __half(float f) : __x(emu_float_to_half_bits(f)) {}
    __half(double f) : __x(emu_float_to_half_bits(emu_double_to_float_odd(f))) {}
    __half(int i) : __x(emu_float_to_half_bits(static_cast<float>(i))) {}
    __half(unsigned i) : __x(emu_float_to_half_bits(static_cast<float>(i))) {}
    operator float() const { return emu_half_bits_to_float(__x); }
    operator __half_raw() const { return {__x}; }
};

struct __align__(4) __half2 {
    __half x, y;
};
using half = __half;
using half2 = __half2;

inline __half emu_half_from_bits(unsigned short b) {
    __half h;
    h.__x = b;
    return h;
}

// ---- conversions ------------------------------------------------------------------------------
inline __half __float2half(float f) { return emu_half_from_bits(emu_float_to_half_bits(f)); }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline __half __float2half_rz(float f) {  // toward zero: the largest |h| <= |f|
    __half h = __float2half(f);
    // half bit patterns of one sign are ordered like their values: one step down in magnitude
    // (from inf too, to 65504) undoes a round away from zero
    if (std::isfinite(f) && std::fabs(emu_half_bits_to_float(h.__x)) > std::fabs(f)) --h.__x;
    return h;
}
inline float __half2float(__half h) { return emu_half_bits_to_float(h.__x); }
inline __half __double2half(double d) { return __float2half(emu_double_to_float_odd(d)); }
inline __half __int2half_rn(int i) { return __float2half(static_cast<float>(i)); }
inline int __half2int_rz(__half h) { return static_cast<int>(__half2float(h)); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short b) { return emu_half_from_bits(b); }
inline short __half_as_short(__half h) { return static_cast<short>(h.__x); }
inline __half __short_as_half(short b) { return emu_half_from_bits(static_cast<unsigned short>(b)); }

inline __half2 __halves2half2(__half lo, __half hi) { return {lo, hi}; }
inline __half2 make_half2(__half x, __half y) { return {x, y}; }
inline __half2 __floats2half2_rn(float lo, float hi) { return {__float2half(lo), __float2half(hi)}; }
inline __half2 __float2half2_rn(float f) { return {__float2half(f), __float2half(f)}; }
inline __half2 __half2half2(__half h) { return {h, h}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half2 __float22half2_rn(float2 f) { return __floats2half2_rn(f.x, f.y); }

// ---- arithmetic: in float, rounded once (see the header) --------------------------------------
inline __half __hadd(__half a, __half b) { return __float2half(__half2float(a) + __half2float(b)); }
inline __half __hsub(__half a, __half b) { return __float2half(__half2float(a) - __half2float(b)); }
inline __half __hmul(__half a, __half b) { return __float2half(__half2float(a) * __half2float(b)); }
inline __half __hdiv(__half a, __half b) { return __float2half(__half2float(a) / __half2float(b)); }
inline __half __hneg(__half a) { return emu_half_from_bits(a.__x ^ 0x8000u); }
inline __half __habs(__half a) { return emu_half_from_bits(a.__x & 0x7fffu); }
inline __half __hfma(__half a, __half b, __half c) {  // a * b + c rounded once, as CUDA does
    return __float2half(emu_double_to_float_odd(emu_fma_odd(__half2float(a), __half2float(b),
                                                            __half2float(c))));
}
inline __half __hmax(__half a, __half b) { return __float2half(fmaxf(__half2float(a), __half2float(b))); }
inline __half __hmin(__half a, __half b) { return __float2half(fminf(__half2float(a), __half2float(b))); }
inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
inline int __hisinf(__half a) { return (a.__x & 0x7fffu) == 0x7c00u ? (a.__x >> 15 ? -1 : 1) : 0; }
inline bool __heq(__half a, __half b) { return __half2float(a) == __half2float(b); }
inline bool __hne(__half a, __half b) { return __half2float(a) != __half2float(b); }
inline bool __hlt(__half a, __half b) { return __half2float(a) < __half2float(b); }
inline bool __hle(__half a, __half b) { return __half2float(a) <= __half2float(b); }
inline bool __hgt(__half a, __half b) { return __half2float(a) > __half2float(b); }
inline bool __hge(__half a, __half b) { return __half2float(a) >= __half2float(b); }

inline __half2 __hadd2(__half2 a, __half2 b) { return {__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
inline __half2 __hsub2(__half2 a, __half2 b) { return {__hsub(a.x, b.x), __hsub(a.y, b.y)}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
inline __half2 __h2div(__half2 a, __half2 b) { return {__hdiv(a.x, b.x), __hdiv(a.y, b.y)}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
    return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}
inline __half2 __hneg2(__half2 a) { return {__hneg(a.x), __hneg(a.y)}; }

inline __half operator+(__half a, __half b) { return __hadd(a, b); }
inline __half operator-(__half a, __half b) { return __hsub(a, b); }
inline __half operator*(__half a, __half b) { return __hmul(a, b); }
inline __half operator/(__half a, __half b) { return __hdiv(a, b); }
inline __half operator-(__half a) { return __hneg(a); }
inline __half& operator+=(__half& a, __half b) { return a = __hadd(a, b); }
inline __half& operator-=(__half& a, __half b) { return a = __hsub(a, b); }
inline __half& operator*=(__half& a, __half b) { return a = __hmul(a, b); }
inline __half& operator/=(__half& a, __half b) { return a = __hdiv(a, b); }
inline bool operator==(__half a, __half b) { return __heq(a, b); }
inline bool operator!=(__half a, __half b) { return __hne(a, b); }
inline bool operator<(__half a, __half b) { return __hlt(a, b); }
inline bool operator<=(__half a, __half b) { return __hle(a, b); }
inline bool operator>(__half a, __half b) { return __hgt(a, b); }
inline bool operator>=(__half a, __half b) { return __hge(a, b); }
inline __half2 operator+(__half2 a, __half2 b) { return __hadd2(a, b); }
inline __half2 operator-(__half2 a, __half2 b) { return __hsub2(a, b); }
inline __half2 operator*(__half2 a, __half2 b) { return __hmul2(a, b); }
inline __half2 operator/(__half2 a, __half2 b) { return __h2div(a, b); }

// kernel parameters of these types: the loader checks arrays against the name (NumPy float16)
template <> struct emu_type<__half> { static constexpr const char* name = "__half"; };
