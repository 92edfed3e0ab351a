// The ops a decoder layer runs (llama_layers.cpp's loop), as the C++ functions that their files
// also register with torch: the loop calls these directly, the same code and arguments as
// through torch's dispatcher, without its ~0.5-1 us a call (13 calls a layer, ~390 a batch-1
// step of SmolLM2). Each is defined in namespace layerserve in the file named beside it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace layerserve {

// q4_matmul.cpp, q4_q8_matmul.cpp
at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& pairs,
                     int64_t n);
at::Tensor q4_q8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& pairs,
                        int64_t n);
at::Tensor q4_q16_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& pairs,
                         int64_t n);

// small_ops.cpp
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm_(at::Tensor residual, const at::Tensor& x, const at::Tensor& weight,
                         double eps);
at::Tensor silu_mul(at::Tensor gate_up);

// rope.cpp
void rope_write_kv_(at::Tensor q, at::Tensor k, const at::Tensor& v, const at::Tensor& cos,
                    const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                    const at::Tensor& slot_mapping, const std::optional<at::Tensor>& k_scale,
                    const std::optional<at::Tensor>& v_scale);

// cpu_attention.cpp
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& query_start,
                           const at::Tensor& context_lens, const at::Tensor& block_tables,
                           int64_t window, double scale, bool avx512_bf16,
                           const std::optional<at::Tensor>& k_scale,
                           const std::optional<at::Tensor>& v_scale);

}  // namespace layerserve
