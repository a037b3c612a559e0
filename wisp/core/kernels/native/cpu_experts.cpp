// out[m, n] = sum_k x[m, k] * w[n, k]: float32 rows x [M, K] against a weight w [N, K] as its bank keeps it (bf16,
// or FP8 / MXFP4 / Q8_0 / k-quant codes beside their scales: weight_formats.h, k_quant_formats.h), float32 out
// [M, N], for groups of rows each
// against its own w (a layer's CPU experts). Hybrid mode's CPU expert kernel (wisp.core.kernels.cpu_expert_kernels).
// A quantized weight is read packed (1 byte a weight for FP8, 17/32 for MXFP4, 17/16 for Q8_0, not bf16's 2): its
// codes widened to their exact values in registers, and each group of columns sharing a scale summed apart, then
// scaled (row_dots.h's block_dot): the exact dequantized weights' products, regrouped, with no rounding of the
// weights.
//
// At a decode step's few rows it is bound by reading w, so it reads each weight once for all M rows, kBlock weight
// rows at a time (independent streams and sums in registers). The kBlock rows of a block lie in kBlock different
// 4 KB pages wherever a row's codes are shorter than a page: rows n, n + P, n + 2P, ... with P rows to a page, the
// block's P passes covering the P x kBlock rows between. The CPU's L2 prefetcher follows one stream a page; two rows
// of one page read side by side defeat it (docs/decisions/cpu-kernel-reads-rows-a-page-apart.md).
// Threads come from ATen's pool (at::parallel_for; the library links the OpenMP runtime torch loaded), the same team
// as torch's own CPU kernels; they claim the work a few blocks at a time rather than in fixed shares. Each output is
// one row's sum alone, in row_dots.h's fixed order, compiled without contraction into FMAs: the bits are the same on
// every x86 CPU whatever its SIMD width, whatever the thread count, and whichever rows share a block.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>

#include "checked_weights.h"
#include "expert_activation.h"
#include "row_dots.h"
#include "weight_formats.h"

namespace {

using namespace wisp_cpu;

constexpr int64_t kClaim = 4, kPage = 4096;  // kClaim blocks a claim
#ifdef __AVX512F__
constexpr int64_t kBlock = 8;  // 8 sums of 16 lanes: 8 of the 32 vector registers
#else
constexpr int64_t kBlock = 4;  // 16 lanes are two registers of 8 here: 8 sums would spill
#endif

// Group e's rows x[offsets[e] : offsets[e + 1]] [., depth] against its weights weights[e] [n_out, depth] into
// out's same rows [., n_out], in one parallel region (one wake-up of the team for all groups).
template <class F>
void grouped_rows(const float* xs, const std::vector<Matrix>& weights, const std::vector<int64_t>& offsets,
                  int64_t n_out, int64_t depth, float* outs) {
  // an item: a span of P x kBlock rows (P passes of kBlock page-strided rows), or a matrix's last rows
  const int64_t per_page = std::max<int64_t>(1, kPage / F::row_bytes(depth));
  const int64_t span = per_page * kBlock, spans = n_out / span, rest = n_out - spans * span;
  const int64_t per_matrix = spans + (rest > 0), items = per_matrix * int64_t(weights.size());
  // Each thread of the team claims kClaim items at a time until none are left: a thread the OS delays, or
  // one sharing its core with the CUDA driver, holds up only its last claim, not a fixed share of the work.
  const XRows<F> x(xs, offsets.back(), depth);  // what block_dot reads of x, laid out once a call
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    for (int64_t begin; (begin = next.fetch_add(kClaim, std::memory_order_relaxed)) < items;) {
      for (int64_t item = begin; item < std::min(begin + kClaim, items); ++item) {
        const int64_t e = item / per_matrix, n = (item % per_matrix) * span;
        for (int64_t m = offsets[e]; m < offsets[e + 1]; ++m) {
          float* o = outs + m * n_out + n;
          if (n + span > n_out) {  // the matrix's last rows, one at a time
            for (int64_t r = 0; r < rest; ++r)
              block_dot<F, 1>(weights[e], n + r, 1, x.row(m), x.sums(m), depth, o + r, x.pairs(m));
            continue;
          }
          for (int64_t pass = 0; pass < per_page; ++pass)
            block_dot<F, kBlock>(weights[e], n + pass, per_page, x.row(m), x.sums(m), depth, o + pass, x.pairs(m));
        }
      }
    }
  });
}

// Activation.kind, alpha and limit as the native activation (expert_activation.h) takes them
Gating gating_of(c10::string_view kind, double alpha, double limit) {
  TORCH_CHECK(kind == "silu" || kind == "clamped_swiglu", "activation silu or clamped_swiglu; got ", kind);
  return Gating{kind == "clamped_swiglu", float(alpha), float(limit)};
}

// a [M, inter] = the activation of h[:, :inter] (gate) and h[:, inter:] (up), from h [M, 2 inter]
void gate_mul(const float* h, int64_t rows, int64_t inter, const Gating& gating, float* a) {
  at::parallel_for(0, rows * inter, 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = i / inter, j = i - m * inter;
      a[i] = gated(h[m * 2 * inter + j], h[m * 2 * inter + inter + j], gating);
    }
  });
}

// A gated expert per group, on its rows: out = act(x W_gate_up^T + b_gate_up) W_down^T + b_down in float32, gate_up
// [2I, D] (gate rows first), down [D, I], biases [2I] and [D] where given (none: empty); both GEMVs in one parallel
// region each, the biases and the activation between.
template <class G, class D>  // gate_up's format, down's
void experts_mlp(const float* xs, int64_t rows, const std::vector<Matrix>& gate_ups, const std::vector<Matrix>& downs,
                 const std::vector<Bias>& gate_up_biases, const std::vector<Bias>& down_biases,
                 const std::vector<int64_t>& offsets, int64_t hidden, int64_t inter, const Gating& gating, float* outs) {
  std::vector<float> h(size_t(rows * 2 * inter)), a(size_t(rows * inter));
  grouped_rows<G>(xs, gate_ups, offsets, 2 * inter, hidden, h.data());
  add_biases(h.data(), gate_up_biases, offsets, 2 * inter);
  gate_mul(h.data(), rows, inter, gating, a.data());
  grouped_rows<D>(a.data(), downs, offsets, hidden, inter, outs);
  add_biases(outs, down_biases, offsets, hidden);
}

// h [M, 2I] float32 -> [M, I] (tests read the activation alone)
at::Tensor gate_mul_op(const at::Tensor& h, c10::string_view activation, double alpha, double limit) {
  TORCH_CHECK(h.dim() == 2 && h.scalar_type() == at::kFloat && h.is_contiguous() && h.size(1) % 2 == 0,
              "float32 h [M, 2I] expected");
  at::Tensor a = at::empty({h.size(0), h.size(1) / 2}, h.options());
  gate_mul(h.data_ptr<float>(), h.size(0), h.size(1) / 2, gating_of(activation, alpha, limit), a.data_ptr<float>());
  return a;
}

// A bias of `width` values (bf16 or float32, contiguous), or none for an undefined tensor
Bias checked_bias(const at::Tensor& bias, int64_t width) {
  if (!bias.defined()) return Bias{};
  TORCH_CHECK((bias.scalar_type() == at::kBFloat16 || bias.scalar_type() == at::kFloat) && bias.is_contiguous() &&
              bias.numel() == width, "a bias: contiguous bfloat16 or float32 [", width, "]; got ", bias.scalar_type(),
              " ", bias.sizes());
  return Bias{bias.data_ptr(), bias.scalar_type() == at::kBFloat16};
}

std::vector<Bias> checked_biases(at::TensorList biases, size_t groups, int64_t width) {
  TORCH_CHECK(biases.empty() || biases.size() == groups, "no biases or one per weight");
  std::vector<Bias> out;
  for (const at::Tensor& b : biases) out.push_back(checked_bias(b, width));
  return out;
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

void check_rows(const at::Tensor& x, int64_t depth) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "float32 x [M, K] expected");
  TORCH_CHECK(x.size(1) == depth, "x [M, K] against weights [N, K]");
}

at::Tensor grouped_rows_matmul(const at::Tensor& x, at::TensorList ws, at::TensorList scales, at::IntArrayRef offsets) {
  const Matrices w = checked_matrices(ws, scales);
  check_rows(x, w.depth);
  const std::vector<int64_t> bounds = checked_offsets(offsets, ws.size(), x.size(0));
  at::Tensor out = at::empty({x.size(0), w.n_out}, x.options());
  with_format(w.format, [&](auto f) {
    grouped_rows<decltype(f)>(x.data_ptr<float>(), w.matrices, bounds, w.n_out, w.depth, out.data_ptr<float>());
  });
  return out;
}

at::Tensor gated_experts_mlp(const at::Tensor& x, at::TensorList gate_ups, at::TensorList gate_up_scales,
                             at::TensorList gate_up_biases, at::TensorList downs, at::TensorList down_scales,
                             at::TensorList down_biases, at::IntArrayRef offsets, c10::string_view activation,
                             double alpha, double limit) {
  TORCH_CHECK(!gate_ups.empty() && gate_ups.size() == downs.size(), "a gate_up and a down per group");
  const Matrices gu = checked_matrices(gate_ups, gate_up_scales), dn = checked_matrices(downs, down_scales);
  check_role_formats(gu.format, dn.format);
  TORCH_CHECK(gu.n_out == 2 * dn.depth && dn.n_out == gu.depth, "gate_up [2I, D] and down [D, I]");
  check_rows(x, gu.depth);
  check_expert_widths(gu.depth, dn.depth);
  const std::vector<int64_t> bounds = checked_offsets(offsets, gate_ups.size(), x.size(0));
  const std::vector<Bias> gu_biases = checked_biases(gate_up_biases, gate_ups.size(), gu.n_out);
  const std::vector<Bias> dn_biases = checked_biases(down_biases, downs.size(), dn.n_out);
  const Gating gating = gating_of(activation, alpha, limit);
  at::Tensor out = at::empty({x.size(0), gu.depth}, x.options());
  with_formats(gu.format, dn.format, [&](auto g, auto d) {
    experts_mlp<decltype(g), decltype(d)>(x.data_ptr<float>(), x.size(0), gu.matrices, dn.matrices, gu_biases,
                                          dn_biases, bounds, gu.depth, dn.depth, gating, out.data_ptr<float>());
  });
  return out;
}

// Expert e's matrix of a bank [N, ...] and its scale bank (undefined for bf16), both contiguous
Matrix bank_matrix(const at::Tensor& bank, const at::Tensor& scales, int64_t e) {
  const uint8_t* codes = static_cast<const uint8_t*>(bank.data_ptr()) + e * bank.stride(0) * bank.element_size();
  const uint8_t* scale = scales.defined()
      ? static_cast<const uint8_t*>(scales.data_ptr()) + e * scales.stride(0) * scales.element_size() : nullptr;
  return Matrix{codes, scale};
}

void check_bias_bank(const at::Tensor& bank, int64_t experts, int64_t width) {  // undefined: no biases
  TORCH_CHECK(!bank.defined() || ((bank.scalar_type() == at::kBFloat16 || bank.scalar_type() == at::kFloat) &&
              bank.is_contiguous() && bank.sizes() == at::IntArrayRef({experts, width})),
              "a bias bank: contiguous bfloat16 or float32 [", experts, ", ", width, "]");
}

// Expert e's bias of a checked bias bank [N, width]
Bias bank_bias(const at::Tensor& bank, int64_t e) {
  return Bias{static_cast<const uint8_t*>(bank.data_ptr()) + e * bank.stride(0) * bank.element_size(),
              bank.scalar_type() == at::kBFloat16};
}

// Hybrid's rank share on the host (wisp.core.experts.rank_share): of the routing ids [B, K], the pairs of rank k < n are
// the CPU's; each such pair (b, k) gets rows[b, k] = expert ids[b, k]'s gated MLP of hidden[b] (bf16 [B, D] widened
// exactly), from the banks gate_up [N, 2I, D] and down [N, D, I] (with their scale banks where quantized, their bias
// banks [N, 2I] and [N, D] where biased); the other rows are left as they are. The experts are taken in ascending id,
// each with its pairs in token order, exactly as gated_experts_mlp is given them by the eager step. An id of -1 is a pair another server computes (a hot
// expert's, held on the device): skipped, and not counted as routed. Returns {distinct experts the CPU computed,
// distinct experts routed}.
std::vector<int64_t> rank_share_rows(const at::Tensor& ids, int64_t cpu_ranks, const at::Tensor& hidden_rows,
                                     const at::Tensor& gate_up_bank, const c10::optional<at::Tensor>& gate_up_scales,
                                     const at::Tensor& down_bank, const c10::optional<at::Tensor>& down_scales,
                                     const c10::optional<at::Tensor>& gate_up_bias, const c10::optional<at::Tensor>& down_bias,
                                     c10::string_view activation, double alpha, double limit, const at::Tensor& rows) {
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong && ids.is_contiguous(), "int64 ids [B, K] expected");
  const int64_t batch = ids.size(0), top_k = ids.size(1), experts = gate_up_bank.size(0);
  const at::Tensor gu_scales = gate_up_scales.value_or(at::Tensor()), dn_scales = down_scales.value_or(at::Tensor());
  TORCH_CHECK(gate_up_bank.is_contiguous() && down_bank.is_contiguous() && down_bank.size(0) == experts &&
              (!gu_scales.defined() || (gu_scales.is_contiguous() && gu_scales.size(0) == experts)) &&
              (!dn_scales.defined() || (dn_scales.is_contiguous() && dn_scales.size(0) == experts)),
              "banks: contiguous gate_up [N, 2I, D] and down [N, D, I], scales [N, ...] beside quantized ones");
  // expert 0's views checked for the format and shapes every expert of the bank shares
  const Matrices gu = checked_matrices({gate_up_bank[0]}, gu_scales.defined() ? at::TensorList({gu_scales[0]}) : at::TensorList());
  const Matrices dn = checked_matrices({down_bank[0]}, dn_scales.defined() ? at::TensorList({dn_scales[0]}) : at::TensorList());
  const int64_t hidden = gu.depth, inter = dn.depth;
  check_role_formats(gu.format, dn.format);
  TORCH_CHECK(gu.n_out == 2 * inter && dn.n_out == hidden, "banks: gate_up [N, 2I, D] and down [N, D, I]");
  TORCH_CHECK(hidden_rows.scalar_type() == at::kBFloat16 && hidden_rows.is_contiguous() &&
              hidden_rows.sizes() == at::IntArrayRef({batch, hidden}), "bfloat16 hidden [B, D] expected");
  TORCH_CHECK(rows.scalar_type() == at::kFloat && rows.is_contiguous() &&
              rows.sizes() == at::IntArrayRef({batch, top_k, hidden}), "float32 rows [B, K, D] expected");
  check_expert_widths(hidden, inter);
  TORCH_CHECK(0 <= cpu_ranks && cpu_ranks <= top_k, "cpu_ranks within 0..K");
  const at::Tensor gu_bias = gate_up_bias.value_or(at::Tensor()), dn_bias = down_bias.value_or(at::Tensor());
  check_bias_bank(gu_bias, experts, 2 * inter);
  check_bias_bank(dn_bias, experts, hidden);
  const Gating gating = gating_of(activation, alpha, limit);
  const int64_t* id = ids.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> pairs_of(size_t(experts) + 1);
  std::vector<bool> routed(size_t(experts) + 1, false);
  for (int64_t pair = 0; pair < batch * top_k; ++pair) {
    if (id[pair] == -1) continue;
    TORCH_CHECK(0 <= id[pair] && id[pair] < experts, "expert id out of range");
    routed[id[pair]] = true;
    if (pair % top_k < cpu_ranks) pairs_of[id[pair]].push_back(pair);
  }
  std::vector<Matrix> gate_ups, downs;
  std::vector<Bias> gu_biases, dn_biases;
  std::vector<int64_t> offsets{0}, order;
  for (int64_t e = 0; e < experts; ++e) {
    if (pairs_of[e].empty()) continue;
    gate_ups.push_back(bank_matrix(gate_up_bank, gu_scales, e));
    downs.push_back(bank_matrix(down_bank, dn_scales, e));
    if (gu_bias.defined()) gu_biases.push_back(bank_bias(gu_bias, e));
    if (dn_bias.defined()) dn_biases.push_back(bank_bias(dn_bias, e));
    order.insert(order.end(), pairs_of[e].begin(), pairs_of[e].end());
    offsets.push_back(int64_t(order.size()));
  }
  const int64_t routed_count = std::count(routed.begin(), routed.end(), true);
  if (order.empty()) return {0, routed_count};
  const int64_t m = int64_t(order.size());
  std::vector<float> xs(size_t(m * hidden)), outs(size_t(m * hidden));
  const uint16_t* hid = reinterpret_cast<const uint16_t*>(hidden_rows.data_ptr<at::BFloat16>());
  for (int64_t i = 0; i < m; ++i)  // bf16 -> float32, exact
    for (int64_t d = 0; d < hidden; ++d) xs[size_t(i * hidden + d)] = bf16_value(hid[(order[i] / top_k) * hidden + d]);
  with_formats(gu.format, dn.format, [&](auto g, auto d) {
    experts_mlp<decltype(g), decltype(d)>(xs.data(), m, gate_ups, downs, gu_biases, dn_biases, offsets, hidden, inter,
                                          gating, outs.data());
  });
  float* out = rows.data_ptr<float>();
  for (int64_t i = 0; i < m; ++i)
    std::memcpy(out + order[i] * hidden, &outs[size_t(i * hidden)], size_t(hidden) * sizeof(float));
  return {int64_t(gate_ups.size()), routed_count};
}

// Whether an FP8 bank holds a NaN code anywhere (the kernel does not read those: fp8_values), scanned by the team
bool fp8_nan_codes(const at::Tensor& codes) {
  TORCH_CHECK(codes.scalar_type() == at::kFloat8_e4m3fn && codes.is_contiguous(), "contiguous float8_e4m3fn codes expected");
  const uint8_t* bytes = static_cast<const uint8_t*>(codes.data_ptr());
  std::atomic<bool> found{false};
  at::parallel_for(0, codes.numel(), 1 << 22, [&](int64_t begin, int64_t end) {
    if (!found.load(std::memory_order_relaxed) && any_fp8_nan(bytes + begin, end - begin))
      found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}

}  // namespace

TORCH_LIBRARY(wisp_cpu, m) {
  m.def("grouped_rows_matmul(Tensor x, Tensor[] ws, Tensor[] scales, int[] offsets) -> Tensor");
  m.def("gated_experts_mlp(Tensor x, Tensor[] gate_ups, Tensor[] gate_up_scales, Tensor[] gate_up_biases, "
        "Tensor[] downs, Tensor[] down_scales, Tensor[] down_biases, int[] offsets, str activation, float alpha, "
        "float limit) -> Tensor");
  m.def("gate_mul(Tensor h, str activation, float alpha, float limit) -> Tensor");
  m.def("fp8_nan_codes(Tensor codes) -> bool");
  m.def("rank_share_rows(Tensor ids, int cpu_ranks, Tensor hidden, Tensor gate_up_bank, Tensor? gate_up_scales, "
        "Tensor down_bank, Tensor? down_scales, Tensor? gate_up_bias, Tensor? down_bias, str activation, float alpha, "
        "float limit, Tensor(a!) rows) -> int[]");
}
TORCH_LIBRARY_IMPL(wisp_cpu, CPU, m) {
  m.impl("grouped_rows_matmul", &grouped_rows_matmul);
  m.impl("gated_experts_mlp", &gated_experts_mlp);
  m.impl("gate_mul", &gate_mul_op);
  m.impl("fp8_nan_codes", &fp8_nan_codes);
  m.impl("rank_share_rows", &rank_share_rows);
}
