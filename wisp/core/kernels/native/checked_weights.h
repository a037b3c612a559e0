// The native kernel's weights as the ops receive them (cpu_experts.cpp): which format each tensor pair is (a weight's
// dtype, and for uint8 codes the widths that tell MXFP4 and the k-quants apart: wisp.core.kernels.quantized_weights),
// its shape checked, as a Matrix the format's reader reads (weight_formats.h, k_quant_formats.h); one expert's two roles in one format,
// or each in one of a GGUF file's block formats.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "k_quant_formats.h"
#include "weight_formats.h"

namespace wisp_cpu {

constexpr const char* kFormats =
    "contiguous bfloat16 [N, K] without scales; float8_e4m3fn [N, K] with float32 [ceil(N/128), ceil(K/128)] "
    "scales (FP8 blocks); uint8 [N, K/32, 16] with uint8 [N, K/32] (MXFP4); int8 [N, K] with float16 [N, K/32] "
    "(Q8_0); uint8 codes [N, K/256, 128 / 160 / 192] with uint8 heads [N, K/256, 16 / 16 / 18] (Q4_K / Q5_K / Q6_K)";

struct KQuantShape {  // a k-quant's codes and heads a super-block (wisp.core.kernels.k_quants)
  Format format;
  int64_t code_bytes, head_bytes;
};
constexpr KQuantShape kKQuants[] = {{Format::kQ4_K, 128, 16}, {Format::kQ5_K, 160, 16}, {Format::kQ6_K, 192, 18}};

// The format of weight w (one expert's [N, ...]) with its scales (undefined: none): its dtype, and for uint8 codes
// the widths that tell MXFP4 and the k-quants apart
inline Format format_of(const at::Tensor& w, const at::Tensor& scale) {
  const bool scaled = scale.defined();
  if (!scaled && w.scalar_type() == at::kBFloat16) return Format::kBf16;
  if (scaled && w.scalar_type() == at::kFloat8_e4m3fn) return Format::kFp8;
  if (scaled && w.scalar_type() == at::kChar) return Format::kQ8_0;
  if (scaled && w.scalar_type() == at::kByte && scale.dim() == w.dim()) {
    for (const KQuantShape& k : kKQuants)
      if (w.size(-1) == k.code_bytes) return k.format;
  } else if (scaled && w.scalar_type() == at::kByte) {
    return Format::kMxfp4;
  }
  TORCH_CHECK(false, "a weight the native kernel reads is ", kFormats, "; got ", w.scalar_type(),
              scaled ? " with" : " without", " scales, of shape ", w.sizes());
}

inline const KQuantShape* k_quant_shape(Format format) {
  for (const KQuantShape& k : kKQuants)
    if (k.format == format) return &k;
  return nullptr;
}

inline const char* format_name(Format format) {
  switch (format) {
    case Format::kBf16: return "bfloat16";
    case Format::kFp8: return "FP8 block";
    case Format::kMxfp4: return "MXFP4";
    case Format::kQ8_0: return "Q8_0";
    case Format::kQ4_K: return "Q4_K";
    case Format::kQ5_K: return "Q5_K";
    case Format::kQ6_K: return "Q6_K";
  }
  return "";
}

// One matrix of a checked format and shape [n_out, depth]: its codes and scales (`scale` undefined for bf16)
inline Matrix checked_matrix(Format format, const at::Tensor& w, const at::Tensor& scale, int64_t n_out, int64_t depth) {
  TORCH_CHECK(format_of(w, scale) == format, "every weight in one format: ", kFormats);
  if (const KQuantShape* k = k_quant_shape(format)) {  // codes [n_out, K/256, C], heads [n_out, K/256, H]
    const std::vector<int64_t> codes{n_out, depth / 256, k->code_bytes}, heads{n_out, depth / 256, k->head_bytes};
    TORCH_CHECK(depth % 256 == 0 && w.is_contiguous() && w.sizes() == at::IntArrayRef(codes) &&
                scale.scalar_type() == at::kByte && scale.is_contiguous() && scale.sizes() == at::IntArrayRef(heads),
                "every ", format_name(format), " weight [", n_out, ", ", depth, "]: contiguous codes ",
                at::IntArrayRef(codes), " and heads ", at::IntArrayRef(heads), "; got ", w.sizes(), " and ", scale.sizes());
    return Matrix{static_cast<const uint8_t*>(w.data_ptr()), static_cast<const uint8_t*>(scale.data_ptr())};
  }
  const bool mxfp4 = format == Format::kMxfp4;
  TORCH_CHECK(w.is_contiguous() && w.size(0) == n_out && w.dim() == (mxfp4 ? 3 : 2) &&
              (mxfp4 ? w.size(1) * 32 == depth && w.size(2) == 16 : w.size(1) == depth),
              "every ", format_name(format), " weight: contiguous, of one shape: ", kFormats);
  if (format == Format::kBf16) return Matrix{static_cast<const uint8_t*>(w.data_ptr()), nullptr};
  TORCH_CHECK(format == Format::kFp8 || depth % 32 == 0, "a ", format_name(format),
              " weight's rows are whole groups of 32 values; got K = ", depth);
  const at::ScalarType dtype = format == Format::kFp8 ? at::kFloat : mxfp4 ? at::kByte : at::kHalf;
  const std::vector<int64_t> shape = format == Format::kFp8
      ? std::vector<int64_t>{(n_out + 127) / 128, (depth + 127) / 128} : std::vector<int64_t>{n_out, depth / 32};
  TORCH_CHECK(scale.scalar_type() == dtype && scale.is_contiguous() && scale.sizes() == at::IntArrayRef(shape),
              "the scales of a ", format_name(format), " weight [", n_out, ", ", depth, "] are contiguous ",
              c10::toString(dtype), " ", at::IntArrayRef(shape), "; got ", scale.scalar_type(), " ", scale.sizes());
  return Matrix{static_cast<const uint8_t*>(w.data_ptr()), static_cast<const uint8_t*>(scale.data_ptr())};
}

// The logical [N, K] of a weight of `format` (MXFP4's [N, K/32, 16] packs K = 32 x its groups, a k-quant's
// [N, K/256, C] 256 x its super-blocks)
inline std::pair<int64_t, int64_t> logical_shape(const at::Tensor& w, Format format) {
  TORCH_CHECK(w.dim() == 2 || w.dim() == 3, "every weight: ", kFormats);
  if (k_quant_shape(format) != nullptr) return {w.size(0), w.size(1) * 256};
  return {w.size(0), w.dim() == 3 ? w.size(1) * w.size(2) * 2 : w.size(1)};
}

struct Matrices {
  Format format;
  int64_t n_out, depth;
  std::vector<Matrix> matrices;
};

inline Matrices checked_matrices(at::TensorList ws, at::TensorList scales) {
  TORCH_CHECK(!ws.empty(), "one weight per group");
  TORCH_CHECK(scales.empty() || scales.size() == ws.size(), "no scales (bf16 weights) or one per weight");
  const Format format = format_of(ws[0], scales.empty() ? at::Tensor() : scales[0]);
  const auto [n_out, depth] = logical_shape(ws[0], format);
  TORCH_CHECK(depth > 0 && depth % kLanes == 0, "x [M, K], K a positive multiple of 16");
  Matrices out{format, n_out, depth, {}};
  for (size_t e = 0; e < ws.size(); ++e)
    out.matrices.push_back(checked_matrix(format, ws[e], scales.empty() ? at::Tensor() : scales[e], n_out, depth));
  return out;
}

// gate_up and down in one format, or each in one of a GGUF file's block formats (a Q4_K_M file keeps some layers'
// down in Q6_K)
inline void check_role_formats(Format gate_up, Format down) {
  const auto gguf_block = [](Format f) { return f == Format::kQ8_0 || k_quant_shape(f) != nullptr; };
  TORCH_CHECK(gate_up == down || (gguf_block(gate_up) && gguf_block(down)), "gate_up and down in one format, or each "
              "in Q8_0, Q4_K, Q5_K or Q6_K; got ", format_name(gate_up), " and ", format_name(down));
}

template <class Fn>
void with_format(Format format, Fn&& fn) {  // fn(F{}) for the format's reader F
  switch (format) {
    case Format::kBf16: fn(Bf16{}); break;
    case Format::kFp8: fn(Fp8{}); break;
    case Format::kMxfp4: fn(Mxfp4{}); break;
    case Format::kQ8_0: fn(Q8_0{}); break;
    case Format::kQ4_K: fn(Q4_K{}); break;
    case Format::kQ5_K: fn(Q5_K{}); break;
    case Format::kQ6_K: fn(Q6_K{}); break;
  }
}


template <class Fn>
void with_formats(Format gate_up, Format down, Fn&& fn) {  // fn(G{}, D{}) for the two roles' readers
  with_format(gate_up, [&](auto g) { with_format(down, [&](auto d) { fn(g, d); }); });
}

}  // namespace wisp_cpu
