// One layer's new keys and values stored into the paged KV cache in one call: what
// kv_cache.PagedKVCache.write does with two index_copy_ (each a dispatch from Python, plus
// index_copy_'s own checks and TensorIterator set-up, at batch 1 more than the copy itself).
//
// The same bits: a token's [Hkv, D] keys (and values) are copied byte for byte into its slot,
// k and v in the cache's dtype (the caller converts otherwise). Slots out of range are refused
// with a TORCH_CHECK before anything is written, as index_copy_ refuses them.
//
// An int8 cache (its scales [slots, Hkv] float32 passed too) is quantized on the way in, per
// token and KV head: scale = absmax / 127, q = round(x / scale), half to even, as
// kv_cache.quantize_int8 does in float32 (the same bits: tests/unit/worker/test_int8_kv.py).
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.write_kv_.

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

namespace {

// cache [slots, Hkv, D] contiguous; x [T, Hkv, D] with each token's Hkv * D values contiguous
// (a head of q/k/v split from one projection is: its heads follow one another).
void check(const at::Tensor& cache, const at::Tensor& x, const at::Tensor& slots) {
  TORCH_CHECK(cache.device().is_cpu() && x.device().is_cpu() && slots.device().is_cpu(),
              "layerserve::write_kv_: CPU tensors");
  TORCH_CHECK(cache.dim() == 3 && cache.is_contiguous(),
              "layerserve::write_kv_: caches [slots, Hkv, D] contiguous");
  TORCH_CHECK(x.dim() == 3 && x.size(1) == cache.size(1) && x.size(2) == cache.size(2),
              "layerserve::write_kv_: k and v [T, Hkv, D] matching the cache's [slots, ",
              cache.size(1), ", ", cache.size(2), "], got ", x.sizes());
  TORCH_CHECK(x.stride(2) == 1 && (x.size(1) == 1 || x.stride(1) == x.size(2)),
              "layerserve::write_kv_: each token's [Hkv, D] contiguous");
  TORCH_CHECK(x.scalar_type() == cache.scalar_type() || cache.scalar_type() == at::kChar,
              "layerserve::write_kv_: k and v in the cache's dtype ", cache.scalar_type(),
              ", got ", x.scalar_type());
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kLong && slots.size(0) == x.size(0),
              "layerserve::write_kv_: slot_mapping [T] int64, one slot a token");
}

// An int8 cache's scales: [slots, Hkv] float32 contiguous.
void check_scales(const at::Tensor& cache, const std::optional<at::Tensor>& scale) {
  const bool int8 = cache.scalar_type() == at::kChar;
  TORCH_CHECK(int8 == scale.has_value(),
              "layerserve::write_kv_: scales go with an int8 cache, and only with one");
  if (!int8) return;
  TORCH_CHECK(scale->device().is_cpu() && scale->scalar_type() == at::kFloat &&
                  scale->is_contiguous() && scale->dim() == 2 &&
                  scale->size(0) == cache.size(0) && scale->size(1) == cache.size(1),
              "layerserve::write_kv_: scales [slots, Hkv] float32 contiguous");
}

// One head's dim values of x as int8 and their scale (absmax / 127; 0 for a head of zeros).
template <typename T>
void quantize_head(const T* x, int64_t dim, int8_t* out, float* scale) {
  float absmax = 0.0f;
  for (int64_t d = 0; d < dim; ++d) absmax = std::max(absmax, std::abs(static_cast<float>(x[d])));
  *scale = absmax / 127.0f;
  const float divisor = absmax > 0.0f ? *scale : 1.0f;
  for (int64_t d = 0; d < dim; ++d) {
    const float q = std::nearbyint(static_cast<float>(x[d]) / divisor);  // half to even
    out[d] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
  }
}

// x [T, Hkv, D] (each token's heads contiguous) quantized into cache [slots, Hkv, D] int8 and
// scale [slots, Hkv] at slot[t].
template <typename T>
void quantize_tokens(const at::Tensor& x, const int64_t* slot, at::Tensor& cache,
                     at::Tensor& scale) {
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2);
  const T* src = x.data_ptr<T>();
  int8_t* dst = cache.data_ptr<int8_t>();
  float* scales = scale.data_ptr<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      quantize_head(src + t * x.stride(0) + h * dim, dim, dst + (slot[t] * heads + h) * dim,
                    scales + slot[t] * heads + h);
    }
  }
}

void quantize_into(const at::Tensor& x, const int64_t* slot, at::Tensor& cache,
                   at::Tensor& scale) {
  switch (x.scalar_type()) {
    case at::kFloat: quantize_tokens<float>(x, slot, cache, scale); break;
    case at::kBFloat16: quantize_tokens<c10::BFloat16>(x, slot, cache, scale); break;
    case at::kHalf: quantize_tokens<c10::Half>(x, slot, cache, scale); break;
    default:
      TORCH_CHECK(false, "layerserve::write_kv_: an int8 cache takes float32, bfloat16 or "
                  "float16 k and v, not ", x.scalar_type());
  }
}

}  // namespace

namespace layerserve {

// Also called by rope.cpp's rope_write_kv_ (RoPE and this write in one op).
// k_scale, v_scale: an int8 cache's scales (and only an int8 cache's).
void write_kv(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slot_mapping, const std::optional<at::Tensor>& k_scale,
              const std::optional<at::Tensor>& v_scale) {
  check(k_cache, k, slot_mapping);
  check(v_cache, v, slot_mapping);
  check_scales(k_cache, k_scale);
  check_scales(v_cache, v_scale);
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.scalar_type() == v_cache.scalar_type(),
              "layerserve::write_kv_: K and V caches differ");
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t tokens = k.size(0), num_slots = k_cache.size(0);
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slot[t] >= 0 && slot[t] < num_slots, "layerserve::write_kv_: slot ", slot[t],
                " out of range for ", num_slots, " slots");
  }
  if (k_scale.has_value()) {
    at::Tensor k_scales = *k_scale, v_scales = *v_scale;
    quantize_into(k, slot, k_cache, k_scales);
    quantize_into(v, slot, v_cache, v_scales);
    return;
  }
  const int64_t row_bytes = k_cache.stride(0) * k_cache.element_size();
  const auto* k_src = static_cast<const char*>(k.data_ptr());
  const auto* v_src = static_cast<const char*>(v.data_ptr());
  auto* k_dst = static_cast<char*>(k_cache.data_ptr());
  auto* v_dst = static_cast<char*>(v_cache.data_ptr());
  const int64_t k_step = k.stride(0) * k.element_size(), v_step = v.stride(0) * v.element_size();
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(k_dst + slot[t] * row_bytes, k_src + t * k_step, row_bytes);
    std::memcpy(v_dst + slot[t] * row_bytes, v_src + t * v_step, row_bytes);
  }
}

}  // namespace layerserve

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def(
      "write_kv_(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor slot_mapping,"
      " Tensor(c!)? k_scale=None, Tensor(d!)? v_scale=None) -> ()");
  m.impl("write_kv_", c10::DispatchKey::CPU, &layerserve::write_kv);
}
