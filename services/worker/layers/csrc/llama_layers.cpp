// A Llama model's decoder layers in one call, for the CPU worker's default setting (float32
// compute, every linear 4-bit through q4_linear, or q4_q16_linear / q4_q8_linear for int16 /
// int8 activations; a float32 or int8 KV cache): the loop of
// model/flat_layers.py (FlatLayers.run) written out in C++, calling the very same ops in the same
// order with the same arguments, so the same bits. A batch-1 step of SmolLM2 issues ~400 such
// calls; from Python each costs an interpreter frame or several (~1 ms a ~9 ms step), from here
// a C++ call each (layer_ops.h: the ops' functions, not their dispatcher entries).
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.llama_layers.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "layer_ops.h"

namespace {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

// A linear's function for the layers' activations (layer_ops.h).
using Linear = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, int64_t);

// x [T, d]: the embedded tokens. Per layer i: norms[2i], norms[2i + 1] (input and post-attention
// RMSNorm weights); linears qkv, o, gate_up, down as packed[4i + j], pairs[4i + j] with
// out_rows[4i + j] (the linear op's arguments, in its layout: activations "float32" for
// q4_linear, "int16" for q4_q16_linear, "int8" for q4_q8_linear); its KV cache as k_flat[i], v_flat[i] ([slots, Hkv, D], what rope_write_kv_
// stores into) and k_cache[i], v_cache[i] ([blocks, block_size, Hkv, D], the same memory, what
// paged_attention reads); an int8 cache's scales likewise as k_scale_flat[i], v_scale_flat[i]
// ([slots, Hkv]) and k_scale[i], v_scale[i] ([blocks, block_size, Hkv]), all four lists empty
// for a float32 cache. shape: (H, Hkv, D). Returns the last layer's MLP output and the residual
// stream, as FlatLayers.run.
std::tuple<Tensor, Tensor> llama_layers(
    const Tensor& x, at::TensorList norms, at::TensorList packed, at::TensorList pairs,
    at::IntArrayRef out_rows, const Tensor& cos, const Tensor& sin, at::TensorList k_flat,
    at::TensorList v_flat, at::TensorList k_cache, at::TensorList v_cache,
    at::TensorList k_scale_flat, at::TensorList v_scale_flat, at::TensorList k_scale,
    at::TensorList v_scale, const Tensor& slot_mapping, const Tensor& query_start, const Tensor& context_lens,
    const Tensor& block_tables, at::IntArrayRef shape, double eps, double scale,
    bool avx512_bf16, c10::string_view activations) {
  const int64_t layers = static_cast<int64_t>(k_flat.size());
  TORCH_CHECK(layers > 0 && norms.size() == 2 * k_flat.size() &&
                  packed.size() == 4 * k_flat.size() && pairs.size() == packed.size() &&
                  out_rows.size() == packed.size() && v_flat.size() == k_flat.size() &&
                  k_cache.size() == k_flat.size() && v_cache.size() == k_flat.size(),
              "layerserve::llama_layers: per layer 2 norms, 4 linears and its K/V, got ",
              norms.size(), " norms, ", packed.size(), " linears, ", k_flat.size(), " caches");
  TORCH_CHECK(shape.size() == 3, "layerserve::llama_layers: shape (H, Hkv, D)");
  const bool scaled = !k_scale.empty();
  TORCH_CHECK(k_scale_flat.size() == k_scale.size() && v_scale_flat.size() == k_scale.size() &&
                  v_scale.size() == k_scale.size() && (!scaled || k_scale.size() == k_flat.size()),
              "layerserve::llama_layers: an int8 cache's four scale lists, one per layer each, "
              "or none");
  TORCH_CHECK(activations == "float32" || activations == "int16" || activations == "int8",
              "layerserve::llama_layers: activations float32, int16 or int8, got ", activations);
  const Linear linear = activations == "int8"    ? layerserve::q4_q8_linear
                        : activations == "int16" ? layerserve::q4_q16_linear
                                                 : layerserve::q4_linear;
  const int64_t tokens = x.size(0), heads = shape[0], kv_heads = shape[1], dim = shape[2];
  const std::vector<int64_t> split = {heads, kv_heads, kv_heads};
  const OptionalTensor none;
  Tensor residual = x, hidden = x;
  for (int64_t i = 0; i < layers; ++i) {
    Tensor h = i == 0 ? layerserve::rms_norm(x, norms[0], eps)
                      : layerserve::add_rms_norm_(residual, hidden, norms[2 * i], eps);
    const Tensor qkv = linear(h, packed[4 * i], pairs[4 * i], out_rows[4 * i])
                           .view({tokens, -1, dim});
    std::vector<Tensor> parts = qkv.split_with_sizes(split, 1);
    layerserve::rope_write_kv_(parts[0], parts[1], parts[2], cos, sin, k_flat[i], v_flat[i],
                          slot_mapping, scaled ? OptionalTensor(k_scale_flat[i]) : none,
                          scaled ? OptionalTensor(v_scale_flat[i]) : none);
    const Tensor out = layerserve::paged_attention(
        parts[0], k_cache[i], v_cache[i], query_start, context_lens, block_tables, 0, scale,
        avx512_bf16, scaled ? OptionalTensor(k_scale[i]) : none,
        scaled ? OptionalTensor(v_scale[i]) : none);
    h = linear(out.reshape({tokens, heads * dim}), packed[4 * i + 1],
                         pairs[4 * i + 1], out_rows[4 * i + 1]);
    h = layerserve::add_rms_norm_(residual, h, norms[2 * i + 1], eps);
    const Tensor gate_up =
        linear(h, packed[4 * i + 2], pairs[4 * i + 2], out_rows[4 * i + 2]);
    hidden = linear(layerserve::silu_mul(gate_up), packed[4 * i + 3], pairs[4 * i + 3],
                              out_rows[4 * i + 3]);
  }
  return {hidden, residual};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def(
      "llama_layers(Tensor x, Tensor[] norms, Tensor[] packed, Tensor[] pairs, int[] out_rows,"
      " Tensor cos, Tensor sin, Tensor[] k_flat, Tensor[] v_flat, Tensor[] k_cache,"
      " Tensor[] v_cache, Tensor[] k_scale_flat, Tensor[] v_scale_flat, Tensor[] k_scale,"
      " Tensor[] v_scale, Tensor slot_mapping, Tensor query_start, Tensor context_lens,"
      " Tensor block_tables, int[] shape, float eps, float scale, bool avx512_bf16,"
      " str activations)"
      " -> (Tensor, Tensor)");
  m.impl("llama_layers", c10::DispatchKey::CPU, &llama_layers);
}
