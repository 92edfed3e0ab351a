// out [M, N] = x [M, K] @ W.T for a Q8_0 weight W [N, K] (GGUF's: int8 q, one scale d per 32
// input columns, w = d * q; q8_0_weight.py), with the activations quantized to int8 inside the
// op as q4_q8_matmul.cpp quantizes them and each group's products summed exactly in int32 by
// AVX512-VNNI: q8_0_matmul.cpp's float32 sums for int8 ones, and batch-invariant.
//
// The arithmetic, per activation row and group g of 32 columns: d_x, xq as in q4_q8_matmul.cpp
// (d_x = max|x| / 127, xq = nearbyint(x / d_x) clamped to [-127, 127], 0 where d_x == 0); per
// output row n: isum = sum q * xq (exact in int32), acc = fma(d_w * d_x, float(isum), acc),
// groups in order from 0 (int8_activations.reference_q8_0_q8_linear). Against float32 sums, x
// is rounded to 8 bits a group (an error of up to d_x / 2 a value); nothing else changes.
//
// vpdpbusd multiplies unsigned by signed bytes, and both sides are signed here: the weight is
// stored as q + 128 (0..255) and the op subtracts 128 * sum(xq) per group, which it takes from
// the activations once per row: sum (q + 128) * xq - 128 * sum xq = sum q * xq, exactly.
//
// Layout (int8_activations.pack_q8_0_q8): output rows in units of 32 (two vectors of 16 int32
// lanes, the last unit padded with zero rows); in a unit, per 4 input columns c..c+3, lane i =
// row i's 4 bytes q[c + j] + 128: packed [N / 32, K / 4, 32 * 4] uint8, one stream; scales
// [N / 32, K / 32, 32], float16 where exact (GGUF's d are), else float32. The threads share N in
// units, never K, so each output is the same sequence of operations whatever M and the thread
// count.
//
// Intrinsics where the compiler has AVX512-VNNI and AVX512-BW; plain code elsewhere, with the
// same operations in the same order.
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.q8_0_q8_linear.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define LAYERSERVE_VNNI 1
#endif

namespace q8_activations {
// q4_q8_matmul.cpp's: one group's 32 values -> xq; returns d (the activations of both ops are
// quantized by the same code).
float quantize_group(const float* v, int8_t* xq);
}  // namespace q8_activations

namespace {

using q8_activations::quantize_group;

constexpr int64_t kGroup = 32;     // input columns a group (a Q8_0 block)
constexpr int64_t kUnitRows = 32;  // output rows a unit of the layout
constexpr int64_t kChunk = 4;      // input columns a 4-byte lane holds
constexpr int64_t kChunkBytes = kUnitRows * kChunk;  // 128 bytes
constexpr int kMaxTile = 8;        // activation rows sharing one pass over a unit

// Per row and group: the int8 values, d, and 128 * sum(xq) (the unsigned weights' excess).
struct Quantized {
  std::vector<int8_t> xq;      // [M, K]
  std::vector<float> d;        // [M, K / 32]
  std::vector<int32_t> bias;   // [M, K / 32]
};

Quantized quantize(const float* x, int64_t rows, int64_t k) {
  const int64_t groups = k / kGroup;
  Quantized q{std::vector<int8_t>(rows * k), std::vector<float>(rows * groups),
              std::vector<int32_t>(rows * groups)};
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * groups; i < end * groups; ++i) {
      q.d[i] = quantize_group(x + i * kGroup, q.xq.data() + i * kGroup);
      int32_t total = 0;
      for (int64_t j = 0; j < kGroup; ++j) total += q.xq[i * kGroup + j];
      q.bias[i] = 128 * total;
    }
  });
  return q;
}

inline float to_float(float v) { return v; }
inline float to_float(at::Half v) { return static_cast<float>(v); }

#if defined(LAYERSERVE_VNNI)

inline __m512 load_floats(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_floats(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// R activation rows against one unit of 32 output rows over all groups -> out[r * out_stride +
// i] for the unit's first `valid` rows. Two int32 accumulators per row and vector (even and odd
// chunks) up to 4 rows, so that the chains are short; the integers add exactly either way.
template <typename P, int R>
void unit_rows(const uint8_t* w, const P* scales, int64_t groups, int64_t k, const int8_t* xq,
               const float* d, const int32_t* bias, float* out, int64_t out_stride,
               int64_t valid) {
  constexpr int H = R <= 4 ? 2 : 1;
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i isum[R][2][H];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 2; ++c)
        for (int h = 0; h < H; ++h) isum[r][c][h] = _mm512_setzero_si512();
    for (int64_t chunk = 0; chunk < kGroup / kChunk; ++chunk) {
      const uint8_t* bytes = w + (g * (kGroup / kChunk) + chunk) * kChunkBytes;
      const __m512i v0 = _mm512_loadu_si512(bytes), v1 = _mm512_loadu_si512(bytes + 64);
      const int h = H == 2 ? chunk % 2 : 0;
      for (int r = 0; r < R; ++r) {
        const __m512i a = broadcast4(xq + r * k + g * kGroup + chunk * kChunk);
        isum[r][0][h] = _mm512_dpbusd_epi32(isum[r][0][h], v0, a);
        isum[r][1][h] = _mm512_dpbusd_epi32(isum[r][1][h], v1, a);
      }
    }
    for (int c = 0; c < 2; ++c) {
      const __m512 scale = load_floats(scales + g * kUnitRows + c * 16);
      for (int r = 0; r < R; ++r) {
        __m512i sum = H == 2 ? _mm512_add_epi32(isum[r][c][0], isum[r][c][H - 1]) : isum[r][c][0];
        sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(bias[r * groups + g]));
        const __m512 sd = _mm512_mul_ps(scale, _mm512_set1_ps(d[r * groups + g]));
        acc[r][c] = _mm512_fmadd_ps(sd, _mm512_cvtepi32_ps(sum), acc[r][c]);
      }
    }
  }
  const __mmask16 first = valid >= 16 ? 0xFFFF : (1u << valid) - 1;
  const __mmask16 second = valid >= 32 ? 0xFFFF : valid <= 16 ? 0 : (1u << (valid - 16)) - 1;
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(out + r * out_stride, first, acc[r][0]);
    _mm512_mask_storeu_ps(out + r * out_stride + 16, second, acc[r][1]);
  }
}

#else  // plain code: the same operations per output, one at a time

template <typename P, int R>
void unit_rows(const uint8_t* w, const P* scales, int64_t groups, int64_t k, const int8_t* xq,
               const float* d, const int32_t* bias, float* out, int64_t out_stride,
               int64_t valid) {
  for (int r = 0; r < R; ++r) {
    for (int64_t i = 0; i < valid; ++i) {
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t isum = 0;
        for (int64_t chunk = 0; chunk < kGroup / kChunk; ++chunk) {
          const uint8_t* lane = w + (g * (kGroup / kChunk) + chunk) * kChunkBytes + i * 4;
          const int8_t* a = xq + r * k + g * kGroup + chunk * kChunk;
          for (int j = 0; j < 4; ++j) isum += lane[j] * a[j];
        }
        isum -= bias[r * groups + g];
        const float sd = to_float(scales[g * kUnitRows + i]) * d[r * groups + g];
        acc = std::fma(sd, static_cast<float>(isum), acc);
      }
      out[r * out_stride + i] = acc;
    }
  }
}

#endif

template <typename P>
using UnitRows = void (*)(const uint8_t*, const P*, int64_t, int64_t, const int8_t*,
                          const float*, const int32_t*, float*, int64_t, int64_t);

template <typename P>
constexpr UnitRows<P> kUnitRowsFor[kMaxTile + 1] = {
    nullptr,          unit_rows<P, 1>, unit_rows<P, 2>, unit_rows<P, 3>, unit_rows<P, 4>,
    unit_rows<P, 5>, unit_rows<P, 6>, unit_rows<P, 7>, unit_rows<P, 8>};

template <typename P>
void multiply(const Quantized& q, int64_t rows, int64_t k, const uint8_t* packed,
              const P* scales, int64_t n, float* out) {
  const int64_t groups = k / kGroup, units = (n + kUnitRows - 1) / kUnitRows;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const uint8_t* w = packed + u * (k / kChunk) * kChunkBytes;
      const P* unit_scales = scales + u * groups * kUnitRows;
      const int64_t valid = std::min<int64_t>(kUnitRows, n - u * kUnitRows);
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxTile) {
        const int64_t tile = std::min<int64_t>(kMaxTile, rows - r0);
        kUnitRowsFor<P>[tile](w, unit_scales, groups, k, q.xq.data() + r0 * k,
                              q.d.data() + r0 * groups, q.bias.data() + r0 * groups,
                              out + r0 * n + u * kUnitRows, n, valid);
      }
    }
  });
}

void check(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, int64_t n) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu() && scales.device().is_cpu(),
              "layerserve::q8_0_q8_linear: CPU tensors");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "layerserve::q8_0_q8_linear: x [M, K] float32 contiguous, got ", x.sizes(), " ",
              x.scalar_type());
  const int64_t units = (n + kUnitRows - 1) / kUnitRows;
  TORCH_CHECK(n > 0 && packed.dim() == 3 && packed.scalar_type() == at::kByte &&
                  packed.is_contiguous() && packed.size(0) == units &&
                  packed.size(2) == kChunkBytes,
              "layerserve::q8_0_q8_linear: packed [ceil(N / 32), K / 4, 128] uint8 contiguous "
              "for N = ", n, ", got ", packed.sizes(), " ", packed.scalar_type());
  TORCH_CHECK(x.size(1) % kGroup == 0 && packed.size(1) * kChunk == x.size(1),
              "layerserve::q8_0_q8_linear: K must divide by 32 and match packed's K / 4, got x ",
              x.sizes(), " and packed ", packed.sizes());
  TORCH_CHECK((scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kHalf) &&
                  scales.is_contiguous() && scales.dim() == 3 && scales.size(0) == units &&
                  scales.size(1) == x.size(1) / kGroup && scales.size(2) == kUnitRows,
              "layerserve::q8_0_q8_linear: scales [ceil(N / 32), K / 32, 32] float16 or float32 "
              "contiguous, got ", scales.sizes(), " ", scales.scalar_type());
}

// x [M, K] float32; packed and scales as int8_activations.pack_q8_0_q8 makes them; n: the
// weight's rows -> [M, n] float32.
at::Tensor q8_0_q8_linear(const at::Tensor& x, const at::Tensor& packed,
                          const at::Tensor& scales, int64_t n) {
  check(x, packed, scales, n);
  const int64_t rows = x.size(0), k = x.size(1);
  at::Tensor out = at::empty({rows, n}, x.options());
  if (rows == 0) return out;
  const Quantized q = quantize(x.data_ptr<float>(), rows, k);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  if (scales.scalar_type() == at::kHalf) {
    multiply(q, rows, k, w, scales.data_ptr<at::Half>(), n, out.data_ptr<float>());
  } else {
    multiply(q, rows, k, w, scales.data_ptr<float>(), n, out.data_ptr<float>());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def("q8_0_q8_linear(Tensor x, Tensor packed, Tensor scales, int n) -> Tensor");
  m.impl("q8_0_q8_linear", c10::DispatchKey::CPU, &q8_0_q8_linear);
}
