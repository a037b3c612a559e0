// Prints every code's widened value in each format of weight_formats.h and k_quant_formats.h, as hex bits, and the
// k-quants' factors, for test_weight_formats_builds.py to compare builds (SIMD widths, intrinsics or the generic loops).
#include "k_quant_formats.h"
#include "weight_formats.h"

#include <cstdio>

using namespace wisp_cpu;

void dump(const char* name, const float* values, int n) {
  for (int i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], 4);
    std::printf("%s %08x\n", name, bits);
  }
}

template <class F>
void dump_codes(const char* name, const Matrix& w) {  // every column's code value of a k-quant, in column order
  float values[256];
  for (int64_t k = 0; k < 256; k += kLanes) {
    if constexpr (F::kPairs) {  // the kernel reads sub-blocks 2m and 2m + 1 together: k in 2m, k + 32 in 2m + 1
      if ((k >> 5) % 2 == 1) continue;
      Lanes low, high;
      const uint8_t* block = F::block_of(w, 0, k, 256);
      F::code_pair(block, F::kFifths ? F::fifth_bits(block, k & 31) : Bytes{}, k, low, high);
      std::memcpy(values + k, &low, sizeof(low));
      std::memcpy(values + k + 32, &high, sizeof(high));
    } else {  // Q6_K: a half's 8 sub-blocks at once
      if (k % 128 != 0) continue;
      Lanes half[8];
      F::half_codes(w, 0, k, 256, half);
      std::memcpy(values + k, half, sizeof(half));
    }
  }
  dump(name, values, 256);
}

int main() {
  uint8_t codes[256 + kLanes];
  for (int i = 0; i < 256 + kLanes; ++i) codes[i] = uint8_t(i);
  float e2m1_all[256];  // bytes 0..127 as MXFP4 pairs: element 2j byte j's low nibble, 2j + 1 its high one
  for (int64_t k = 0; k < 256; k += 32) {
    Lanes even, odd;
    Mxfp4::code_pair(Matrix{codes, nullptr}, 0, k, 256, even, odd);
    for (int l = 0; l < kLanes; ++l) e2m1_all[k + 2 * l] = even[l], e2m1_all[k + 2 * l + 1] = odd[l];
  }
  for (int i = 0; i < 256; i += kLanes) {
    const Lanes fp8 = fp8_values(codes + i), int8 = int8_values(codes + i);
    const float* e2m1 = e2m1_all + i;
    for (int l = 0; l < kLanes; ++l) {
      uint32_t bits[3];
      std::memcpy(&bits[0], &fp8[l], 4);
      std::memcpy(&bits[1], &e2m1[l], 4);
      std::memcpy(&bits[2], &int8[l], 4);
      std::printf("%d %08x %08x %08x\n", i + l, bits[0], bits[1], bits[2]);
    }
  }
  const float scales[] = {power_of_two(0), power_of_two(1), power_of_two(127), power_of_two(254), power_of_two(255)};
  for (float s : scales) {
    uint32_t bits;
    std::memcpy(&bits, &s, 4);
    std::printf("e8m0 %08x\n", bits);
  }
  // the k-quants: one super-block whose code byte i is (7 i + 3) mod 256, every column's code value
  uint8_t block[192], heads[18] = {};
  for (int i = 0; i < 192; ++i) block[i] = uint8_t(7 * i + 3);
  const Matrix w{block, heads};
  dump_codes<Q4_K>("q4_k", w);
  dump_codes<Q5_K>("q5_k", w);
  dump_codes<Q6_K>("q6_k", w);
  // their factors: heads of bytes (11 i + 5) mod 256 after d = dmin = 0.1 (float16 0x2E66; Q6_K's d after its scales)
  for (int i = 0; i < 18; ++i) heads[i] = uint8_t(11 * i + 5);
  heads[0] = heads[2] = heads[16] = 0x66;
  heads[1] = heads[3] = heads[17] = 0x2E;
  float factors[16];
  Eights mins;
  Q4_K::factors(w, 0, 0, 256, factors, mins);
  dump("q4_k_scale", factors, 8);
  dump("q4_k_min", reinterpret_cast<const float*>(&mins), 8);
  Q6_K::factors(w, 0, 0, 256, factors);
  dump("q6_k_scale", factors, 16);
}
