// The transposing reduction that the CPU attention's 16-key passes share (AVX-512F): 16 keys'
// partial sums, one vector of 16 lanes each, become one vector whose lane j is key j's total.
// Every key's 16 lanes are added in the same tree whatever its lane, so a key's score is the
// same bits whichever chunk of 16 it falls in: a decode's one row and a verify step's rows over
// the same keys agree exactly (speculative decoding keeps a proposal only where the sampler picks
// it itself). avx512_bf16.h and avx512_int8.h multiply with their own instructions and reduce
// here; dot16 below is the float32 rows' pass 1 (cpu_attention.cpp's score_keys).
//
// Included by cpu_attention.cpp where the compiler targets AVX-512F.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace avx512_sums {

constexpr int KEYS = 16;

// The reduction leaves slot 4m + k's sum in lane 4k + m: keeping key j's partial sums in slot
// slot(j) puts its score in lane j with no final permute.
constexpr int slot(int j) { return (j % 4) * 4 + j / 4; }

// The reduction's adds: float32 lanes here; avx512_int8.h sums int32 lanes through the same
// shuffles (they move bits, whatever the lanes hold).
struct AddFloats {
  __m512 operator()(__m512 a, __m512 b) const { return _mm512_add_ps(a, b); }
};

// [a's pair sums (8 lanes), b's (8 lanes)]: the upper 256 bits of each added to the lower.
template <typename Add>
inline __m512 fold_halves(__m512 a, __m512 b, Add add) {
  return add(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}

// From two [w, x] halves-folded vectors, quarters [w, x, y, z] of 4 lanes each.
template <typename Add>
inline __m512 fold_quarters(__m512 wx, __m512 yz, Add add) {
  return add(_mm512_shuffle_f32x4(wx, yz, 0x88), _mm512_shuffle_f32x4(wx, yz, 0xDD));
}

// Within each 128-bit quarter: 2 lanes of a's sums, then 2 of b's.
template <typename Add>
inline __m512 fold_pairs(__m512 a, __m512 b, Add add) {
  return add(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
}

// Within each quarter: one lane each of a's and b's two sums.
template <typename Add>
inline __m512 fold_lanes(__m512 a, __m512 b, Add add) {
  return add(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

// Lane 4k + m = the sum of the 16 lanes of v[4m + k]: 30 shuffles and 15 adds for 16 sums.
template <typename Add = AddFloats>
inline __m512 transpose_sum(const __m512 v[KEYS], Add add = {}) {
  __m512 quarters[4];
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    quarters[q] = fold_quarters(fold_halves(v[4 * q], v[4 * q + 1], add),
                                fold_halves(v[4 * q + 2], v[4 * q + 3], add), add);
  }
  return fold_lanes(fold_pairs(quarters[0], quarters[1], add),
                    fold_pairs(quarters[2], quarters[3], add), add);
}

// Lane j = q . keys[j * stride] over `dim` float32 values (dim % 16 == 0) for j < n, n <= 16 (the
// lanes past n repeat the last key): per key one chain of FMAs over its 16-dim slices in order,
// then the reduction above. 64 dims of q stay in registers while the 16 keys pass.
inline __m512 dot16(const float* q, const float* keys, int64_t stride, int64_t n, int64_t dim) {
  __m512 acc[KEYS];
#pragma GCC unroll 16
  for (int s = 0; s < KEYS; ++s) acc[s] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; d += 64) {
    const int64_t slices = std::min<int64_t>(4, (dim - d) / 16);
    __m512 qv[4];
#pragma GCC unroll 4
    for (int64_t v = 0; v < 4; ++v) qv[v] = v < slices ? _mm512_loadu_ps(q + d + 16 * v) : qv[0];
    const float* key = keys + d;
#pragma GCC unroll 16
    for (int j = 0; j < KEYS; ++j) {
#pragma GCC unroll 4
      for (int64_t v = 0; v < 4; ++v) {
        if (v < slices) {
          acc[slot(j)] = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(key + 16 * v), acc[slot(j)]);
        }
      }
      if (j + 1 < n) key += stride;
    }
  }
  return transpose_sum(acc);
}

}  // namespace avx512_sums
