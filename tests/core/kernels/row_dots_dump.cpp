// Prints, as hex bits, the native kernel's dot products (row_dots.h's block_dot) of 8 weight rows of every format
// with one x row, 8 rows a call and one row a call, for test_row_dots_builds.py to compare builds (SIMD widths,
// intrinsics or the generic loops): the order is the code's, so the bits must not depend on the build. Q4_K runs twice,
// on float32 x and on bfloat16 x (which an AVX512-BF16 build sums with vdpbf16ps: bf16_pairs); the lines "pairs ..."
// say which x rows bf16_pairs takes (in such a build; none elsewhere).
#include "row_dots.h"

#include <cmath>
#include <cstdio>
#include <vector>

using namespace wisp_cpu;

constexpr int64_t kDepth = 512, kRows = 8;

struct Random {  // a fixed linear congruential sequence: the same data in every build
  uint64_t state = 12345;
  uint32_t next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(state >> 33);
  }
  uint8_t byte() { return uint8_t(next()); }
  float unit() { return float(next() % 2000001) / 1000000.0f - 1.0f; }  // in [-1, 1]
};

template <class F>
void dump_dots(const char* name, const Matrix& w, const float* x) {
  const XRows<F> rows(x, 1, kDepth);  // as grouped_rows lays x out once a call
  float together[kRows], alone[kRows];
  block_dot<F, kRows>(w, 0, 1, rows.row(0), rows.sums(0), kDepth, together, rows.pairs(0));
  for (int64_t r = 0; r < kRows; ++r) block_dot<F, 1>(w, r, 1, rows.row(0), rows.sums(0), kDepth, alone + r, rows.pairs(0));
  for (int64_t r = 0; r < kRows; ++r) {
    uint32_t a, b;
    std::memcpy(&a, &together[r], 4);
    std::memcpy(&b, &alone[r], 4);
    std::printf("%s %lld %08x %08x\n", name, static_cast<long long>(r), a, b);
  }
}

int main() {
  Random random;
  std::vector<float> x(kDepth);
  for (float& v : x) v = random.unit();
  std::vector<uint8_t> codes(kRows * kDepth * 2), scales(kRows * kDepth);
  const auto fill = [&](int64_t n, uint8_t mask) { for (int64_t i = 0; i < n; ++i) codes[i] = random.byte() & mask; };
  const Matrix w{codes.data(), scales.data()};

  for (int64_t i = 0; i < kRows * kDepth; ++i) {  // bf16 weights in [-2, 2]
    const float v = 2.0f * random.unit();
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    codes[2 * i] = uint8_t(bits >> 16), codes[2 * i + 1] = uint8_t(bits >> 24);
  }
  dump_dots<Bf16>("bf16", w, x.data());

  fill(kRows * kDepth, 0xFF);  // FP8 codes without the NaNs, float32 block scales
  for (int64_t i = 0; i < kRows * kDepth; ++i) codes[i] = (codes[i] & 0x7F) == 0x7F ? 0x7E : codes[i];
  const float fp8_scales[] = {0.75f, -1.5f, 0.3f, 2.0f};
  std::memcpy(scales.data(), fp8_scales, sizeof(fp8_scales));
  dump_dots<Fp8>("fp8", w, x.data());

  fill(kRows * kDepth / 2, 0xFF);  // MXFP4: e8m0 scales 120..135
  for (int64_t i = 0; i < kRows * kDepth / 32; ++i) scales[i] = uint8_t(120 + random.next() % 16);
  dump_dots<Mxfp4>("mxfp4", w, x.data());

  fill(kRows * kDepth, 0xFF);  // Q8_0: float16 scales from 0x2000 to 0x3FFF (about 0.008 to 2)
  for (int64_t i = 0; i < kRows * kDepth / 32; ++i) {
    const uint16_t h = uint16_t(0x2000 + random.next() % 0x2000);
    scales[2 * i] = uint8_t(h), scales[2 * i + 1] = uint8_t(h >> 8);
  }
  dump_dots<Q8_0>("q8_0", w, x.data());

  const auto k_quant_heads = [&](int64_t bytes, int64_t d_at) {  // random scale bytes, d (and dmin) 0x2000..0x2FFF
    for (int64_t i = 0; i < kRows * kDepth / 256 * bytes; ++i) scales[i] = random.byte();
    for (int64_t b = 0; b < kRows * kDepth / 256; ++b)
      for (int64_t at : {d_at, d_at == 0 ? int64_t(2) : d_at}) {
        const uint16_t h = uint16_t(0x2000 + random.next() % 0x1000);
        scales[b * bytes + at] = uint8_t(h), scales[b * bytes + at + 1] = uint8_t(h >> 8);
      }
  };
  fill(kRows * kDepth / 256 * 128, 0xFF);
  k_quant_heads(16, 0);
  dump_dots<Q4_K>("q4_k", w, x.data());
  std::vector<float> bf16_x(x);  // x rounded down to bfloat16 (its low 16 bits cleared)
  for (float& v : bf16_x) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits &= 0xFFFF0000u;
    std::memcpy(&v, &bits, 4);
  }
  dump_dots<Q4_K>("q4_k_bf16_x", w, bf16_x.data());
  const auto taken = [&](float value) {  // does bf16_pairs take x with one value replaced?
    std::vector<float> probe(bf16_x);
    probe[77] = value;
    return int(!bf16_pairs(probe.data(), 1, kDepth).empty());
  };
  std::printf("pairs %d %d %d %d %d %d\n", taken(0.0f), taken(-0.0f), taken(std::ldexp(1.0f, -100)),
              taken(std::ldexp(1.0f, -101)), taken(1.0f + std::ldexp(1.0f, -10)), taken(INFINITY));
  fill(kRows * kDepth / 256 * 160, 0xFF);
  k_quant_heads(16, 0);
  dump_dots<Q5_K>("q5_k", w, x.data());
  fill(kRows * kDepth / 256 * 192, 0xFF);
  k_quant_heads(18, 16);
  dump_dots<Q6_K>("q6_k", w, x.data());
}
