// llama.cpp's k-quants as hybrid's native CPU kernel reads them (cpu_experts.cpp), kept packed as codes
// [N, K / 256, C] and heads [N, K / 256, H] (wisp.core.kernels.k_quants). A super-block of 256 columns has float16 d
// (Q4_K / Q5_K: and dmin) in its heads and 6-bit (Q6_K: int8) scales of its sub-blocks; a value is
// (d * scale) * q - dmin * min (Q4_K: q 4 bits; Q5_K: 5) or (d * scale) * (q - 32) (Q6_K: 6 bits).
//
// A reader gives a row's codes as their exact float32 values, 16 columns at a time, and once a super-block of a row
// its `factors`: each sub-block's d * scale and, where kMin, the 8 sub-blocks' dmin * min (cpu_experts.cpp's
// block_dot says the order they are summed in). The codes are cut out of their bytes with byte operations (16 codes
// in one SSE register) before they are widened to 32-bit lanes once; every step is exact, so the values are the same
// on every CPU and SIMD width (test_weight_formats_builds.py compares the builds).
#pragma once

#include "weight_formats.h"

namespace wisp_cpu {

typedef uint8_t Bytes __attribute__((vector_size(kLanes)));      // 16 codes, a byte each
typedef uint64_t Quads __attribute__((vector_size(kLanes)));     // the same 16 bytes as two 64-bit lanes
typedef float Eights __attribute__((vector_size(8 * sizeof(float))));  // a super-block's 8 sub-block factors

inline Bytes load_bytes(const uint8_t* p) {
  Bytes b;
  std::memcpy(&b, p, sizeof(b));
  return b;
}

// b's bytes shifted by n < 8 bits, with the bits that cross from a neighbouring byte left in: callers mask them off
// (x86 has no byte shifts; two 64-bit lanes shift at once)
inline Bytes shifted_right(Bytes b, int n) { return (Bytes)((Quads)b >> uint64_t(n)); }
inline Bytes shifted_left(Bytes b, int n) { return (Bytes)((Quads)b << uint64_t(n)); }

inline float f16_value(const uint8_t* p) {  // the little-endian float16 at p, as float32 (exact)
  return c10::detail::fp16_ieee_to_fp32_value(uint16_t(p[0] | (p[1] << 8)));
}

inline Words widen(Bytes b) {  // zero-extended to 32-bit lanes
#ifdef WISP_X86_WIDEN
  __m128i v;
  std::memcpy(&v, &b, sizeof(v));
  return widen_bytes(v);
#else
  return widen_bytes(reinterpret_cast<const uint8_t*>(&b));
#endif
}

inline Lanes unsigned_values(Bytes b) { return __builtin_convertvector((Ints)widen(b), Lanes); }
inline Lanes signed_values(Bytes b) { return int8_values(reinterpret_cast<const uint8_t*>(&b)); }

// d times each of the 8 bytes of `bytes` (byte j: lane j), each product rounded once
inline Eights times_bytes(float d, uint64_t bytes) {
#if defined(WISP_X86_WIDEN) && defined(__AVX2__)
  const __m256 v = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(bytes)))));
  Eights out;
  std::memcpy(&out, &v, sizeof(out));
  return out;
#else
  Eights out;
  for (int j = 0; j < 8; ++j) out[j] = d * float((bytes >> (8 * j)) & 0xFFu);
  return out;
#endif
}

template <int64_t kCodeBytes>
struct KQuant4Or5 {  // Q4_K (128 code bytes: nibbles) and Q5_K (160: 32 bytes of fifth bits, then the nibbles)
  static constexpr int64_t kGroup = 32, kSuper = 256;
  static constexpr bool kMin = true, kPairs = true, kFifths = kCodeBytes == 160;
  static int64_t row_bytes(int64_t depth) { return depth / 256 * kCodeBytes; }
  static const uint8_t* block_of(const Matrix& w, int64_t row, int64_t k, int64_t depth) {  // k's super-block's codes
    return w.codes + row * row_bytes(depth) + (k >> 8) * kCodeBytes;
  }
  // Q5_K: the fifth bits of the 16 columns from lane0 of every sub-block (a row's super-block loads them once)
  static Bytes fifth_bits(const uint8_t* block, int64_t lane0) { return load_bytes(block + lane0); }
  // Sub-blocks 2m and 2m + 1 share their code bytes (low nibbles, high ones): the 16 columns from k (in sub-block
  // 2m) as `low` and the 16 from k + 32 as `high`, from one load of 16 bytes (Q5_K: and `fifth`, fifth_bits' of k)
  static void code_pair(const uint8_t* block, Bytes fifth, int64_t k, Lanes& low, Lanes& high) {
    const int64_t j = (k & 255) >> 5, lane0 = k & 31;  // j = 2m
    const Bytes bytes = load_bytes(block + (kCodeBytes - 128) + 16 * j + lane0);
    if constexpr (kCodeBytes == 128) {
#ifdef WISP_AVX512_WIDEN  // a lookup in the 16 values 0..15 (one permute) reads only an index's low 4 bits
      const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const Words both = widen(bytes);
      low = (Lanes)_mm512_permutexvar_ps((__m512i)both, values);
      high = (Lanes)_mm512_permutexvar_ps((__m512i)(both >> 4u), values);
      return;
#endif
    }
    Bytes lo = bytes & 0xF, hi = shifted_right(bytes, 4) & 0xF;
    if constexpr (kCodeBytes == 160) {  // bit j of fifth-bit byte l: column l of sub-block j
      lo |= shifted_left(shifted_right(fifth, int(j)) & 1, 4);
      hi |= shifted_left(shifted_right(fifth, int(j + 1)) & 1, 4);
    }
    low = unsigned_values(lo);
    high = unsigned_values(hi);
  }
  // The super-block from column k of row `row`: its 8 sub-blocks' d * scale into `scales` and dmin * min into `mins`.
  // Its 12 bytes of 6-bit values after d and dmin, as three little-endian words a, b, c: scale j < 4 is byte j of a,
  // low 6 bits, and min j of b; scale 4 + j is byte j of c, low nibble, under byte j of a's top 2 bits; min 4 + j
  // is c's high nibble under b's top 2 bits
  static void factors(const Matrix& w, int64_t row, int64_t k, int64_t depth, float* scales, Eights& mins) {
    const uint8_t* h = w.scales + (row * (depth / 256) + (k >> 8)) * 16;
    uint32_t a, b, c;
    std::memcpy(&a, h + 4, 4);
    std::memcpy(&b, h + 8, 4);
    std::memcpy(&c, h + 12, 4);
    const uint64_t scale_bytes = uint64_t(a & 0x3F3F3F3Fu) | uint64_t((c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u)) << 32;
    const uint64_t min_bytes = uint64_t(b & 0x3F3F3F3Fu) | uint64_t(((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u)) << 32;
    const Eights s = times_bytes(f16_value(h), scale_bytes);
    std::memcpy(scales, &s, sizeof(s));
    mins = times_bytes(f16_value(h + 2), min_bytes);
  }
};
using Q4_K = KQuant4Or5<128>;
using Q5_K = KQuant4Or5<160>;

struct Q6_K {  // codes: 128 bytes of low nibbles, then 64 of high bit pairs; heads: 16 int8 scales, then float16 d
  static constexpr int64_t kGroup = 16, kSuper = 256;
  static constexpr bool kMin = false, kPairs = false;
  static int64_t row_bytes(int64_t depth) { return depth / 256 * 192; }
  // The 128 columns from k (a half of a super-block) as 8 sub-blocks of 16, in column order, from 6 loads: column
  // 32 t + 16 j + l (quarter t, lane l) is low-nibble byte 64 half + 32 (t & 1) + 16 j + l, its low nibble for t < 2,
  // its high one above, under bits 2t, 2t + 1 of high byte 128 + 32 half + 16 j + l; the code less 32 fits a byte
  static void half_codes(const Matrix& w, int64_t row, int64_t k, int64_t depth, Lanes* codes) {
    const int64_t half = (k & 255) >> 7;
    const uint8_t* block = w.codes + row * row_bytes(depth) + (k >> 8) * 192;
    for (int64_t j = 0; j < 2; ++j) {
      const Bytes a = load_bytes(block + 64 * half + 16 * j), b = load_bytes(block + 64 * half + 32 + 16 * j);
      const Bytes h = load_bytes(block + 128 + 32 * half + 16 * j);
      codes[j] = signed_values((Bytes)(((a & 0xF) | (shifted_left(h, 4) & 0x30)) - 32));
      codes[2 + j] = signed_values((Bytes)(((b & 0xF) | (shifted_left(h, 2) & 0x30)) - 32));
      codes[4 + j] = signed_values((Bytes)(((shifted_right(a, 4) & 0xF) | (h & 0x30)) - 32));
      codes[6 + j] = signed_values((Bytes)(((shifted_right(b, 4) & 0xF) | (shifted_right(h, 2) & 0x30)) - 32));
    }
  }
  // The super-block's 16 sub-blocks of 16: d * scale (sub-block 8 half + 2 t + j of `half_codes`)
  static void factors(const Matrix& w, int64_t row, int64_t k, int64_t depth, float* scales) {
    const uint8_t* h = w.scales + (row * (depth / 256) + (k >> 8)) * 18;
    const Lanes values = int8_values(h) * f16_value(h + 16);
    std::memcpy(scales, &values, sizeof(values));
  }
};

}  // namespace wisp_cpu
