// The inner loops of attention over a bf16 KV cache with AVX512-BF16, reading K and V rows as
// they lie in the cache (no widened copy):
// - dot16: 16 q . k dot products at once with VDPBF16PS (each instruction multiplies 32 bf16
//   pairs exactly and adds them into 16 float32 lanes), then one transposing reduction turns the
//   16 keys' lane sums into one vector whose lane j is key j's score;
// - weigh_rows: p . V for a few query rows, each V row widened in registers (a bf16 is the top
//   half of a float32: a shift gives the even dims, a mask the odd ones) and FMAs in float32.
//
// Precision: a bf16 x bf16 product is exact in float32 (8-bit significands), so with q already
// bf16 (native_paged_attention hands the kernel q in the cache's dtype) the scores depart from
// the float32 path only in the order of the additions and VDPBF16PS's flushing of denormals;
// p . V is the float32 path's arithmetic in the same order.
//
// Included by cpu_attention.cpp only when the compiler targets AVX512-BF16 (the extension is
// built with -march=native on the machine that runs it); elsewhere the widening path is all
// there is.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "avx512_sums.h"

namespace avx512_bf16 {

using avx512_sums::KEYS;
using avx512_sums::slot;
using avx512_sums::transpose_sum;
constexpr int64_t PER_LOAD = 32;  // bf16 values per 512-bit load: dim must be a multiple

// Lane j = q . keys[j] over `dim` values (dim % 32 == 0); q and the keys are raw bf16 bits.
inline __m512 dot16(const uint16_t* q, const uint16_t* const keys[KEYS], int64_t dim) {
  __m512 acc[KEYS];
#pragma GCC unroll 16
  for (int s = 0; s < KEYS; ++s) acc[s] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; d += PER_LOAD) {
    const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + d);
#pragma GCC unroll 16
    for (int j = 0; j < KEYS; ++j) {
      acc[slot(j)] =
          _mm512_dpbf16_ps(acc[slot(j)], qv, (__m512bh)_mm512_loadu_si512(keys[j] + d));
    }
  }
  return transpose_sum(acc);
}

// Where dim d of a row lands in weigh_rows' sums: each 32-dim slice as 16 even dims, then 16 odd.
inline int64_t lane_of(int64_t d) { return (d & ~int64_t{31}) + ((d & 1) << 4) + ((d & 31) >> 1); }

// sums[r][lane_of(d)] += sum_t probs[r * probs_stride + t] * values[t][d] for R rows, W x 32
// dims from `d0` at a time: R x 2W independent FMA chains hide the FMA latency; each sum adds
// its keys in order.
template <int R, int W>
inline void weigh_rows(const float* probs, int64_t probs_stride, const uint16_t* const* values,
                       int64_t count, float* sums_out, int64_t dim) {
  const __m512i odd_dims = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t d = 0; d < dim; d += W * PER_LOAD) {
    __m512 sums[R][2 * W];
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < 2 * W; ++k) sums[r][k] = _mm512_loadu_ps(sums_out + r * dim + d + 16 * k);
    }
    for (int64_t t = 0; t < count; ++t) {
      __m512 v[2 * W];
      for (int w = 0; w < W; ++w) {
        const __m512i x = _mm512_loadu_si512(values[t] + d + w * PER_LOAD);
        v[2 * w] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        v[2 * w + 1] = _mm512_castsi512_ps(_mm512_and_si512(x, odd_dims));
      }
      for (int r = 0; r < R; ++r) {
        const __m512 p = _mm512_set1_ps(probs[r * probs_stride + t]);
        for (int k = 0; k < 2 * W; ++k) sums[r][k] = _mm512_fmadd_ps(p, v[k], sums[r][k]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < 2 * W; ++k) _mm512_storeu_ps(sums_out + r * dim + d + 16 * k, sums[r][k]);
    }
  }
}

// weigh_rows for `rows` rows that see the same keys, 4 rows at a time.
inline void weigh(const float* probs, int64_t probs_stride, const uint16_t* const* values,
                  int64_t count, float* sums, int64_t dim, int64_t rows) {
  const bool wide = dim % (2 * PER_LOAD) == 0;
  for (int64_t r = 0; r < rows; r += 4) {
    const float* pr = probs + r * probs_stride;
    float* sr = sums + r * dim;
    switch ((rows - r >= 4 ? 4 : rows - r) * (wide ? 2 : 1)) {
      case 8: weigh_rows<4, 2>(pr, probs_stride, values, count, sr, dim); break;
      case 6: weigh_rows<3, 2>(pr, probs_stride, values, count, sr, dim); break;
      case 4:
        if (wide) weigh_rows<2, 2>(pr, probs_stride, values, count, sr, dim);
        else weigh_rows<4, 1>(pr, probs_stride, values, count, sr, dim);
        break;
      case 3: weigh_rows<3, 1>(pr, probs_stride, values, count, sr, dim); break;
      case 2:
        if (wide) weigh_rows<1, 2>(pr, probs_stride, values, count, sr, dim);
        else weigh_rows<2, 1>(pr, probs_stride, values, count, sr, dim);
        break;
      default: weigh_rows<1, 1>(pr, probs_stride, values, count, sr, dim);
    }
  }
}

}  // namespace avx512_bf16
