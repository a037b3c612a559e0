// out[m, n] = sum_k x[m, k] * w[n, k]: float32 rows x [M, K] against bf16 weights w [N, K], float32 out [M, N],
// for groups of rows each against its own w (a layer's CPU experts).
// Hybrid mode's CPU expert kernel (wisp.core.kernels.cpu_expert_kernels). At a decode step's few rows it is bound by
// reading w, so it reads each weight once for all M rows, kBlock weight rows at a time (independent streams
// and sums in registers). The kBlock rows of a block lie in kBlock different 4 KB pages wherever a row is
// shorter than a page: rows n, n + P, n + 2P, ... with P rows to a page, the block's P passes covering the
// P x kBlock rows between. The CPU's L2 prefetcher follows one stream a page; two rows of one page read
// side by side defeat it (the measurements: docs/decisions/cpu-kernel-reads-rows-a-page-apart.md).
// Threads come from ATen's pool (at::parallel_for; the library links the OpenMP
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
#include <cmath>
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

// Group e's rows x[offsets[e] : offsets[e + 1]] [., depth] against its weights weights[e] [n_out, depth] into
// out's same rows [., n_out], in one parallel region (one wake-up of the team for all groups).
void grouped_rows(const float* xs, const std::vector<const uint16_t*>& weights, const std::vector<int64_t>& offsets,
                  int64_t n_out, int64_t depth, float* outs) {
  // an item: a span of P x kBlock rows (P passes of kBlock page-strided rows), or a matrix's last rows
  const int64_t per_page = std::max<int64_t>(1, kPage / (depth * int64_t(sizeof(uint16_t))));
  const int64_t span = per_page * kBlock, spans = n_out / span, rest = n_out - spans * span;
  const int64_t per_matrix = spans + (rest > 0), items = per_matrix * int64_t(weights.size());
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
}

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
  const uint32_t bits = uint32_t(int32_t(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// a [M, inter] = silu(h[:, :inter]) * h[:, inter:], silu(g) = g / (1 + exp(-g)), from h [M, 2 inter]
void silu_mul(const float* h, int64_t rows, int64_t inter, float* a) {
  at::parallel_for(0, rows * inter, 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = i / inter, j = i - m * inter;
      const float g = h[m * 2 * inter + j], u = h[m * 2 * inter + inter + j];
      a[i] = g / (1.0f + exp_fixed(-g)) * u;
    }
  });
}

// A SiLU-gated expert per group, on its rows: out = (silu(x W_gate^T) * (x W_up^T)) W_down^T in float32, gate_up
// [2I, D] (gate rows first), down [D, I]; both GEMVs in one parallel region each, the activation between.
void experts_mlp(const float* xs, int64_t rows, const std::vector<const uint16_t*>& gate_ups,
                 const std::vector<const uint16_t*>& downs, const std::vector<int64_t>& offsets, int64_t hidden,
                 int64_t inter, float* outs) {
  std::vector<float> h(size_t(rows * 2 * inter)), a(size_t(rows * inter));
  grouped_rows(xs, gate_ups, offsets, 2 * inter, hidden, h.data());
  silu_mul(h.data(), rows, inter, a.data());
  grouped_rows(a.data(), downs, offsets, hidden, inter, outs);
}

at::Tensor silu_mul_op(const at::Tensor& h) {  // h [M, 2I] float32 -> [M, I] (tests read the activation alone)
  TORCH_CHECK(h.dim() == 2 && h.scalar_type() == at::kFloat && h.is_contiguous() && h.size(1) % 2 == 0,
              "float32 h [M, 2I] expected");
  at::Tensor a = at::empty({h.size(0), h.size(1) / 2}, h.options());
  silu_mul(h.data_ptr<float>(), h.size(0), h.size(1) / 2, a.data_ptr<float>());
  return a;
}

std::vector<const uint16_t*> bf16_pointers(at::TensorList ws, int64_t n_out, int64_t depth) {
  std::vector<const uint16_t*> weights;
  for (const at::Tensor& w : ws) {
    TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.is_contiguous() && w.dim() == 2 && w.size(0) == n_out &&
                w.size(1) == depth, "every weight: contiguous bfloat16 [N, K], the same shape");
    weights.push_back(reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()));
  }
  return weights;
}

std::vector<int64_t> checked_offsets(at::IntArrayRef offsets, size_t groups, int64_t rows) {
  TORCH_CHECK(groups > 0 && offsets.size() == groups + 1, "one weight per group, offsets [groups + 1]");
  TORCH_CHECK(offsets[0] == 0 && offsets.back() == rows, "offsets must run from 0 to M");
  for (size_t e = 0; e < groups; ++e) TORCH_CHECK(offsets[e] <= offsets[e + 1], "offsets must not decrease");
  return offsets.vec();
}

void check_expert_widths(int64_t hidden, int64_t inter) {  // what the kernels' 16 lanes read whole
  TORCH_CHECK(hidden > 0 && inter > 0 && hidden % kLanes == 0 && inter % kLanes == 0, "D and I positive multiples of 16");
}

at::Tensor bf16_grouped_rows_matmul(const at::Tensor& x, at::TensorList ws, at::IntArrayRef offsets) {
  TORCH_CHECK(!ws.empty(), "one weight per group");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "float32 x [M, K] expected");
  const int64_t n_out = ws[0].size(0), depth = ws[0].size(1);
  TORCH_CHECK(x.size(1) == depth && depth > 0 && depth % kLanes == 0, "x [M, K], K a positive multiple of 16");
  const std::vector<int64_t> bounds = checked_offsets(offsets, ws.size(), x.size(0));
  at::Tensor out = at::empty({x.size(0), n_out}, x.options());
  grouped_rows(x.data_ptr<float>(), bf16_pointers(ws, n_out, depth), bounds, n_out, depth, out.data_ptr<float>());
  return out;
}

at::Tensor bf16_experts_mlp(const at::Tensor& x, at::TensorList gate_ups, at::TensorList downs,
                            at::IntArrayRef offsets) {
  TORCH_CHECK(!gate_ups.empty() && gate_ups.size() == downs.size(), "a gate_up and a down per group");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "float32 x [M, D] expected");
  const int64_t hidden = x.size(1), inter = downs[0].size(1);
  check_expert_widths(hidden, inter);
  const std::vector<int64_t> bounds = checked_offsets(offsets, gate_ups.size(), x.size(0));
  at::Tensor out = at::empty({x.size(0), hidden}, x.options());
  experts_mlp(x.data_ptr<float>(), x.size(0), bf16_pointers(gate_ups, 2 * inter, hidden),
              bf16_pointers(downs, hidden, inter), bounds, hidden, inter, out.data_ptr<float>());
  return out;
}

// Hybrid's rank share on the host (wisp.core.experts.rank_share): of the routing ids [B, K], the pairs of rank k < n are
// the CPU's; each such pair (b, k) gets rows[b, k] = expert ids[b, k]'s SiLU-gated MLP of hidden[b] (bf16 [B, D]
// widened exactly), from the banks gate_up [N, 2I, D] and down [N, D, I]; the other rows are left as they are.
// The experts are taken in ascending id, each with its pairs in token order, exactly as bf16_experts_mlp is
// given them by the eager step. An id of -1 is a pair another server computes (a hot expert's, held on the
// device): skipped, and not counted as routed. Returns {distinct experts the CPU computed, distinct experts routed}.
std::vector<int64_t> rank_share_rows(const at::Tensor& ids, int64_t cpu_ranks, const at::Tensor& hidden_rows,
                                     const at::Tensor& gate_up_bank, const at::Tensor& down_bank, const at::Tensor& rows) {
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong && ids.is_contiguous(), "int64 ids [B, K] expected");
  const int64_t batch = ids.size(0), top_k = ids.size(1), experts = gate_up_bank.size(0);
  const int64_t hidden = gate_up_bank.size(2), inter = down_bank.size(2);
  TORCH_CHECK(hidden_rows.scalar_type() == at::kBFloat16 && hidden_rows.is_contiguous() &&
              hidden_rows.sizes() == at::IntArrayRef({batch, hidden}), "bfloat16 hidden [B, D] expected");
  TORCH_CHECK(gate_up_bank.scalar_type() == at::kBFloat16 && gate_up_bank.is_contiguous() &&
              gate_up_bank.size(1) == 2 * inter && down_bank.scalar_type() == at::kBFloat16 &&
              down_bank.is_contiguous() && down_bank.sizes() == at::IntArrayRef({experts, hidden, inter}),
              "banks: contiguous bfloat16 gate_up [N, 2I, D] and down [N, D, I]");
  TORCH_CHECK(rows.scalar_type() == at::kFloat && rows.is_contiguous() &&
              rows.sizes() == at::IntArrayRef({batch, top_k, hidden}), "float32 rows [B, K, D] expected");
  check_expert_widths(hidden, inter);
  TORCH_CHECK(0 <= cpu_ranks && cpu_ranks <= top_k, "cpu_ranks within 0..K");
  const int64_t* id = ids.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> pairs_of(size_t(experts) + 1);
  std::vector<bool> routed(size_t(experts) + 1, false);
  for (int64_t pair = 0; pair < batch * top_k; ++pair) {
    if (id[pair] == -1) continue;
    TORCH_CHECK(0 <= id[pair] && id[pair] < experts, "expert id out of range");
    routed[id[pair]] = true;
    if (pair % top_k < cpu_ranks) pairs_of[id[pair]].push_back(pair);
  }
  std::vector<const uint16_t*> gate_ups, downs;
  std::vector<int64_t> offsets{0}, order;
  const uint16_t* gu = reinterpret_cast<const uint16_t*>(gate_up_bank.data_ptr<at::BFloat16>());
  const uint16_t* dn = reinterpret_cast<const uint16_t*>(down_bank.data_ptr<at::BFloat16>());
  for (int64_t e = 0; e < experts; ++e) {
    if (pairs_of[e].empty()) continue;
    gate_ups.push_back(gu + e * 2 * inter * hidden);
    downs.push_back(dn + e * hidden * inter);
    order.insert(order.end(), pairs_of[e].begin(), pairs_of[e].end());
    offsets.push_back(int64_t(order.size()));
  }
  const int64_t routed_count = std::count(routed.begin(), routed.end(), true);
  if (order.empty()) return {0, routed_count};
  const int64_t m = int64_t(order.size());
  std::vector<float> xs(size_t(m * hidden)), outs(size_t(m * hidden));
  const uint16_t* hid = reinterpret_cast<const uint16_t*>(hidden_rows.data_ptr<at::BFloat16>());
  for (int64_t i = 0; i < m; ++i)  // bf16 -> float32: the top 16 bits, exact
    for (int64_t d = 0; d < hidden; ++d) {
      const uint32_t bits = uint32_t(hid[(order[i] / top_k) * hidden + d]) << 16;
      std::memcpy(&xs[size_t(i * hidden + d)], &bits, sizeof(float));
    }
  experts_mlp(xs.data(), m, gate_ups, downs, offsets, hidden, inter, outs.data());
  float* out = rows.data_ptr<float>();
  for (int64_t i = 0; i < m; ++i)
    std::memcpy(out + order[i] * hidden, &outs[size_t(i * hidden)], size_t(hidden) * sizeof(float));
  return {int64_t(gate_ups.size()), routed_count};
}

}  // namespace

TORCH_LIBRARY(wisp_cpu, m) {
  m.def("bf16_grouped_rows_matmul(Tensor x, Tensor[] ws, int[] offsets) -> Tensor");
  m.def("bf16_experts_mlp(Tensor x, Tensor[] gate_ups, Tensor[] downs, int[] offsets) -> Tensor");
  m.def("silu_mul(Tensor h) -> Tensor");
  m.def("rank_share_rows(Tensor ids, int cpu_ranks, Tensor hidden, Tensor gate_up_bank, Tensor down_bank, "
        "Tensor(a!) rows) -> int[]");
}
TORCH_LIBRARY_IMPL(wisp_cpu, CPU, m) {
  m.impl("bf16_grouped_rows_matmul", &bf16_grouped_rows_matmul);
  m.impl("bf16_experts_mlp", &bf16_experts_mlp);
  m.impl("silu_mul", &silu_mul_op);
  m.impl("rank_share_rows", &rank_share_rows);
}
