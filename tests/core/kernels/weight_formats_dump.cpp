// Prints every code's widened value in each format of weight_formats.h, as hex bits, for
// test_weight_formats_builds.py to compare builds (SIMD widths, intrinsics or the generic loops).
#include "weight_formats.h"

#include <cstdio>

using namespace wisp_cpu;

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
}
