// Prints every code's widened value in each format of weight_formats.h, as hex bits, for
// test_weight_formats_builds.py to compare builds (SIMD widths, intrinsics or the generic loops).
#include "weight_formats.h"

#include <cstdio>

using namespace wisp_cpu;

template <class F>
void dump_codes(const char* name, const Matrix& w) {
  for (int64_t k = 0; k < 256; k += kLanes) {
    const Lanes values = F::codes(w, 0, k, 256);
    for (int l = 0; l < kLanes; ++l) {
      uint32_t bits;
      std::memcpy(&bits, &values[l], 4);
      std::printf("%s %08x\n", name, bits);
    }
  }
}

int main() {
  uint8_t codes[256 + kLanes];
  for (int i = 0; i < 256 + kLanes; ++i) codes[i] = uint8_t(i);
  for (int i = 0; i < 256; i += kLanes) {
    const Lanes fp8 = fp8_values(codes + i), e2m1 = e2m1_values(codes + i / 2), int8 = int8_values(codes + i);
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
}
