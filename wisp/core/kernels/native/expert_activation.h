// The arithmetic between an expert's two GEMVs in hybrid's native CPU kernel (cpu_experts.cpp): a fixed exp, the
// gated activations (wisp.core.kernels.expert_extras.Activation) and the biases, each a fixed sequence of float32
// operations (compiled without contraction into FMAs), so the same bits on every CPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "weight_formats.h"

namespace wisp_cpu {

// exp(x) in float32 operations only, in a fixed order (no library call, no FMA): x = k ln2 + r with ln2 in two
// parts (Cody-Waite), exp(r) by its Taylor polynomial of degree 7 (|r| <= ln2 / 2: within 2 ulp), times 2^k;
// inf above 88 (float32's largest is e^88.7), 0 below -87 (2^k would leave the normal floats).
inline float exp_fixed(float x) {
  if (!(x == x)) return x;  // NaN
  if (x > 88.0f) return INFINITY;
  if (x < -87.0f) return 0.0f;
  const float k = std::nearbyint(x * 1.44269504f);
  const float r = (x - k * 0.693145752f) - k * 1.42860677e-6f;
  float p = 1.98412698e-4f;  // 1/7!
  p = p * r + 1.38888889e-3f;
  p = p * r + 8.33333333e-3f;
  p = p * r + 4.16666667e-2f;
  p = p * r + 1.66666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * float_of_bits(uint32_t(int32_t(k) + 127) << 23);
}

// The gated activation between an expert's GEMVs (wisp.core.kernels.expert_extras.Activation): SiLU's
// silu(g) * u = g / (1 + exp(-g)) * u, or GPT-OSS's clamped SwiGLU: g = min(g, limit), u = clamp(u, -limit, limit),
// (u + 1) * (g / (1 + exp(-(g * alpha)))); NaN stays NaN through the clamps.
struct Gating {
  bool clamped_swiglu = false;
  float alpha = 0.0f, limit = 0.0f;
};

inline float gated(float g, float u, const Gating& gating) {
  if (!gating.clamped_swiglu) return g / (1.0f + exp_fixed(-g)) * u;
  g = std::min(g, gating.limit);  // (limit < NaN) is false: NaN kept
  u = std::max(std::min(u, gating.limit), -gating.limit);
  return (u + 1.0f) * (g / (1.0f + exp_fixed(-(g * gating.alpha))));
}

// A bias vector as a bank keeps it (bf16 or float32; null: none), read as float32 (exact)
struct Bias {
  const void* data = nullptr;
  bool bf16 = false;
  float at(int64_t j) const {
    return bf16 ? bf16_value(static_cast<const uint16_t*>(data)[j]) : static_cast<const float*>(data)[j];
  }
};

// rows[m, :] += group e's bias, for each group's rows (float32 adds after the GEMV's sums, as torch's path adds them)
inline void add_biases(float* rows, const std::vector<Bias>& biases, const std::vector<int64_t>& offsets, int64_t width) {
  if (biases.empty()) return;
  for (size_t e = 0; e < biases.size(); ++e)
    for (int64_t m = offsets[e]; m < offsets[e + 1]; ++m)
      for (int64_t j = 0; j < width; ++j) rows[m * width + j] += biases[e].at(j);
}

}  // namespace wisp_cpu
