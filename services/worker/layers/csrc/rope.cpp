// RoPE (Hugging Face's rotate_half) applied in place to q and k in one call: at batch 1 on the
// CPU the torch ops it replaces (torch_ops.apply_rope: view, flip, view, two muls and an add,
// for q and for k) cost their dispatch, not their arithmetic.
//
// Bit for bit what torch_ops.apply_rope gives: out = x * cos + swapped * signed_sin, where
// swapped is (x2 | x1) and signed_sin (-sin | sin); each product and the sum are rounded to
// x's dtype as torch's elementwise ops round them (computed in float32, rounded to nearest
// even), so a bfloat16 model's greedy outputs do not move.
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.rope_.

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "layer_ops.h"

namespace {

template <typename T>
inline T round_to(float x) {
  return static_cast<T>(x);  // c10's BFloat16/Half round to nearest even; float: exact
}

// x [T, heads, D] (head_dim contiguous), cos/sin [T, 1, D] contiguous in x's dtype.
// fp-contract off: x1 * c + x2 * s contracted into an FMA would round once, not as torch does.
template <typename T>
__attribute__((optimize("fp-contract=off"))) void rotate(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  const int64_t token_stride = x.stride(0), head_stride = x.stride(1);
  T* base = x.data_ptr<T>();
  const T* cos_base = cos.data_ptr<T>();
  const T* sin_base = sin.data_ptr<T>();
  for (int64_t t = 0; t < tokens; ++t) {
    const T* c = cos_base + t * dim;
    const T* s = sin_base + t * dim;
    for (int64_t h = 0; h < heads; ++h) {
      T* row = base + t * token_stride + h * head_stride;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = static_cast<float>(row[i]), x2 = static_cast<float>(row[i + half]);
        // first half: x1 * cos - ... written as x1 * cos + x2 * (-sin), as the torch ops do
        const T a1 = round_to<T>(x1 * static_cast<float>(c[i]));
        const T b1 = round_to<T>(x2 * static_cast<float>(s[i]));
        const T a2 = round_to<T>(x2 * static_cast<float>(c[i + half]));
        const T b2 = round_to<T>(x1 * static_cast<float>(s[i + half]));
        row[i] = round_to<T>(static_cast<float>(a1) + static_cast<float>(b1));
        row[i + half] = round_to<T>(static_cast<float>(a2) + static_cast<float>(b2));
      }
    }
  }
}

void check(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3 && x.stride(2) == 1 && x.size(2) % 2 == 0,
              "layerserve::rope_: x [T, heads, D] on the CPU, head_dim contiguous and even");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == x.size(0) * x.size(2) &&
                  sin.numel() == cos.numel(),
              "layerserve::rope_: cos and signed sin [T, 1, D] contiguous");
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(),
              "layerserve::rope_: the tables must be in x's dtype");
}

// Rotates q [T, H, D] and k [T, Hkv, D] in place with cos and signed sin [T, 1, D]
// (torch_ops.rope_tables).
void rope_(at::Tensor q, at::Tensor k, const at::Tensor& cos, const at::Tensor& sin) {
  for (at::Tensor* x : {&q, &k}) {
    check(*x, cos, sin);
    switch (x->scalar_type()) {
      case at::kFloat:
        rotate<float>(*x, cos, sin);
        break;
      case at::kBFloat16:
        rotate<c10::BFloat16>(*x, cos, sin);
        break;
      case at::kHalf:
        rotate<c10::Half>(*x, cos, sin);
        break;
      default:
        TORCH_CHECK(false, "layerserve::rope_: float32, bfloat16 or float16, not ",
                    x->scalar_type());
    }
  }
}

}  // namespace

namespace layerserve {

void write_kv(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slot_mapping, const std::optional<at::Tensor>& k_scale,
              const std::optional<at::Tensor>& v_scale);  // kv_write.cpp

// A layer's RoPE and KV cache write as one op (one dispatch from Python, not two): q and k
// rotated in place as rope_ does, then k and v stored at their slots as write_kv_ does
// (quantized into an int8 cache, whose scales come last).
void rope_write_kv_(at::Tensor q, at::Tensor k, const at::Tensor& v, const at::Tensor& cos,
                    const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                    const at::Tensor& slot_mapping, const std::optional<at::Tensor>& k_scale,
                    const std::optional<at::Tensor>& v_scale) {
  rope_(q, k, cos, sin);
  write_kv(k_cache, v_cache, k, v, slot_mapping, k_scale, v_scale);
}

}  // namespace layerserve

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def("rope_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin) -> ()");
  m.impl("rope_", c10::DispatchKey::CPU, &rope_);
  m.def(
      "rope_write_kv_(Tensor(a!) q, Tensor(b!) k, Tensor v, Tensor cos, Tensor sin,"
      " Tensor(c!) k_cache, Tensor(d!) v_cache, Tensor slot_mapping, Tensor(e!)? k_scale=None,"
      " Tensor(f!)? v_scale=None) -> ()");
  m.impl("rope_write_kv_", c10::DispatchKey::CPU, &layerserve::rope_write_kv_);
}
