// Weight formats as hybrid's native CPU kernel reads them (cpu_experts.cpp): 16 weights of a row at a time, plain
// bf16 widened to float32, or a quantized format's codes widened to their exact float32 values (FP8 e4m3fn, MXFP4's
// e2m1, Q8_0's int8) beside the float32 scale of their group of columns (wisp.core.kernels.quantized_weights; the
// k-quants: k_quant_formats.h). Exact conversions only, so the same values on every CPU and SIMD width (FP8's NaN
// codes excepted: see fp8_values).
#pragma once

// x86-64 widens bytes with SSE/AVX intrinsics where the build's -march has them; elsewhere (or with
// WISP_GENERIC_WIDEN, which the tests build to compare) plain loops give the same values.
#if defined(__x86_64__) && !defined(WISP_GENERIC_WIDEN)
#include <immintrin.h>
#define WISP_X86_WIDEN 1
#if defined(__AVX512F__)
#define WISP_AVX512_WIDEN 1
#endif
#endif

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

namespace wisp_cpu {

constexpr int64_t kLanes = 16;

// 16 lanes as one value: GCC lowers it to one AVX-512 register or two AVX2 ones, lane by lane alike
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef uint16_t Halves __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef uint32_t Words __attribute__((vector_size(kLanes * sizeof(uint32_t))));
typedef int32_t Ints __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline Lanes as_lanes(Words w) {
  Lanes v;
  std::memcpy(&v, &w, sizeof(v));
  return v;
}

inline Words as_words(Lanes v) {
  Words w;
  std::memcpy(&w, &v, sizeof(w));
  return w;
}

inline float float_of_bits(uint32_t bits) {  // the float32 with these bits
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline float bf16_value(uint16_t h) { return float_of_bits(uint32_t(h) << 16); }  // exact: the top 16 bits

inline Lanes load_bf16(const uint16_t* w) {  // 16 bf16 weights widened to float32 (exact: the top 16 bits)
#ifdef WISP_AVX512_WIDEN  // one load and one widening (GCC's generic lowering takes five instructions)
  return (Lanes)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)w)), 16));
#else
  Halves h;
  std::memcpy(&h, w, sizeof(h));
  return as_lanes(__builtin_convertvector(h, Words) << 16);
#endif
}

// 16 bytes from p zero-extended to 32-bit lanes (GCC's generic conversion of a byte vector goes byte by byte)
#ifdef WISP_X86_WIDEN
inline Words widen_bytes(__m128i b) {
#if defined(__AVX512F__)
  return (Words)_mm512_cvtepu8_epi32(b);
#elif defined(__AVX2__)
  const __m256i lo = _mm256_cvtepu8_epi32(b), hi = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
  Words w;
  std::memcpy(&w, &lo, sizeof(lo));
  std::memcpy(reinterpret_cast<char*>(&w) + sizeof(lo), &hi, sizeof(hi));
  return w;
#else
  uint8_t bytes[kLanes];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(bytes), b);
  Words w;
  for (int64_t l = 0; l < kLanes; ++l) w[l] = bytes[l];
  return w;
#endif
}

inline Words widen_bytes(const uint8_t* p) { return widen_bytes(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#else
inline Words widen_bytes(const uint8_t* p) {
  Words w;
  for (int64_t l = 0; l < kLanes; ++l) w[l] = p[l];
  return w;
}
#endif

// 16 float8_e4m3fn codes -> their float32 values times 2^-8, exactly (the reader's scale carries the 2^8: a power
// of two moves no bit of a product or sum that stays within float32's normals); bit 7 the sign. The two NaN codes
// (0x7F, 0xFF) read as +-1.875 (480 x 2^-8): a bank that holds them is not the kernel's to read (`fp8_nan_codes`
// finds them once, at load), which spares three vector operations of each 16 weights their check.
#if defined(WISP_X86_WIDEN) && defined(__F16C__) && defined(__AVX2__)
// Through float16, whose conversion to float32 is one instruction: the code sign-extended to 16 bits and moved up 7
// bits puts its sign at bit 15 (and 14, cleared) and its exponent and mantissa in a float16's same fields (a subnormal
// code a subnormal float16) with a bias 8 larger: its value times 2^-8, exactly. Four instructions for 16 weights.
inline Lanes fp8_values(const uint8_t* codes) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
  const __m256i half = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7), _mm256_set1_epi16(int16_t(0xBF80)));
#if defined(__AVX512F__)
  return (Lanes)_mm512_cvtph_ps(half);
#else
  Lanes value;
  const __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(half)), hi = _mm256_cvtph_ps(_mm256_extracti128_si256(half, 1));
  std::memcpy(&value, &lo, sizeof(lo));
  std::memcpy(reinterpret_cast<char*>(&value) + sizeof(lo), &hi, sizeof(hi));
  return value;
#endif
}
#else
// The exponent field e and 3 mantissa bits moved into float32's fields with the bias moved from 7 to 127 + 8; a
// subnormal (e = 0) as 2^-14 (1 + m/8) - 2^-14 = 2^-14 m/8: the float16 route's values, bit for bit.
inline Lanes fp8_values(const uint8_t* codes) {
  const Words c = widen_bytes(codes);
  const Words subnormal = (Words)((c & 0x78u) == 0u);
  const Words bits = ((c & 0x7Fu) << 20) + (112u << 23) + (subnormal & (1u << 23));
  const Words value = as_words(as_lanes(bits) - as_lanes(subnormal & 0x38800000u));  // 0x38800000: 2^-14
  return as_lanes(value | ((c & 0x80u) << 24));
}
#endif

// Whether any of n FP8 codes is a NaN (0x7F, 0xFF): byte arithmetic the compiler vectorizes, at memory speed
inline bool any_fp8_nan(const uint8_t* codes, int64_t n) {
  uint8_t seen = 0;
  for (int64_t i = 0; i < n; ++i) seen |= uint8_t((codes[i] & 0x7Fu) + 1u);  // bit 7 set for 0x7F alone
  return (seen & 0x80u) != 0;
}

// 16 e2m1 codes, each in the low 4 bits of its lane (the bits above are ignored) -> their float32 values, exactly:
// with AVX-512 a lookup in the 16 values (one permute, which reads only the index's low 4 bits); otherwise built from
// the bits: magnitude codes 0 and 1 are 0 and 0.5; 2-7 (1, 1.5, 2, 3, 4, 6) have exponent (m >> 1) - 1 and mantissa
// bit m & 1; bit 3 the sign
inline Lanes e2m1_values(Words codes) {
#ifdef WISP_AVX512_WIDEN
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  return (Lanes)_mm512_permutexvar_ps((__m512i)codes, table);
#else
  const Words c = codes & 0xFu, m = c & 7u;
  const Words small = (Words)(m < 2u);
  const Words normal = (((m >> 1) + 126u) << 23) | ((m & 1u) << 22);
  return as_lanes((normal & ~small) | (small & (m * 0x3F000000u)) | ((c & 8u) << 28));  // 0x3F000000: 0.5
#endif
}

// 16 int8 codes -> their float32 values (exact)
inline Lanes int8_values(const uint8_t* codes) {
#if defined(WISP_AVX512_WIDEN)  // sign-extended and converted: two instructions
  return (Lanes)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
#else
  const Words bytes = widen_bytes(codes);
  const Words sign = (Words)((bytes & 0x80u) == 0x80u);
  return __builtin_convertvector((Ints)(bytes | (sign & 0xFFFFFF00u)), Lanes);
#endif
}

inline float power_of_two(uint8_t e) {  // e8m0: 2^(e - 127) as torch's pow(2, e - 127): e = 0 subnormal, 255 inf
  return float_of_bits(e == 0 ? 0x00400000u : uint32_t(e) << 23);
}

// One weight matrix [N, K] as its bank keeps it: the codes (bf16 values for plain weights) and their scales.
struct Matrix {
  const uint8_t* codes;
  const uint8_t* scales;
};

// A weight format: its codes' bytes a row; for plain weights (kGroup 0) `load`, the 16 weights of row `row` from
// column k (a multiple of 16) as float32; for quantized ones `codes`, the 16 codes' exact values there, and `scale`,
// the float32 factor of the kGroup columns from k (a multiple of kGroup) of that row (the kernel multiplies a
// group's partial sums by it, not each weight). The k-quants (kSuper 256: k_quant_formats.h) give instead, once a
// super-block of a row, `factors`: each of its groups' scale and, where kMin, min, the float32 the group's values
// are offset by (value = scale * code - min: the kernel subtracts min times the group's sum of x).
struct Bf16 {
  static constexpr int64_t kGroup = 0;
  static int64_t row_bytes(int64_t depth) { return 2 * depth; }
  static Lanes load(const Matrix& w, int64_t row, int64_t k, int64_t depth) {
    return load_bf16(reinterpret_cast<const uint16_t*>(w.codes) + row * depth + k);
  }
};

struct Fp8 {  // codes float8_e4m3fn [N, K] (no NaN: `fp8_values`), scales float32 [ceil(N / 128), ceil(K / 128)]
  static constexpr int64_t kGroup = 128;
  static constexpr bool kMin = false, kPairs = false;
  static constexpr int64_t kSuper = 0;
  static int64_t row_bytes(int64_t depth) { return depth; }
  static Lanes codes(const Matrix& w, int64_t row, int64_t k, int64_t depth) {
    return fp8_values(w.codes + row * depth + k);
  }
  static float scale(const Matrix& w, int64_t row, int64_t k, int64_t depth) {
    return 256.0f * reinterpret_cast<const float*>(w.scales)[(row >> 7) * ((depth + 127) >> 7) + (k >> 7)];
  }
};

// codes uint8 [N, K / 32, 16] (two a byte: element 2j in byte j's low nibble, 2j + 1 in its high one), scales e8m0
// [N, K / 32]. A group's 16 bytes are read at once (kPairs), its even elements' values as one 16 lanes and its odd
// ones' as another: the kernel multiplies them by x's even and odd columns of the group (`paired_columns`).
struct Mxfp4 {
  static constexpr int64_t kGroup = 32;
  static constexpr bool kMin = false, kPairs = true;
  static constexpr int64_t kSuper = 0;
  static int64_t row_bytes(int64_t depth) { return depth / 2; }
  static void code_pair(const Matrix& w, int64_t row, int64_t k, int64_t depth, Lanes& even, Lanes& odd) {
    const Words bytes = widen_bytes(w.codes + row * (depth >> 1) + (k >> 1));
    even = e2m1_values(bytes);
    odd = e2m1_values(bytes >> 4u);
  }
  static float scale(const Matrix& w, int64_t row, int64_t k, int64_t depth) {
    return power_of_two(w.scales[row * (depth >> 5) + (k >> 5)]);
  }
};

struct Q8_0 {  // codes int8 [N, K], scales float16 [N, K / 32]
  static constexpr int64_t kGroup = 32;
  static constexpr bool kMin = false, kPairs = false;
  static constexpr int64_t kSuper = 0;
  static int64_t row_bytes(int64_t depth) { return depth; }
  static Lanes codes(const Matrix& w, int64_t row, int64_t k, int64_t depth) {
    return int8_values(w.codes + row * depth + k);
  }
  static float scale(const Matrix& w, int64_t row, int64_t k, int64_t depth) {
    return c10::detail::fp16_ieee_to_fp32_value(reinterpret_cast<const uint16_t*>(w.scales)[row * (depth >> 5) + (k >> 5)]);
  }
};

// Every format a reader here or in k_quant_formats.h reads (checked_weights.h dispatches on it)
enum class Format { kBf16, kFp8, kMxfp4, kQ8_0, kQ4_K, kQ5_K, kQ6_K };

}  // namespace wisp_cpu
