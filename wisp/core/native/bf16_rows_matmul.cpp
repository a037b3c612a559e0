// out[m, n] = sum_k x[m, k] * w[n, k]: float32 rows x [M, K] against bf16 weights w [N, K], float32 out [M, N],
// for groups of rows each against its own w (a layer's CPU experts).
// Hybrid mode's CPU expert kernel (wisp.core.cpu_expert_kernels). At a decode step's few rows it is bound by
// reading w, so it reads each weight once for all M rows, kBlock weight rows at a time (independent
// streams and sums: on the H200's 16-core host 4 rows read an OLMoE expert at 71 GB/s, one row at 56,
// torch's bf16 GEMV at 44; a software prefetch only slowed it). Threads come from ATen's pool
// (at::parallel_for; the library links the OpenMP runtime torch loaded), the same team as torch's own
// CPU kernels; they claim the work a few blocks at a time rather than in fixed shares. Each sum over k runs in 16 lanes (lane l takes k = l mod 16) folded pairwise (8, 4, 2, 1)
// at the end, compiled without contraction into FMAs: the bits are the same on every x86 CPU whatever its
// SIMD width.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kLanes = 16, kBlock = 4, kClaim = 4;  // kClaim blocks of kBlock weight rows a claim

inline float bf16_to_float(uint16_t bits) {
  uint32_t word = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

inline float fold(float* acc) {
  for (int64_t half = kLanes / 2; half > 0; half /= 2)
    for (int64_t l = 0; l < half; ++l) acc[l] += acc[l + half];
  return acc[0];
}

// rows [n, n + count) of out, count <= kBlock, for one x row
inline void block_dot(const uint16_t* w, const float* x, int64_t depth, int64_t count, float* out) {
  float acc[kBlock][kLanes] = {};
  for (int64_t k = 0; k < depth; k += kLanes) {
    for (int64_t r = 0; r < count; ++r) {
      const uint16_t* wr = w + r * depth + k;
      for (int64_t l = 0; l < kLanes; ++l) acc[r][l] += bf16_to_float(wr[l]) * x[k + l];
    }
  }
  for (int64_t r = 0; r < count; ++r) out[r] = fold(acc[r]);
}

// Expert e's rows x[offsets[e] : offsets[e + 1]] against its weights ws[e] [N, K], all in one parallel
// region (one wake-up of the team for a layer's CPU experts, not one per expert and GEMV).
at::Tensor bf16_grouped_rows_matmul(const at::Tensor& x, at::TensorList ws, at::IntArrayRef offsets) {
  TORCH_CHECK(!ws.empty() && offsets.size() == ws.size() + 1, "one weight per group, offsets [groups + 1]");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "float32 x [M, K] expected");
  const int64_t n_out = ws[0].size(0), depth = ws[0].size(1);
  TORCH_CHECK(x.size(1) == depth && depth % kLanes == 0, "x [M, K], K a multiple of 16");
  TORCH_CHECK(offsets[0] == 0 && offsets.back() == x.size(0), "offsets must run from 0 to M");
  std::vector<const uint16_t*> weights;
  for (size_t e = 0; e < ws.size(); ++e) {
    const at::Tensor& w = ws[e];
    TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.is_contiguous() && w.dim() == 2 && w.size(0) == n_out &&
                w.size(1) == depth, "every w: contiguous bfloat16 [N, K], the same shape");
    TORCH_CHECK(offsets[e] <= offsets[e + 1], "offsets must not decrease");
    weights.push_back(reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()));
  }
  at::Tensor out = at::empty({x.size(0), n_out}, x.options());
  const float* xs = x.data_ptr<float>();
  float* outs = out.data_ptr<float>();
  const int64_t blocks = (n_out + kBlock - 1) / kBlock, items = blocks * int64_t(ws.size());
  // Each thread of the team claims kClaim items at a time until none are left: a thread the OS delays, or
  // one sharing its core with the CUDA driver, holds up only its last claim, not a fixed share of the work.
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    float tile[kBlock];
    for (int64_t begin; (begin = next.fetch_add(kClaim, std::memory_order_relaxed)) < items;) {
      for (int64_t item = begin; item < std::min(begin + kClaim, items); ++item) {
        const int64_t e = item / blocks, n = (item % blocks) * kBlock, count = std::min(kBlock, n_out - n);
        for (int64_t m = offsets[e]; m < offsets[e + 1]; ++m) {
          block_dot(weights[e] + n * depth, xs + m * depth, depth, count, tile);
          for (int64_t r = 0; r < count; ++r) outs[m * n_out + n + r] = tile[r];
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(wisp_cpu, m) { m.def("bf16_grouped_rows_matmul(Tensor x, Tensor[] ws, int[] offsets) -> Tensor"); }
TORCH_LIBRARY_IMPL(wisp_cpu, CPU, m) { m.impl("bf16_grouped_rows_matmul", &bf16_grouped_rows_matmul); }
