// out [M, N] = x [M, K] @ W.T for a weight W [N, K] held as GGUF's Q8_0 reads it: int8 q [N, K]
// and one scale d per 32 columns [N, K / 32] (w = d * q), float32 activations and results.
//
// A few activation rows (decode) make this bound by reading the weight, so each weight row is
// read from memory once per call and used for every activation row while it sits in L1: 1.06
// bytes a weight against float32's 4. Per group of 32 the products q * x are summed in float32
// vector lanes, scaled by d and added to the row's running lanes; the lanes are summed at the
// end. Only the summation order differs from the float reference (dequantize, then GEMM).
//
// Written with GCC vector extensions, which the compiler lowers to AVX-512 under -march=native
// on a CPU that has it and to narrower vectors or scalar code elsewhere; only the int8 -> float
// widening names AVX-512 instructions (load_bytes), with a plain loop as the fallback.
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.q8_0_linear.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kGroup = 32;  // weights per Q8_0 block
constexpr int kLanes = 16;
constexpr int kMaxTile = 8;  // activation rows sharing one pass over a weight row

typedef float FloatLanes __attribute__((vector_size(kLanes * sizeof(float))));

inline FloatLanes load_floats(const float* p) {
  FloatLanes v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// GCC 12 turns __builtin_convertvector from 16 int8 to 16 floats into 16 scalar converts, so
// AVX-512 gets the two widening instructions by name.
inline FloatLanes load_bytes(const int8_t* p) {
#if defined(__AVX512F__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return reinterpret_cast<FloatLanes>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)));
#else
  FloatLanes v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(p[i]);
  return v;
#endif
}

inline float lane_sum(FloatLanes v) {
  float total = 0.0f;
  for (int i = 0; i < kLanes; ++i) total += v[i];
  return total;
}

// R activation rows (x, x_stride apart) against one weight row: out[r * out_stride].
template <int R>
void dot_rows(const int8_t* q, const float* d, int64_t groups, const float* x, int64_t x_stride,
              float* out, int64_t out_stride) {
  FloatLanes acc[R];
  for (int r = 0; r < R; ++r) acc[r] = FloatLanes{};
  for (int64_t g = 0; g < groups; ++g) {
    const FloatLanes low = load_bytes(q + g * kGroup), high = load_bytes(q + g * kGroup + kLanes);
    const float scale = d[g];
    for (int r = 0; r < R; ++r) {
      const float* xg = x + r * x_stride + g * kGroup;
      const FloatLanes sum = low * load_floats(xg) + high * load_floats(xg + kLanes);
      acc[r] += sum * scale;
    }
  }
  for (int r = 0; r < R; ++r) out[r * out_stride] = lane_sum(acc[r]);
}

using DotRows = void (*)(const int8_t*, const float*, int64_t, const float*, int64_t, float*,
                         int64_t);
constexpr DotRows kDotRows[kMaxTile + 1] = {nullptr,     dot_rows<1>, dot_rows<2>,
                                            dot_rows<3>, dot_rows<4>, dot_rows<5>,
                                            dot_rows<6>, dot_rows<7>, dot_rows<8>};

void check(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d) {
  TORCH_CHECK(x.device().is_cpu() && q.device().is_cpu() && d.device().is_cpu(),
              "layerserve::q8_0_linear: CPU tensors");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1,
              "layerserve::q8_0_linear: x [M, K] float32, rows contiguous");
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous(),
              "layerserve::q8_0_linear: q [N, K] int8 contiguous");
  TORCH_CHECK(q.size(1) == x.size(1) && q.size(1) % kGroup == 0,
              "layerserve::q8_0_linear: K must match and divide by 32");
  TORCH_CHECK(d.scalar_type() == at::kFloat && d.is_contiguous() && d.dim() == 2 &&
                  d.size(0) == q.size(0) && d.size(1) == q.size(1) / kGroup,
              "layerserve::q8_0_linear: d [N, K / 32] float32 contiguous");
}

at::Tensor q8_0_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d) {
  check(x, q, d);
  const int64_t rows = x.size(0), n = q.size(0), k = q.size(1), groups = k / kGroup;
  at::Tensor out = at::empty({rows, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const int64_t x_stride = x.stride(0);
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* dp = d.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxTile) {
        const int64_t tile = std::min<int64_t>(kMaxTile, rows - r0);
        kDotRows[tile](qp + j * k, dp + j * groups, groups, xp + r0 * x_stride, x_stride,
                       op + r0 * n + j, n);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def("q8_0_linear(Tensor x, Tensor q, Tensor d) -> Tensor");
  m.impl("q8_0_linear", c10::DispatchKey::CPU, &q8_0_linear);
}
