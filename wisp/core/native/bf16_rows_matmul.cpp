// out[m, n] = sum_k x[m, k] * w[n, k]: float32 rows x [M, K] against bf16 weights w [N, K], float32 out [M, N],
// for groups of rows each against its own w (a layer's CPU experts).
// Hybrid mode's CPU expert kernel (wisp.core.cpu_expert_kernels). At a decode step's few rows it is bound by
// reading w, so it reads each weight once for all M rows, kBlock weight rows at a time (independent streams
// and sums in registers). The kBlock rows of a block lie in kBlock different 4 KB pages wherever a row is
// shorter than a page: rows n, n + P, n + 2P, ... with P rows to a page, the block's P passes covering the
// P x kBlock rows between. The CPU's L2 prefetcher follows one stream a page; two rows of one page read
// side by side defeat it. Measured on the H200's 16-core host (one row against 4 OLMoE experts at once):
// OLMoE's down [2048, 1024] read at 61 GB/s with 4 adjacent rows a block and 108 page-strided with 8,
// its gate_up [2048, 2048] 102 against 123, Qwen3-30B-A3B's down [2048, 768] 53 against 129; a software
// prefetch only slowed it. Threads come from ATen's pool (at::parallel_for; the library links the OpenMP
// runtime torch loaded), the same team as torch's own CPU kernels; they claim the work a few blocks at a
// time rather than in fixed shares. Each sum over k runs in 16 lanes (lane l takes k = l mod 16) folded
// pairwise (8, 4, 2, 1) at the end, compiled without contraction into FMAs: the bits are the same on every
// x86 CPU whatever its SIMD width, and whichever rows share a block (an output is one row's sum alone).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#define WISP_AVX512_WIDEN 1
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kLanes = 16, kClaim = 4, kPage = 4096;  // kClaim blocks a claim
#ifdef __AVX512F__
constexpr int64_t kBlock = 8;  // 8 sums of 16 lanes: 8 of the 32 vector registers
#else
constexpr int64_t kBlock = 4;  // 16 lanes are two registers of 8 here: 8 sums would spill
#endif

// 16 lanes as one value: GCC lowers it to one AVX-512 register or two AVX2 ones, lane by lane alike
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef uint16_t Halves __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef uint32_t Words __attribute__((vector_size(kLanes * sizeof(uint32_t))));

inline Lanes load_bf16(const uint16_t* w) {  // 16 bf16 weights widened to float32 (exact: the top 16 bits)
#ifdef WISP_AVX512_WIDEN  // one load and one widening (GCC's generic lowering takes five instructions)
  return (Lanes)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)w)), 16));
#else
  Halves h;
  std::memcpy(&h, w, sizeof(h));
  Words words = __builtin_convertvector(h, Words) << 16;
  Lanes value;
  std::memcpy(&value, &words, sizeof(value));
  return value;
#endif
}

inline Lanes load_float(const float* x) {
  Lanes value;
  std::memcpy(&value, x, sizeof(value));
  return value;
}

inline float fold(Lanes acc) {  // lanes (l, l + half) summed, half = 8, 4, 2, 1
  float lanes[kLanes];
  std::memcpy(lanes, &acc, sizeof(lanes));
  for (int64_t half = kLanes / 2; half > 0; half /= 2)
    for (int64_t l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  return lanes[0];
}

// Count rows of out for one x row: weight rows w, w + stride rows, ... streamed at once, their sums in registers
template <int64_t Count>
inline void block_dot(const uint16_t* w, int64_t stride, const float* x, int64_t depth, float* out) {
  Lanes acc[Count] = {};
  for (int64_t k = 0; k < depth; k += kLanes) {
    const Lanes xs = load_float(x + k);
    for (int64_t r = 0; r < Count; ++r) acc[r] += load_bf16(w + r * stride * depth + k) * xs;
  }
  for (int64_t r = 0; r < Count; ++r) out[r * stride] = fold(acc[r]);
}

// rows [n, n + count) of out one at a time (the last rows of a matrix whose row count is no multiple of a span)
inline void rows_dot(const uint16_t* w, const float* x, int64_t depth, int64_t count, float* out) {
  for (int64_t r = 0; r < count; ++r) block_dot<1>(w + r * depth, 1, x, depth, out + r);
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
  // an item: a span of P x kBlock rows (P passes of kBlock page-strided rows), or a matrix's last rows
  const int64_t per_page = std::max<int64_t>(1, kPage / (depth * int64_t(sizeof(uint16_t))));
  const int64_t span = per_page * kBlock, spans = n_out / span, rest = n_out - spans * span;
  const int64_t per_matrix = spans + (rest > 0), items = per_matrix * int64_t(ws.size());
  // Each thread of the team claims kClaim items at a time until none are left: a thread the OS delays, or
  // one sharing its core with the CUDA driver, holds up only its last claim, not a fixed share of the work.
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    for (int64_t begin; (begin = next.fetch_add(kClaim, std::memory_order_relaxed)) < items;) {
      for (int64_t item = begin; item < std::min(begin + kClaim, items); ++item) {
        const int64_t e = item / per_matrix, n = (item % per_matrix) * span;
        const uint16_t* w = weights[e] + n * depth;
        for (int64_t m = offsets[e]; m < offsets[e + 1]; ++m) {
          float* o = outs + m * n_out + n;
          if (n + span > n_out) {
            rows_dot(w, xs + m * depth, depth, rest, o);
            continue;
          }
          for (int64_t pass = 0; pass < per_page; ++pass)
            block_dot<kBlock>(w + pass * depth, per_page, xs + m * depth, depth, o + pass);
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(wisp_cpu, m) { m.def("bf16_grouped_rows_matmul(Tensor x, Tensor[] ws, int[] offsets) -> Tensor"); }
TORCH_LIBRARY_IMPL(wisp_cpu, CPU, m) { m.impl("bf16_grouped_rows_matmul", &bf16_grouped_rows_matmul); }
