// One layer's new keys and values stored into the paged KV cache in one call: what
// kv_cache.PagedKVCache.write does with two index_copy_ (each a dispatch from Python, plus
// index_copy_'s own checks and TensorIterator set-up, at batch 1 more than the copy itself).
//
// The same bits: a token's [Hkv, D] keys (and values) are copied byte for byte into its slot,
// k and v in the cache's dtype (the caller converts otherwise). Slots out of range are refused
// with a TORCH_CHECK before anything is written, as index_copy_ refuses them.
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.write_kv_.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

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
  TORCH_CHECK(x.scalar_type() == cache.scalar_type(),
              "layerserve::write_kv_: k and v in the cache's dtype ", cache.scalar_type(),
              ", got ", x.scalar_type());
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kLong && slots.size(0) == x.size(0),
              "layerserve::write_kv_: slot_mapping [T] int64, one slot a token");
}

}  // namespace

namespace layerserve {

// Also called by rope.cpp's rope_write_kv_ (RoPE and this write in one op).
void write_kv(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slot_mapping) {
  check(k_cache, k, slot_mapping);
  check(v_cache, v, slot_mapping);
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "layerserve::write_kv_: K and V caches differ");
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t tokens = k.size(0), num_slots = k_cache.size(0);
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slot[t] >= 0 && slot[t] < num_slots, "layerserve::write_kv_: slot ", slot[t],
                " out of range for ", num_slots, " slots");
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
      "write_kv_(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor slot_mapping)"
      " -> ()");
  m.impl("write_kv_", c10::DispatchKey::CPU, &layerserve::write_kv);
}
