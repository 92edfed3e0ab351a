// out [M, N] = x [M, K] @ W.T for a 4-bit weight W [N, K] (Int4Weight's values: per group of 32
// input columns and output row, w = q * scale + offset, q in 0..15), with the activations
// quantized to int8 inside the op and each group's products summed exactly in int32 by
// AVX512-VNNI's vpdpbusd (u8 x s8 -> int32, 64 products an instruction), as llama.cpp's Q8
// blocks do. torch.ops.layerserve.q4_linear (q4_matmul.cpp) multiplies the float32 x instead:
// from 3 rows on it is bound by float32 multiply-adds, so a speculative verify step of 1 + k
// rows cost nearly k + 1 plain steps; here a row costs a few integer instructions per 64
// products, and a call of up to 8 rows stays bound by reading the weight.
//
// The arithmetic, per activation row and group g of 32 columns (int8_activations.py has the
// same formula in torch, the tests' reference):
//   d = max|x| / 127 (float32), xq = nearbyint(x / d) (half to even) clamped to [-127, 127],
//   all 0 where d == 0; sx = the group's float32 sum of the original x, in column order;
// and per output row n: isum = sum q * xq (exact in int32: at most 32 * 15 * 127),
//   acc = fma(scale * d, float(isum), acc); acc = fma(offset, sx, acc), groups in order from 0.
// Against float32 sums this changes one thing that matters: x is rounded to 8 bits per group,
// an error of up to d / 2 a value (1/254 of the group's largest |x|), which multiplies q * scale
// (0..15 steps above the group's minimum, not centred on 0): on random Gaussian data an output
// is ~1.2% (relative RMS) off the float32 product with the same weights, where q4_linear is
// ~1e-7 off. The offset part (offset * sum x) stays in float32 and the integer sums are exact.
// The rounding, like the rest, does not depend on the batch. Measured on whole models
// (benchmarks/perplexity.py, float32 + the GGUF's 4-bit weights kept): SmolLM2-135M Q4_1
// perplexity +1.05% over float32 dense, top-1 = float32's at 91.3% of positions (q4_linear:
// +0.00%, 100%); Gemma 3 270M Q4_K +0.62%, 96.6%. Per kind of linear (SmolLM2, int8 activations
// in that kind alone, 2,048 tokens): q/k/v cost a mean KL of 0.014 nats, gate/up and down 0.008
// each, o 0.001.
//
// Batch-invariant: every output is that sequence of operations whatever M is, whichever tile of
// rows it falls in and whatever the thread count: the threads share N in units of 32 output
// rows (k_proj's 192 rows are 6 units, o_proj's 576 are 18), never K, and the activations'
// quantization is per row.
//
// Layout (int8_activations.pack_q4_q8): output rows in units of 32 (two vectors of 16 int32
// lanes, the last unit padded with zero rows); in a unit, per 8 input columns c..c+7, lane i
// = row i's 8 nibbles as 4 bytes, byte j = q[c + j] | q[c + 4 + j] << 4: packed [N / 32, K / 8,
// 32 * 4] uint8. So AND 0x0F gives the u8 operand of columns c..c+3 and a shift by 4 (then the
// AND) that of c+4..c+7, and the activation side is 4 int8 columns broadcast as one int32. A
// unit's bytes are one sequential stream (128 bytes, two cache lines, per 8 columns) and the
// units follow one another, so each thread reads its share of the weight as one stream. The
// scales and offsets likewise: pairs [N / 32, K / 32, 2, 32], float16 where exact, or float32.
//
// With intrinsics where the compiler has AVX512-VNNI and AVX512-BW (the extension is built
// -march=native); elsewhere plain code with the same operations in the same order, so the same
// results.
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.q4_q8_linear.

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

// One group's 32 values -> its int8 values; returns d. Also q8_0_q8_matmul.cpp's.
float quantize_group(const float* v, int8_t* xq) {
#if defined(LAYERSERVE_VNNI)
  const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float d = amax / 127.0f;
  const __m512 divisor = _mm512_set1_ps(d == 0.0f ? 1.0f : d), zero = _mm512_setzero_ps();
  const __m512 low = _mm512_set1_ps(-127.0f), high = _mm512_set1_ps(127.0f);
  for (int half = 0; half < 2; ++half) {
    // the division itself, not a multiply by 1 / d: the reference's rounding exactly
    __m512 r = _mm512_roundscale_ps(_mm512_div_ps(half ? b : a, divisor),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = d == 0.0f ? zero : _mm512_min_ps(_mm512_max_ps(r, low), high);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + 16 * half),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  return d;
#else
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
  const float d = amax / 127.0f;
  for (int j = 0; j < 32; ++j) {
    const float r = d == 0.0f ? 0.0f : std::nearbyint(v[j] / d);  // x / d, as above
    xq[j] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
  }
  return d;
#endif
}

}  // namespace q8_activations

namespace {

using q8_activations::quantize_group;

constexpr int64_t kGroup = 32;     // input columns a group (a GGUF Q4 block, a Q8 block)
constexpr int64_t kUnitRows = 32;  // output rows a unit of the layout: two vectors of 16 lanes
constexpr int64_t kChunk = 8;      // input columns a 4-byte lane holds (two nibbles a byte)
constexpr int64_t kChunkBytes = kUnitRows * 4;  // one chunk of a unit: 128 bytes
constexpr int kMaxTile = 8;        // activation rows sharing one pass over a unit (registers)

// Per row and group: the int8 values, d and the float sum (the op's first step).
struct Quantized {
  std::vector<int8_t> xq;  // [M, K]
  std::vector<float> d;    // [M, K / 32]
  std::vector<float> sx;   // [M, K / 32]
};

// One row of K columns -> its int8 values, and per group d and sx.
void quantize_row(const float* x, int64_t k, int8_t* xq, float* d, float* sx) {
  const int64_t groups = k / kGroup;
  for (int64_t g = 0; g < groups; ++g) d[g] = quantize_group(x + g * kGroup, xq + g * kGroup);
  // The group sums in column order, groups side by side so that their chains overlap.
  for (int64_t g = 0; g < groups; ++g) sx[g] = 0.0f;
  for (int64_t j = 0; j < kGroup; ++j)
    for (int64_t g = 0; g < groups; ++g) sx[g] += x[g * kGroup + j];
}

Quantized quantize(const float* x, int64_t rows, int64_t k) {
  const int64_t groups = k / kGroup;
  Quantized q{std::vector<int8_t>(rows * k), std::vector<float>(rows * groups),
              std::vector<float>(rows * groups)};
  // per row, so the same values whatever the thread count; rows below 16 stay on this thread
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row(x + r * k, k, q.xq.data() + r * k, q.d.data() + r * groups,
                   q.sx.data() + r * groups);
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

// R activation rows (xq, d, sx from their first row's group g0 = 0; rows k and `groups` apart)
// against one unit of 32 output rows (w: its bytes, pairs: its scales and offsets) over all
// groups -> out[r * out_stride + i] for the unit's first `valid` rows. Up to 4 rows, the low
// and high nibbles' sums go to separate int32 accumulators (the chains are half as long; the
// integers add exactly either way); 5-8 rows have enough chains without.
template <typename P, int R>
void unit_rows(const uint8_t* w, const P* pairs, int64_t groups, int64_t k, const int8_t* xq,
               const float* d, const float* sx, float* out, int64_t out_stride, int64_t valid) {
  constexpr int H = R <= 4 ? 2 : 1;
  const __m512i low_bits = _mm512_set1_epi8(0x0F);
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i isum[R][2][H];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 2; ++c)
        for (int h = 0; h < H; ++h) isum[r][c][h] = _mm512_setzero_si512();
    for (int64_t chunk = 0; chunk < kGroup / kChunk; ++chunk) {
      const uint8_t* bytes = w + (g * (kGroup / kChunk) + chunk) * kChunkBytes;
      __m512i low[2], high[2];
      for (int c = 0; c < 2; ++c) {
        const __m512i v = _mm512_loadu_si512(bytes + c * 64);
        low[c] = _mm512_and_si512(v, low_bits);
        high[c] = _mm512_and_si512(_mm512_srli_epi32(v, 4), low_bits);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* a = xq + r * k + g * kGroup + chunk * kChunk;
        const __m512i a_low = broadcast4(a), a_high = broadcast4(a + 4);
        for (int c = 0; c < 2; ++c) {
          isum[r][c][0] = _mm512_dpbusd_epi32(isum[r][c][0], low[c], a_low);
          isum[r][c][H - 1] = _mm512_dpbusd_epi32(isum[r][c][H - 1], high[c], a_high);
        }
      }
    }
    const P* pair = pairs + g * 2 * kUnitRows;
    for (int c = 0; c < 2; ++c) {
      const __m512 scale = load_floats(pair + c * 16);
      const __m512 offset = load_floats(pair + kUnitRows + c * 16);
      for (int r = 0; r < R; ++r) {
        const __m512i sum =
            H == 2 ? _mm512_add_epi32(isum[r][c][0], isum[r][c][H - 1]) : isum[r][c][0];
        const __m512 sd = _mm512_mul_ps(scale, _mm512_set1_ps(d[r * groups + g]));
        acc[r][c] = _mm512_fmadd_ps(sd, _mm512_cvtepi32_ps(sum), acc[r][c]);
        acc[r][c] = _mm512_fmadd_ps(offset, _mm512_set1_ps(sx[r * groups + g]), acc[r][c]);
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
void unit_rows(const uint8_t* w, const P* pairs, int64_t groups, int64_t k, const int8_t* xq,
               const float* d, const float* sx, float* out, int64_t out_stride, int64_t valid) {
  for (int r = 0; r < R; ++r) {
    for (int64_t i = 0; i < valid; ++i) {
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t isum = 0;
        for (int64_t chunk = 0; chunk < kGroup / kChunk; ++chunk) {
          const uint8_t* lane = w + (g * (kGroup / kChunk) + chunk) * kChunkBytes + i * 4;
          const int8_t* a = xq + r * k + g * kGroup + chunk * kChunk;
          for (int j = 0; j < 4; ++j) isum += (lane[j] & 15) * a[j] + (lane[j] >> 4) * a[j + 4];
        }
        const P* pair = pairs + g * 2 * kUnitRows;
        const float sd = to_float(pair[i]) * d[r * groups + g];
        acc = std::fma(sd, static_cast<float>(isum), acc);
        acc = std::fma(to_float(pair[kUnitRows + i]), sx[r * groups + g], acc);
      }
      out[r * out_stride + i] = acc;
    }
  }
}

#endif

template <typename P>
using UnitRows = void (*)(const uint8_t*, const P*, int64_t, int64_t, const int8_t*,
                          const float*, const float*, float*, int64_t, int64_t);

template <typename P>
constexpr UnitRows<P> kUnitRowsFor[kMaxTile + 1] = {
    nullptr,          unit_rows<P, 1>, unit_rows<P, 2>, unit_rows<P, 3>, unit_rows<P, 4>,
    unit_rows<P, 5>, unit_rows<P, 6>, unit_rows<P, 7>, unit_rows<P, 8>};

// The threads share the units (a split that depends on N only); each unit's bytes (9-24 KB at
// SmolLM2's K) stay in L1 while every tile of rows passes over them.
template <typename P>
void multiply(const Quantized& q, int64_t rows, int64_t k, const uint8_t* packed, const P* pairs,
              int64_t n, float* out) {
  const int64_t groups = k / kGroup, units = (n + kUnitRows - 1) / kUnitRows;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const uint8_t* w = packed + u * (k / kChunk) * kChunkBytes;
      const P* unit_pairs = pairs + u * groups * 2 * kUnitRows;
      const int64_t valid = std::min<int64_t>(kUnitRows, n - u * kUnitRows);
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxTile) {
        const int64_t tile = std::min<int64_t>(kMaxTile, rows - r0);
        kUnitRowsFor<P>[tile](w, unit_pairs, groups, k, q.xq.data() + r0 * k,
                              q.d.data() + r0 * groups, q.sx.data() + r0 * groups,
                              out + r0 * n + u * kUnitRows, n, valid);
      }
    }
  });
}

void check(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& pairs, int64_t n) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu() && pairs.device().is_cpu(),
              "layerserve::q4_q8_linear: CPU tensors");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "layerserve::q4_q8_linear: x [M, K] float32 contiguous, got ", x.sizes(), " ",
              x.scalar_type());
  const int64_t units = (n + kUnitRows - 1) / kUnitRows;
  TORCH_CHECK(n > 0 && packed.dim() == 3 && packed.scalar_type() == at::kByte &&
                  packed.is_contiguous() && packed.size(0) == units &&
                  packed.size(2) == kChunkBytes,
              "layerserve::q4_q8_linear: packed [ceil(N / 32), K / 8, 128] uint8 contiguous for "
              "N = ", n, ", got ", packed.sizes(), " ", packed.scalar_type());
  TORCH_CHECK(x.size(1) % kGroup == 0 && packed.size(1) * kChunk == x.size(1),
              "layerserve::q4_q8_linear: K must divide by 32 and match packed's K / 8, got x ",
              x.sizes(), " and packed ", packed.sizes());
  TORCH_CHECK((pairs.scalar_type() == at::kFloat || pairs.scalar_type() == at::kHalf) &&
                  pairs.is_contiguous() && pairs.dim() == 4 && pairs.size(0) == units &&
                  pairs.size(1) == x.size(1) / kGroup && pairs.size(2) == 2 &&
                  pairs.size(3) == kUnitRows,
              "layerserve::q4_q8_linear: pairs [ceil(N / 32), K / 32, 2, 32] float16 or float32 "
              "contiguous, got ", pairs.sizes(), " ", pairs.scalar_type());
}

// x [M, K] float32; packed and pairs as int8_activations.pack_q4_q8 makes them; n: the weight's
// rows (the last unit may be partly padding) -> [M, n] float32.
at::Tensor q4_q8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& pairs,
                        int64_t n) {
  check(x, packed, pairs, n);
  const int64_t rows = x.size(0), k = x.size(1);
  at::Tensor out = at::empty({rows, n}, x.options());
  if (rows == 0) return out;
  const Quantized q = quantize(x.data_ptr<float>(), rows, k);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  if (pairs.scalar_type() == at::kHalf) {
    multiply(q, rows, k, w, pairs.data_ptr<at::Half>(), n, out.data_ptr<float>());
  } else {
    multiply(q, rows, k, w, pairs.data_ptr<float>(), n, out.data_ptr<float>());
  }
  return out;
}

bool has_vnni() {
#if defined(LAYERSERVE_VNNI)
  return true;
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def("q4_q8_linear(Tensor x, Tensor packed, Tensor pairs, int n) -> Tensor");
  m.impl("q4_q8_linear", c10::DispatchKey::CPU, &q4_q8_linear);
  m.def("q4_q8_has_vnni() -> bool", &has_vnni);
}
