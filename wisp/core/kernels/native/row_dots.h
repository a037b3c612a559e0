// The dot products of weight rows with one x row, in the native kernel's fixed order (cpu_experts.cpp calls
// block_dot for kBlock rows at a time). Every sum over k runs in 16 lanes and is folded pairwise (8, 4, 2, 1) at the
// end: plain weights' lane l takes columns l, l + 16, ...; a quantized format's groups of columns that share a scale
// are summed apart, then scaled (block_dot says how, format by format). Nothing here depends on the SIMD width: GCC
// lowers the 16-lane and 8-lane vector types lane by lane alike, and the build does not contract into FMAs. An
// AVX512-BF16 CPU sums Q4_K on bfloat16 x with one instruction a lane pair, to the same bits (bf16_pairs).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "k_quant_formats.h"
#include "weight_formats.h"

// CPUs with AVX512-BF16 (Zen 4, Sapphire Rapids) sum a lane's two products of a Q4_K sub-block with one instruction
// (vdpbf16ps), where x is bfloat16 (bf16_pairs): the same sums, so the same bits, as the loop every build runs
#if defined(__AVX512BF16__) && defined(WISP_AVX512_WIDEN)
#define WISP_BF16_DOTS 1
#endif

namespace wisp_cpu {
namespace {  // one translation unit includes it (cpu_experts.cpp): its own copies, called directly

inline Lanes load_float(const float* x) {
  Lanes value;
  std::memcpy(&value, x, sizeof(value));
  return value;
}

template <class Vector>
inline float fold(Vector acc) {  // n lanes: lanes (l, l + half) summed, half = n / 2, ..., 1 (16 lanes or 8)
  constexpr int64_t n = sizeof(Vector) / sizeof(float);
  float lanes[n];
  std::memcpy(lanes, &acc, sizeof(lanes));
  for (int64_t half = n / 2; half > 0; half /= 2)
    for (int64_t l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  return lanes[0];
}

// The sum of x over each sub-block of 32 columns of each row of xs [rows, depth] (what a k-quant's mins multiply):
// its two 16-lane halves added, then folded (8, 4, 2, 1). [rows, depth / 32]
inline std::vector<float> sub_block_sums(const float* xs, int64_t rows, int64_t depth) {
  std::vector<float> sums(size_t(rows * (depth / 32)));
  for (int64_t i = 0; i < rows * (depth / 32); ++i) sums[size_t(i)] = fold(load_float(xs + 32 * i) + load_float(xs + 32 * i + kLanes));
  return sums;
}

// xs [rows, depth] with each group of 32 columns as its 16 even columns, then its 16 odd ones (MXFP4's pairs of codes
// in a byte: Mxfp4::code_pair)
inline std::vector<float> paired_columns(const float* xs, int64_t rows, int64_t depth) {
  std::vector<float> out(size_t(rows * depth));
  for (int64_t i = 0; i < rows * depth; i += 32)
    for (int64_t l = 0; l < kLanes; ++l) {
      out[size_t(i + l)] = xs[i + 2 * l];
      out[size_t(i + kLanes + l)] = xs[i + 2 * l + 1];
    }
  return out;
}

// x rows [rows, depth] as bfloat16 pairs for block_dot's Q4_K sums: in each group of 32 columns, element 2l is column l
// and 2l + 1 column l + 16 (lane l's two products, as the loop pairs them). Only where every value of every row is a
// bfloat16 (low 16 bits zero), finite, and 0 or at least 2^-100 in magnitude; otherwise, and in builds without
// AVX512-BF16, empty. Then each product of a 4-bit code and x is exact and a multiple of 2^-107, so a lane's sum of
// two is 0 or a normal float: vdpbf16ps, which rounds to nearest even and flushes subnormals, rounds it as the loop's
// one addition does. (Its -0 for two -0 products, where the loop gets -0 too or +0, is lost in acc as any -0 is.)
inline std::vector<uint16_t> bf16_pairs(const float* xs, int64_t rows, int64_t depth) {
  std::vector<uint16_t> out;
#ifdef WISP_BF16_DOTS
  const int64_t n = rows * depth;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, xs + i, sizeof(bits));
    const uint32_t magnitude = bits & 0x7FFFFFFFu;
    if ((bits & 0xFFFFu) != 0 || magnitude >= 0x7F800000u || (magnitude != 0 && magnitude < 0x0D800000u)) return out;
  }
  out.resize(size_t(n));
  for (int64_t i = 0; i < n; i += 32)
    for (int64_t l = 0; l < kLanes; ++l) {
      uint32_t a, b;
      std::memcpy(&a, xs + i + l, sizeof(a));
      std::memcpy(&b, xs + i + kLanes + l, sizeof(b));
      out[size_t(i + 2 * l)] = uint16_t(a >> 16), out[size_t(i + 2 * l + 1)] = uint16_t(b >> 16);
    }
#else
  (void)xs, (void)rows, (void)depth;
#endif
  return out;
}

#ifdef WISP_BF16_DOTS
// Q4_K sub-blocks 2m and 2m + 1 from their 32 code bytes (`bytes`), each summed against its 32 columns of x's
// bf16_pairs (`x_low`, `x_high`): lane l of each sum is its code l's product plus its code l + 16's.
inline void q4_k_pair_sums(const uint8_t* bytes, const uint16_t* x_low, const uint16_t* x_high, Lanes& low,
                           Lanes& high) {
  alignas(64) static const uint16_t kPairs[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                  8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  alignas(64) static const uint16_t kValues[32] = {0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
                                                   0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
  const __m512i pairs = _mm512_load_si512(kPairs), values = _mm512_load_si512(kValues);  // bf16 of 0..15
  const __m512i codes = _mm512_permutexvar_epi16(pairs, _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)bytes)));
  const __m512bh lo = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(codes, _mm512_set1_epi16(15)), values);
  const __m512bh hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 4), values);
  low = (Lanes)_mm512_dpbf16_ps(_mm512_setzero_ps(), lo, (__m512bh)_mm512_loadu_si512(x_low));
  high = (Lanes)_mm512_dpbf16_ps(_mm512_setzero_ps(), hi, (__m512bh)_mm512_loadu_si512(x_high));
}
#endif

// What block_dot reads of x, laid out once a call from rows xs [rows, depth] for format F: each row (MXFP4: its
// paired_columns), a k-quant's sub-block sums (sub_block_sums; else null) and Q4_K's bf16_pairs (where they apply;
// else null), row m's by row(m), sums(m) and pairs(m).
template <class F>
class XRows {
 public:
  XRows(const float* xs, int64_t rows, int64_t depth) : xs_(xs), depth_(depth) {
    if constexpr (F::kGroup != 0) {
      if constexpr (F::kSuper != 0 && F::kMin) sums_ = sub_block_sums(xs, rows, depth);
      if constexpr (F::kSuper != 0 && F::kPairs) {
        if constexpr (!F::kFifths) pairs_ = bf16_pairs(xs, rows, depth);
      }
      if constexpr (F::kSuper == 0 && F::kPairs) paired_ = paired_columns(xs, rows, depth);
    }
  }
  const float* row(int64_t m) const { return (paired_.empty() ? xs_ : paired_.data()) + m * depth_; }
  const float* sums(int64_t m) const { return sums_.empty() ? nullptr : sums_.data() + m * (depth_ / 32); }
  const uint16_t* pairs(int64_t m) const { return pairs_.empty() ? nullptr : pairs_.data() + m * depth_; }

 private:
  const float* xs_;
  int64_t depth_;
  std::vector<float> sums_, paired_;
  std::vector<uint16_t> pairs_;
};

// Count outputs for one x row: weight rows row, row + stride, ... streamed at once, their sums in registers. A
// quantized format's sum runs group by group: each group's products of codes (exact values) and x summed in the 16
// lanes (the first product, then each next one added), then times the group's scale, then added to the running sum
// (acc += partial * scale). Starting a group's sum from its first product rather than from +0 changes no bit of an
// output: only a -0 product differs (+0 + -0 is +0), and acc, which starts at +0, never becomes -0 either way.
// A k-quant with mins (Q4_K, Q5_K) also keeps, in 8 lanes (lane j: sub-block j of a super-block), the mins times
// the sub-blocks' sums of x (`x_sums`, from sub_block_sums) added super-block by super-block, and subtracts that,
// folded (4, 2, 1), from the folded sum: out = fold(acc) - fold(min_acc).
// Q4_K with `x_pairs` (bf16_pairs' of the same row; else null) sums each lane's two products in one instruction.
// Not inlined into its caller: there, with the caller's values live, GCC kept the sums in memory (bf16 10% slower).
template <class F, int64_t Count>
__attribute__((noinline)) void block_dot(const Matrix& w, int64_t row, int64_t stride, const float* x,
                                         const float* x_sums, int64_t depth, float* out,
                                         const uint16_t* x_pairs = nullptr) {
  Lanes acc[Count] = {};
  if constexpr (F::kGroup == 0) {
    for (int64_t k = 0; k < depth; k += kLanes) {
      const Lanes xs = load_float(x + k);
      for (int64_t r = 0; r < Count; ++r) acc[r] += F::load(w, row + r * stride, k, depth) * xs;
    }
    for (int64_t r = 0; r < Count; ++r) out[r * stride] = fold(acc[r]);
  } else if constexpr (F::kSuper == 0 && F::kPairs) {  // MXFP4: a group's even columns, then its odd ones
    static_assert(F::kGroup == 2 * kLanes, "a pair of 16 lanes a group");
    for (int64_t group = 0; group < depth; group += F::kGroup) {
      const Lanes x_even = load_float(x + group), x_odd = load_float(x + group + kLanes);
      for (int64_t r = 0; r < Count; ++r) {
        Lanes even, odd;
        F::code_pair(w, row + r * stride, group, depth, even, odd);
        Lanes part = even * x_even;
        part += odd * x_odd;
        acc[r] += part * F::scale(w, row + r * stride, group, depth);
      }
    }
    for (int64_t r = 0; r < Count; ++r) out[r * stride] = fold(acc[r]);
  } else if constexpr (F::kSuper == 0) {
    for (int64_t group = 0; group < depth; group += F::kGroup) {
      const int64_t end = std::min(group + F::kGroup, depth);
      Lanes part[Count];
      const Lanes xs = load_float(x + group);
      for (int64_t r = 0; r < Count; ++r) part[r] = F::codes(w, row + r * stride, group, depth) * xs;
      for (int64_t k = group + kLanes; k < end; k += kLanes) {
        const Lanes xk = load_float(x + k);
        for (int64_t r = 0; r < Count; ++r) part[r] += F::codes(w, row + r * stride, k, depth) * xk;
      }
      for (int64_t r = 0; r < Count; ++r) acc[r] += part[r] * F::scale(w, row + r * stride, group, depth);
    }
    for (int64_t r = 0; r < Count; ++r) out[r * stride] = fold(acc[r]);
  } else {  // the k-quants: each super-block's factors read once a row, then its groups as above
    constexpr int64_t kGroups = F::kSuper / F::kGroup, kSteps = F::kGroup / kLanes;
    float scales[Count][kGroups];
    Eights min_acc[Count] = {};
    for (int64_t super = 0; super < depth; super += F::kSuper) {
      if constexpr (F::kMin) {
        Eights x_sum;
        std::memcpy(&x_sum, x_sums + super / 32, sizeof(x_sum));
        for (int64_t r = 0; r < Count; ++r) {
          Eights mins;
          F::factors(w, row + r * stride, super, depth, scales[r], mins);
          min_acc[r] += mins * x_sum;
        }
      } else {
        for (int64_t r = 0; r < Count; ++r) F::factors(w, row + r * stride, super, depth, scales[r]);
      }
      if constexpr (F::kPairs) {  // Q4_K, Q5_K: a row's super-block at once (Q5_K: its fifth bits loaded once),
        // sub-blocks 2m and 2m + 1 from one load of their code bytes
        static_assert(kSteps == 2, "two 16-lane steps a sub-block");
        for (int64_t r = 0; r < Count; ++r) {
          const uint8_t* block = F::block_of(w, row + r * stride, super, depth);
#ifdef WISP_BF16_DOTS
          if constexpr (!F::kFifths) {
            if (x_pairs != nullptr) {
              for (int64_t g = 0; g < kGroups; g += 2) {
                const int64_t k0 = super + g * F::kGroup;
                Lanes low, high;
                q4_k_pair_sums(block + 16 * g, x_pairs + k0, x_pairs + k0 + F::kGroup, low, high);
                acc[r] += low * scales[r][g];
                acc[r] += high * scales[r][g + 1];
              }
              continue;
            }
          }
#endif
          Bytes fifth[2] = {};
          if constexpr (F::kFifths) fifth[0] = F::fifth_bits(block, 0), fifth[1] = F::fifth_bits(block, kLanes);
          for (int64_t g = 0; g < kGroups; g += 2) {
            const int64_t k0 = super + g * F::kGroup;
            Lanes low, high, a, b;
            F::code_pair(block, fifth[0], k0, low, high);
            F::code_pair(block, fifth[1], k0 + kLanes, a, b);
            low *= load_float(x + k0);
            high *= load_float(x + k0 + F::kGroup);
            low += a * load_float(x + k0 + kLanes);
            high += b * load_float(x + k0 + F::kGroup + kLanes);
            acc[r] += low * scales[r][g];
            acc[r] += high * scales[r][g + 1];
          }
        }
      } else {  // Q6_K: a half's 8 sub-blocks of 16 from its 6 loads, each one product, then scaled, in order
        static_assert(F::kGroup == kLanes, "a sub-block of 16 lanes");
        for (int64_t half = super; half < super + F::kSuper; half += 8 * kLanes) {
          Lanes xs[8];
          for (int64_t i = 0; i < 8; ++i) xs[i] = load_float(x + half + i * kLanes);
          const int64_t g0 = (half - super) / kLanes;
          for (int64_t r = 0; r < Count; ++r) {
            Lanes codes[8];
            F::half_codes(w, row + r * stride, half, depth, codes);
            for (int64_t i = 0; i < 8; ++i) acc[r] += (codes[i] * xs[i]) * scales[r][g0 + i];
          }
        }
      }
    }
    for (int64_t r = 0; r < Count; ++r) out[r * stride] = F::kMin ? fold(acc[r]) - fold(min_acc[r]) : fold(acc[r]);
  }
}

}  // namespace
}  // namespace wisp_cpu
