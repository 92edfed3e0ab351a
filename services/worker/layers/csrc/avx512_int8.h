// The inner loops of attention over an int8 KV cache (kv_cache.py: one float32 scale per token
// and KV head):
// - dot16: 16 q . k dot products at once, 16 lanes per key, then avx512_sums.h's transposing
//   reduction turns the 16 keys' lane sums into one vector whose lane j is key j's dot. A
//   decode's few rows (its G query heads) widen each key in registers (VPMOVSXBD, VCVTDQ2PS)
//   as they read it; a prefill tile's many rows (16 tokens x G) read the chunk's keys widened
//   once by widen_keys (times their scales) into 16 float32 rows that stay in L1;
// - weigh_rows: p . V for a few query rows, each V row widened in registers once for all of
//   them and its scale folded into each row's probability;
// - with AVX512-VNNI, a decode's rows in integers: score16 (the query rounded to int16, exact
//   int32 sums of its products with the int8 keys) and weigh16 (each chunk's weights rounded
//   to int16, exact int32 sums with the int8 values), each sum then times its float32 steps.
//
// Included by cpu_attention.cpp where avx512_bf16.h is (VNNI and BF16 CPUs alike): the
// extension is built with -march=native on the machine that runs it; elsewhere int8 rows are
// widened into a copy a block at a time.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "avx512_bf16.h"

namespace avx512_int8 {

using avx512_sums::KEYS;
constexpr int64_t PER_LOAD = 16;  // int8 values widened per register: dim must be a multiple
constexpr int64_t ROW_DIMS = 4 * PER_LOAD;  // dims weigh_rows keeps in registers per row

inline __m512 widen16(const int8_t* x) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}

// Lane j = q . keys[j] over `dim` values (dim % 16 == 0), the keys' int8 values as they are.
inline __m512 dot16(const float* q, const int8_t* const keys[KEYS], int64_t dim) {
  __m512 acc[KEYS];
#pragma GCC unroll 16
  for (int s = 0; s < KEYS; ++s) acc[s] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; d += PER_LOAD) {
    const __m512 qv = _mm512_loadu_ps(q + d);
#pragma GCC unroll 16
    for (int j = 0; j < KEYS; ++j) {
      const int k = avx512_sums::slot(j);
      acc[k] = _mm512_fmadd_ps(qv, widen16(keys[j] + d), acc[k]);
    }
  }
  return avx512_sums::transpose_sum(acc);
}

#if defined(__AVX512VNNI__)
constexpr int64_t Q16_DIMS = 32;  // int16 query values per register: dim must be a multiple
constexpr int64_t Q16_MAX_DIM = 512;  // score16's int32 sums stay exact up to this head dim

// A decode row's query as int16 for score16: q16[d] = round(q[d] / step), step = max|q| / 32767
// (a zero row: step 0, q16 zeros). Returns step. The rounding moves a score by at most
// step / 2 x sum |k| (k the key's float values): ~1.5e-5 of max|q| per dim, far under the
// int8 keys' own rounding (1/254 of their largest value).
inline float quantize_query16(const float* q, int64_t dim, int16_t* q16) {
  __m512 largest = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; d += 16) largest = _mm512_max_ps(largest, _mm512_abs_ps(_mm512_loadu_ps(q + d)));
  const float max = _mm512_reduce_max_ps(largest);
  const float step = max / 32767.0f;
  const __m512 inverse = _mm512_set1_ps(max > 0.0f ? 32767.0f / max : 0.0f);
  for (int64_t d = 0; d < dim; d += 16) {  // nearest even (MXCSR's default), saturated
    const __m512i x = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + d), inverse));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q16 + d), _mm512_cvtsepi32_epi16(x));
  }
  return step;
}

// avx512_sums.h's transpose_sum on int32 lanes: the same shuffles, integer adds, exact.
struct AddInts {
  __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
};

inline __m512i transpose_sum(const __m512i v[KEYS]) {
  __m512 bits[KEYS];
#pragma GCC unroll 16
  for (int j = 0; j < KEYS; ++j) bits[j] = _mm512_castsi512_ps(v[j]);
  return _mm512_castps_si512(avx512_sums::transpose_sum(bits, AddInts{}));
}

// Lane j = sum_d q16[d] * keys[j][d], exact in int32 (dim % 32 == 0; |sum| <= 32767 x 128 x
// dim < 2^31 for dim <= 512): each key widened to int16 in registers, VPDPWSSD adds 32
// products a lane pair at a time.
inline __m512i score16(const int16_t* q16, const int8_t* const keys[KEYS], int64_t dim) {
  __m512i acc[KEYS];
#pragma GCC unroll 16
  for (int s = 0; s < KEYS; ++s) acc[s] = _mm512_setzero_si512();
  for (int64_t d = 0; d < dim; d += Q16_DIMS) {
    const __m512i qv = _mm512_loadu_si512(q16 + d);
#pragma GCC unroll 16
    for (int j = 0; j < KEYS; ++j) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys[j] + d));
      const int k = avx512_sums::slot(j);
      acc[k] = _mm512_dpwssd_epi32(acc[k], qv, _mm512_cvtepi8_epi16(bytes));
    }
  }
  return transpose_sum(acc);
}

// Where dim d of a row lands in weigh16's sums: per 32 dims, the 16 int32 lanes VPUNPCKLWD
// leaves (dims 8L + m of each 128-bit lane L, m < 4), then the 16 of VPUNPCKHWD (8L + 4 + m).
inline int64_t lane_of16(int64_t d) {
  return (d & ~int64_t{31}) + ((d >> 2) & 1) * 16 + ((d >> 3) & 3) * 4 + (d & 3);
}

// A decode's p . V over one chunk of 16 keys for R rows (dim % 32 == 0): per row, the keys'
// weights w_t = probs[t] x scales[t] (keys outside `keys` weigh 0) rounded to int16 steps of
// max w / 32767, the products with the int8 values summed exactly in int32 by VPDPWSSD, two keys
// a lane (their values interleaved by VPUNPCK{L,H}WD), then sums[lane_of16(d)] += isum x step.
// The rounding moves a key's weight by at most 1/65534 of the chunk's largest.
template <int R>
inline void weigh16_rows(const float* probs, int64_t probs_stride, __mmask16 keys,
                         __m512 scales, const int8_t* const values[KEYS], float* sums,
                         int64_t dim) {
  alignas(64) int32_t pairs[R][KEYS / 2];  // row r's int16 weights of keys 2i and 2i + 1
  float steps[R];
  for (int r = 0; r < R; ++r) {
    const __m512 p = _mm512_maskz_loadu_ps(keys, probs + r * probs_stride);
    const __m512 w = _mm512_maskz_mul_ps(keys, p, scales);
    const float max = _mm512_reduce_max_ps(w);  // probabilities and scales are >= 0
    steps[r] = max / 32767.0f;
    const __m512 inverse = _mm512_set1_ps(max > 0.0f ? 32767.0f / max : 0.0f);
    const __m512i w32 = _mm512_cvtps_epi32(_mm512_mul_ps(w, inverse));  // nearest even
    _mm256_store_si256(reinterpret_cast<__m256i*>(pairs[r]), _mm512_cvtsepi32_epi16(w32));
  }
  for (int64_t d = 0; d < dim; d += Q16_DIMS) {
    __m512i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int t = 0; t < KEYS; t += 2) {
      const __m512i a = _mm512_cvtepi8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values[t] + d)));
      const __m512i b = _mm512_cvtepi8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values[t + 1] + d)));
      const __m512i low = _mm512_unpacklo_epi16(a, b), high = _mm512_unpackhi_epi16(a, b);
      for (int r = 0; r < R; ++r) {
        const __m512i pair = _mm512_set1_epi32(pairs[r][t / 2]);
        acc[r][0] = _mm512_dpwssd_epi32(acc[r][0], low, pair);
        acc[r][1] = _mm512_dpwssd_epi32(acc[r][1], high, pair);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 step = _mm512_set1_ps(steps[r]);
      for (int k = 0; k < 2; ++k) {
        float* out = sums + r * dim + d + 16 * k;
        _mm512_storeu_ps(out, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][k]), step,
                                              _mm512_loadu_ps(out)));
      }
    }
  }
}

// weigh16_rows for `rows` rows that see the same keys, 4 rows at a time.
inline void weigh16(const float* probs, int64_t probs_stride, __mmask16 keys, __m512 scales,
                    const int8_t* const values[KEYS], float* sums, int64_t dim, int64_t rows) {
  for (int64_t r = 0; r < rows; r += 4) {
    const float* pr = probs + r * probs_stride;
    float* sr = sums + r * dim;
    switch (rows - r >= 4 ? 4 : rows - r) {
      case 4: weigh16_rows<4>(pr, probs_stride, keys, scales, values, sr, dim); break;
      case 3: weigh16_rows<3>(pr, probs_stride, keys, scales, values, sr, dim); break;
      case 2: weigh16_rows<2>(pr, probs_stride, keys, scales, values, sr, dim); break;
      default: weigh16_rows<1>(pr, probs_stride, keys, scales, values, sr, dim);
    }
  }
}
#endif

// rows[j * dim + d] = keys[j][d] * scales[j] for the 16 keys (dim % 16 == 0).
inline void widen_keys(const int8_t* const keys[KEYS], const float* scales, int64_t dim,
                       float* rows) {
  for (int j = 0; j < KEYS; ++j) {
    const __m512 scale = _mm512_set1_ps(scales[j]);
    for (int64_t d = 0; d < dim; d += PER_LOAD) {
      _mm512_storeu_ps(rows + j * dim + d, _mm512_mul_ps(widen16(keys[j] + d), scale));
    }
  }
}

// Lane j = q . rows[j] over `dim` values (dim % 16 == 0), rows as widen_keys leaves them.
inline __m512 dot16(const float* q, const float* rows, int64_t dim) {
  __m512 acc[KEYS];
#pragma GCC unroll 16
  for (int s = 0; s < KEYS; ++s) acc[s] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; d += PER_LOAD) {
    const __m512 qv = _mm512_loadu_ps(q + d);
#pragma GCC unroll 16
    for (int j = 0; j < KEYS; ++j) {
      const int k = avx512_sums::slot(j);
      acc[k] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows + j * dim + d), acc[k]);
    }
  }
  return avx512_sums::transpose_sum(acc);
}

// sums[r][d] += sum_t probs[r * probs_stride + t] * scales[t] * values[t][d] for R rows, 64
// dims at a time (dim % 64 == 0): R x 4 independent FMA chains; each sum adds its keys in order.
template <int R>
inline void weigh_rows(const float* probs, int64_t probs_stride, const int8_t* const* values,
                       const float* scales, int64_t count, float* sums_out, int64_t dim) {
  for (int64_t d = 0; d < dim; d += ROW_DIMS) {
    __m512 sums[R][4];
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < 4; ++k) sums[r][k] = _mm512_loadu_ps(sums_out + r * dim + d + 16 * k);
    }
    for (int64_t t = 0; t < count; ++t) {
      __m512 v[4];
      for (int k = 0; k < 4; ++k) v[k] = widen16(values[t] + d + 16 * k);
      for (int r = 0; r < R; ++r) {
        const __m512 p = _mm512_set1_ps(probs[r * probs_stride + t] * scales[t]);
        for (int k = 0; k < 4; ++k) sums[r][k] = _mm512_fmadd_ps(p, v[k], sums[r][k]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < 4; ++k) _mm512_storeu_ps(sums_out + r * dim + d + 16 * k, sums[r][k]);
    }
  }
}

// weigh_rows for `rows` rows that see the same keys, 4 rows at a time.
inline void weigh(const float* probs, int64_t probs_stride, const int8_t* const* values,
                  const float* scales, int64_t count, float* sums, int64_t dim, int64_t rows) {
  for (int64_t r = 0; r < rows; r += 4) {
    const float* pr = probs + r * probs_stride;
    float* sr = sums + r * dim;
    switch (rows - r >= 4 ? 4 : rows - r) {
      case 4: weigh_rows<4>(pr, probs_stride, values, scales, count, sr, dim); break;
      case 3: weigh_rows<3>(pr, probs_stride, values, scales, count, sr, dim); break;
      case 2: weigh_rows<2>(pr, probs_stride, values, scales, count, sr, dim); break;
      default: weigh_rows<1>(pr, probs_stride, values, scales, count, sr, dim);
    }
  }
}

}  // namespace avx512_int8
