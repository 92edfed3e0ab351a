// A decode over an int8 KV cache in integers where the CPU has AVX2 but not avx512_int8.h's
// VNNI passes (AMD Zen 2/3, Intel before Ice Lake): the same two steps with VPMADDWD + VPADDD
// for VPDPWSSD, 8 int32 lanes a register instead of 16.
// - score16: the query rounded to int16 once (steps of max|q| / 32767), its products with each
//   key's int8 values summed exactly in int32, then x step x the key's scale;
// - weigh16: per chunk of 16 keys, each row's weights p x the value's scale rounded to int16
//   steps of the chunk's largest / 32767, their products with the int8 values summed exactly in
//   int32, then sums[d] = fma(isum, step, sums[d]).
// The integer sums are exact and the float32 steps are avx512_int8.h's in its order, so a
// decode reads the same bits on either path; its sums stay in dim order (no lane_of16).
//
// Included by cpu_attention.cpp where the compiler targets AVX2 and FMA and the VNNI passes are
// not built in.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace avx2_int8 {

constexpr int KEYS = 16;              // keys a chunk: avx512_int8.h's, so its steps are the same
constexpr int64_t Q16_DIMS = 16;      // int16 values a register: dim must be a multiple
constexpr int64_t Q16_MAX_DIM = 512;  // the int32 sums stay exact up to this head dim

inline float reduce_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

// 8 floats -> 8 int16: nearest even (MXCSR's default), saturated, in order.
inline __m128i to_int16(__m256 x) {
  const __m256i i = _mm256_cvtps_epi32(x);
  return _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
}

// Lanes [first, last] of 8 set (first and last relative to the 8, may fall outside them).
inline __m256i lane_mask(int first, int last) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_and_si256(_mm256_cmpgt_epi32(index, _mm256_set1_epi32(first - 1)),
                          _mm256_cmpgt_epi32(_mm256_set1_epi32(last + 1), index));
}

// A decode row's query as int16: q16[d] = round(q[d] / step), step = max|q| / 32767 (a zero
// row: step 0, q16 zeros); dim % 16 == 0. Returns step (avx512_int8::quantize_query16's).
inline float quantize_query16(const float* q, int64_t dim, int16_t* q16) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 largest = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; d += 8) {
    largest = _mm256_max_ps(largest, _mm256_andnot_ps(sign, _mm256_loadu_ps(q + d)));
  }
  const float max = reduce_max(largest);
  const __m256 inverse = _mm256_set1_ps(max > 0.0f ? 32767.0f / max : 0.0f);
  for (int64_t d = 0; d < dim; d += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q16 + d),
                     to_int16(_mm256_mul_ps(_mm256_loadu_ps(q + d), inverse)));
  }
  return max / 32767.0f;
}

// Lane j = the sum of the 8 lanes of v[j], exact (three rounds of pairwise adds).
inline __m256i transpose_sum8(const __m256i v[8]) {
  const __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i low4 = _mm256_hadd_epi32(a, b), high4 = _mm256_hadd_epi32(c, d);
  // low4: keys 0-3's sums of lanes 0-3 | of lanes 4-7; high4 the same for keys 4-7
  return _mm256_add_epi32(_mm256_permute2x128_si256(low4, high4, 0x20),
                          _mm256_permute2x128_si256(low4, high4, 0x31));
}

// Lane j = sum_d q16[d] * keys[j][d] for 8 keys, exact in int32.
inline __m256i dots8(const int16_t* q16, const int8_t* const keys[8], int64_t dim) {
  __m256i acc[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_si256();
  for (int64_t d = 0; d < dim; d += Q16_DIMS) {
    const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q16 + d));
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(keys[j] + d));
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(qv, _mm256_cvtepi8_epi16(bytes)));
    }
  }
  return transpose_sum8(acc);
}

// scores[j] = (isum_j x step) x scales[j] for keys j in [first, last] of the chunk's 16, isum_j
// the exact int32 sum of q16 with key j's int8 values (dim % 16 == 0, dim <= Q16_MAX_DIM).
inline void score16(const int16_t* q16, float step, const int8_t* const keys[KEYS],
                    const float scales[KEYS], int64_t dim, int first, int last, float* scores) {
  const __m256 steps = _mm256_set1_ps(step);
  for (int half = 0; half < 2; ++half) {
    const int j0 = 8 * half;
    if (last < j0 || first > j0 + 7) continue;
    const __m256 sums = _mm256_cvtepi32_ps(dots8(q16, keys + j0, dim));
    const __m256 out = _mm256_mul_ps(_mm256_mul_ps(sums, steps), _mm256_loadu_ps(scales + j0));
    if (first <= j0 && last >= j0 + 7) {
      _mm256_storeu_ps(scores + j0, out);
    } else {  // not VMASKMOVPS: a masked store is microcoded on AMD's Zen (~10x a store)
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, out);
      for (int j = std::max(first, j0); j <= std::min(last, j0 + 7); ++j) scores[j] = lanes[j - j0];
    }
  }
}

// p . V over one chunk of 16 keys for R rows (dim % 16 == 0): row r's weights w_j = probs[r *
// probs_stride + j] x scales[j] for keys j in [first, last] (the rest weigh 0), rounded to int16
// steps of max w / 32767, summed with the int8 values two keys a lane (VPUNPCK{L,H}WD
// interleaves them), sums[r * dim + d] = fma(isum, step, sums[r * dim + d]).
template <int R>
inline void weigh16_rows(const float* probs, int64_t probs_stride, int first, int last,
                         const float scales[KEYS], const int8_t* const values[KEYS], float* sums,
                         int64_t dim) {
  alignas(32) int16_t weights[R][KEYS];  // row r's int16 weights; pairs (2i, 2i + 1) as int32
  float steps[R];
  const __m256i masks[2] = {lane_mask(first, last), lane_mask(first - 8, last - 8)};
  for (int r = 0; r < R; ++r) {
    __m256 w[2];
    for (int half = 0; half < 2; ++half) {
      const __m256 p = _mm256_maskload_ps(probs + r * probs_stride + 8 * half, masks[half]);
      w[half] = _mm256_mul_ps(p, _mm256_loadu_ps(scales + 8 * half));
    }
    const float max = reduce_max(_mm256_max_ps(w[0], w[1]));  // p and scales are >= 0
    steps[r] = max / 32767.0f;
    const __m256 inverse = _mm256_set1_ps(max > 0.0f ? 32767.0f / max : 0.0f);
    for (int half = 0; half < 2; ++half) {
      _mm_store_si128(reinterpret_cast<__m128i*>(weights[r] + 8 * half),
                      to_int16(_mm256_mul_ps(w[half], inverse)));
    }
  }
  for (int64_t d = 0; d < dim; d += Q16_DIMS) {
    __m256i acc[R][2];  // [dims 0-3 | 8-11], [dims 4-7 | 12-15] of these 16
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int t = 0; t < KEYS; t += 2) {
      const __m256i a = _mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(values[t] + d)));
      const __m256i b = _mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(values[t + 1] + d)));
      const __m256i low = _mm256_unpacklo_epi16(a, b), high = _mm256_unpackhi_epi16(a, b);
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, weights[r] + t, sizeof(pair));
        const __m256i pairs = _mm256_set1_epi32(pair);
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(low, pairs));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(high, pairs));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 step = _mm256_set1_ps(steps[r]);
      const __m256i in_order[2] = {_mm256_permute2x128_si256(acc[r][0], acc[r][1], 0x20),
                                   _mm256_permute2x128_si256(acc[r][0], acc[r][1], 0x31)};
      for (int k = 0; k < 2; ++k) {
        float* out = sums + r * dim + d + 8 * k;
        _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_cvtepi32_ps(in_order[k]), step,
                                              _mm256_loadu_ps(out)));
      }
    }
  }
}

// weigh16_rows for `rows` rows that see the same keys, 4 rows at a time.
inline void weigh16(const float* probs, int64_t probs_stride, int first, int last,
                    const float scales[KEYS], const int8_t* const values[KEYS], float* sums,
                    int64_t dim, int64_t rows) {
  for (int64_t r = 0; r < rows; r += 4) {
    const float* pr = probs + r * probs_stride;
    float* sr = sums + r * dim;
    switch (rows - r >= 4 ? 4 : rows - r) {
      case 4: weigh16_rows<4>(pr, probs_stride, first, last, scales, values, sr, dim); break;
      case 3: weigh16_rows<3>(pr, probs_stride, first, last, scales, values, sr, dim); break;
      case 2: weigh16_rows<2>(pr, probs_stride, first, last, scales, values, sr, dim); break;
      default: weigh16_rows<1>(pr, probs_stride, first, last, scales, values, sr, dim);
    }
  }
}

}  // namespace avx2_int8
