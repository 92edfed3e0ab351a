// out [M, N] = x [M, K] @ W.T for a Q8_0 weight W [N, K] (GGUF's: int8 q, one scale d per 32
// input columns, w = d * q; q8_0_weight.py), with the activations quantized per group inside
// the op as q4_q8_matmul.cpp's are and each group's products summed exactly in int32 by
// AVX512-VNNI or AVX2 (int_activations.h): q8_0_matmul.cpp's float32 sums for integer ones, and
// batch-invariant. q8_0_q8_linear: int8 activations (vpdpbusd); q8_0_q16_linear: int16
// (vpdpwssd). Per output row and group: isum = sum q * xq, acc = fma(d_w * d_x, float(isum),
// acc), groups in order from 0 (int8_activations.reference_q8_0_linear).
//
// vpdpbusd multiplies unsigned by signed bytes, and both sides are signed here: the weight is
// stored as q + 128 (0..255) and the op subtracts 128 * sum(xq) per group, which it takes from
// the activations once per row: sum (q + 128) * xq - 128 * sum xq = sum q * xq, exactly. The
// int16 op reads the same bytes as s16 0..255 and subtracts the same. Exact in int32: with
// int16, sum (q + 128) * xq is at most 32 * 255 * 32767 = 267,382,720 and 128 * sum xq at most
// 134,213,632 in magnitude, both below 2^31. float(isum) rounds above 2^24 (int16 only), as the
// reference's float32 conversion does.
//
// Layout (int8_activations.pack_q8_0_q8, both ops): output rows in units of 32 (two vectors of
// 16 int32 lanes, the last unit padded with zero rows); in a unit, per 4 input columns c..c+3,
// lane i = row i's 4 bytes q[c + j] + 128: packed [N / 32, K / 4, 32 * 4] uint8, one stream
// (int16: AND 0x00FF00FF after shifts of 0 and 8 gives s16 pairs of columns (c, c+2), (c+1,
// c+3)); scales [N / 32, K / 32, 32], float16 where exact (GGUF's d are), else float32.
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.q8_0_q8_linear, q8_0_q16_linear, q8_0_rows.

#include <torch/library.h>

#include "int_activations.h"

namespace {

// The layout above, for int_activations.h's kernel.
struct Q8_0Weights {
  static constexpr int64_t kColumns = 4;  // input columns a lane: one byte each
  static constexpr int kSets = 1;         // the scale per group and row
  static constexpr int32_t kBias = 128;   // stored q + 128
  static constexpr const char* kScalesName = "scales";
  template <typename T>
  static constexpr int_activations::Split split() {
    return sizeof(T) == 1 ? int_activations::Split{0xFFFFFFFFu, 1, {0}}
                          : int_activations::Split{0x00FF00FFu, 2, {0, 8}};
  }
};

// x [M, K] float32; packed and scales as int8_activations.pack_q8_0_q8 makes them; n: the
// weight's rows -> [M, n] float32.
at::Tensor q8_0_q8_linear(const at::Tensor& x, const at::Tensor& packed,
                          const at::Tensor& scales, int64_t n) {
  return int_activations::linear<Q8_0Weights, int8_t>("q8_0_q8_linear", x, packed, scales, n);
}

at::Tensor q8_0_q16_linear(const at::Tensor& x, const at::Tensor& packed,
                           const at::Tensor& scales, int64_t n) {
  return int_activations::linear<Q8_0Weights, int16_t>("q8_0_q16_linear", x, packed, scales, n);
}

// Rows `ids` of the weight as float32 [n, K], d * q each (exact: an 8-bit q times a float16 d),
// read from the layout above: the tied embedding of a model whose head is Q8_0 (q8_0_weight.py's
// embedding), one op where torch took ~15 (indexing the unit and lane, the permuted views, the
// bias, the product).
template <typename P>
void gather_rows(const uint8_t* packed, const P* scales, const int64_t* ids, int64_t n,
                 int64_t k, float* out) {
  using int_activations::kGroup;
  using int_activations::kUnitRows;
  const int64_t chunks = k / Q8_0Weights::kColumns, groups = k / kGroup;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t unit = ids[r] / kUnitRows, lane = ids[r] % kUnitRows;
    const uint8_t* bytes = packed + unit * chunks * int_activations::kChunkBytes + lane * 4;
    const P* d = scales + unit * groups * kUnitRows + lane;
    float* dst = out + r * k;
    for (int64_t c = 0; c < chunks; ++c) {
      const float scale = int_activations::to_float(d[(c * 4 / kGroup) * kUnitRows]);
      for (int64_t j = 0; j < 4; ++j) {
        const int q = static_cast<int>(bytes[c * int_activations::kChunkBytes + j]) - 128;
        dst[c * 4 + j] = static_cast<float>(q) * scale;
      }
    }
  }
}

// packed, scales as q8_0_q8_linear takes them; ids int64 [n] in [0, rows) -> [n, K] float32.
at::Tensor q8_0_rows(const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& ids,
                     int64_t rows) {
  TORCH_CHECK(packed.device().is_cpu() && packed.dim() == 3 &&
                  packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.size(2) == int_activations::kChunkBytes,
              "layerserve::q8_0_rows: packed [units, K / 4, 128] uint8 contiguous");
  const int64_t k = packed.size(1) * Q8_0Weights::kColumns;
  TORCH_CHECK(scales.is_contiguous() && scales.dim() == 3 && scales.size(0) == packed.size(0) &&
                  scales.size(1) == k / int_activations::kGroup &&
                  (scales.scalar_type() == at::kHalf || scales.scalar_type() == at::kFloat),
              "layerserve::q8_0_rows: scales [units, K / 32, 32] float16 or float32");
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1,
              "layerserve::q8_0_rows: ids int64 [n]");
  const at::Tensor index = ids.contiguous();
  const int64_t n = index.size(0);
  const int64_t* id = index.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(id[r] >= 0 && id[r] < rows, "layerserve::q8_0_rows: id ", id[r],
                " outside [0, ", rows, ")");
  }
  at::Tensor out = at::empty({n, k}, packed.options().dtype(at::kFloat));
  if (scales.scalar_type() == at::kHalf) {
    gather_rows(packed.data_ptr<uint8_t>(), scales.data_ptr<at::Half>(), id, n, k,
                out.data_ptr<float>());
  } else {
    gather_rows(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), id, n, k,
                out.data_ptr<float>());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def("q8_0_rows(Tensor packed, Tensor scales, Tensor ids, int rows) -> Tensor");
  m.impl("q8_0_rows", c10::DispatchKey::CPU, &q8_0_rows);
  m.def("q8_0_q8_linear(Tensor x, Tensor packed, Tensor scales, int n) -> Tensor");
  m.impl("q8_0_q8_linear", c10::DispatchKey::CPU, &q8_0_q8_linear);
  m.def("q8_0_q16_linear(Tensor x, Tensor packed, Tensor scales, int n) -> Tensor");
  m.impl("q8_0_q16_linear", c10::DispatchKey::CPU, &q8_0_q16_linear);
}
