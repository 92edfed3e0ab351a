// What the integer-activation linears share (q4_q8_matmul.cpp: 4-bit weights, q8_0_q8_matmul.cpp:
// Q8_0 weights; each with int8 or int16 activations): the activations quantized per row and group
// of 32 columns inside the op, each group's products summed exactly in int32 by AVX512-VNNI, and
// the float32 sum over groups, batch-invariant.
//
// Per activation row and group g of 32 columns, with L = 127 (int8) or 32767 (int16):
//   d = max|x| / L (float32), xq = nearbyint(x / d) (half to even) clamped to [-L, L], all 0
//   where d == 0; sx = the group's float32 sum of the original x, in column order;
// per output row: isum = the group's sum of w_int * xq in int32, and
//   acc = fma(scale * d, float(isum), acc) [; acc = fma(offset, sx, acc) for 4-bit weights],
// groups in order from 0 (int8_activations.py has the formula in torch, the tests' reference).
// Rounding x to L steps costs up to d / 2 a value: 1/254 of the group's largest |x| for int8,
// 1/65534 for int16 (far below bfloat16's 2^-9). Nothing else is rounded but the float32 steps
// above, whose order never changes: the threads share the output rows in units of 32, never K,
// and the quantization is per row, so every output is the same whatever M and the thread count.
//
// The weights are one stream of 4-byte lanes per unit of 32 output rows (the formats' .cpp files
// give the layouts): per chunk of input columns, two 64-byte vectors, lane i = output row i.
// A lane is split into int32 vectors of the instruction's operand by a shift and a mask, and
// each is multiplied by one int32 broadcast of the activations:
// - int8, vpdpbusd (u8 x s8, 4 products a lane): the weight bytes as unsigned;
// - int16, vpdpwssd (s16 x s16, 2 products a lane): masking bytes 0 and 2 (or their nibbles)
//   leaves columns c and c + 2 in a lane, so the int16 activations are stored in the order
//   (c, c + 2, c + 1, c + 3) per 4 columns and broadcast as consecutive pairs.
// Weights stored unsigned with a bias (Q8_0's q + 128) subtract bias * sum(xq) per group.
//
// With intrinsics where the compiler has AVX512-VNNI and AVX512-BW (the extension is built
// -march=native); with AVX2 intrinsics where it has AVX2, FMA and F16C (vpmaddwd: s16 x s16
// pairs summed into int32 lanes, then vpaddd: vpdpwssd's sum in two instructions; int8
// activations as s16 pairs of even and of odd bytes, vpdpbusd's sum in four; 8 lanes a vector,
// so a unit's 32 rows are four vectors of int32 sums a row, and a pass takes 2 rows);
// elsewhere plain code. All three run the same operations in the same order: the same bits.
// Where the compiler also has AMX-INT8 and Linux grants the tiles, calls of kAmxMinRows rows or
// more take their integer sums from AMX tiles instead (below), again the same bits.

#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define LAYERSERVE_VNNI 1
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#define LAYERSERVE_AMX 1
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define LAYERSERVE_INT_AVX2 1
#endif

namespace int_activations {

constexpr int64_t kGroup = 32;                  // input columns a group (a GGUF block)
constexpr int64_t kUnitRows = 32;               // output rows a unit: two vectors of 16 lanes
constexpr int64_t kChunkBytes = kUnitRows * 4;  // one chunk of a unit: 128 bytes
// Activation rows sharing one pass over a unit (registers: AVX2 has 16 vector registers, not 32).
#if defined(LAYERSERVE_INT_AVX2)
constexpr int kMaxTile = 2;
#else
constexpr int kMaxTile = 8;
#endif

// Which instructions the integer sums were compiled with: "avx512_vnni", "avx2" or "plain".
inline const char* instruction_set() {
#if defined(LAYERSERVE_VNNI)
  return "avx512_vnni";
#elif defined(LAYERSERVE_INT_AVX2)
  return "avx2";
#else
  return "plain";
#endif
}

template <typename T>
constexpr float kLimit = std::numeric_limits<T>::max();  // 127 or 32767

// Where column j of a group is stored: int16 swaps the middle two of every 4 (see above).
template <typename T>
constexpr int stored_column(int j) {
  return sizeof(T) == 1 || j % 4 == 0 || j % 4 == 3 ? j : j ^ 3;
}

// How a weight format's 4-byte lanes split into the instruction's operands for activations T.
struct Split {
  uint32_t mask;   // after the shift: the weights of one instruction
  int count;       // instructions a lane (its columns / the activation values in an int32)
  int shifts[4];   // per instruction
};

// One group's 32 values -> its xq (stored_column order); returns d.
template <typename T>
float quantize_group(const float* v, T* xq) {
#if defined(LAYERSERVE_VNNI)
  const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float d = amax / kLimit<T>;
  const __m512 divisor = _mm512_set1_ps(d == 0.0f ? 1.0f : d), zero = _mm512_setzero_ps();
  const __m512 low = _mm512_set1_ps(-kLimit<T>), high = _mm512_set1_ps(kLimit<T>);
  for (int half = 0; half < 2; ++half) {
    // the division itself, not a multiply by 1 / d: the reference's rounding exactly
    __m512 r = _mm512_roundscale_ps(_mm512_div_ps(half ? b : a, divisor),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = d == 0.0f ? zero : _mm512_min_ps(_mm512_max_ps(r, low), high);
    if constexpr (sizeof(T) == 1) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + 16 * half),
                       _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
    } else {
      r = _mm512_permute_ps(r, 0xD8);  // (0, 2, 1, 3) in every 4: stored_column
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + 16 * half),
                          _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(r)));
    }
  }
  return d;
#elif defined(LAYERSERVE_INT_AVX2)
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 eights[4], amax8 = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    eights[i] = _mm256_loadu_ps(v + 8 * i);
    amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, eights[i]));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, amax8);
  float amax = 0.0f;
  for (float lane : lanes) amax = std::max(amax, lane);
  const float d = amax / kLimit<T>;
  const __m256 divisor = _mm256_set1_ps(d == 0.0f ? 1.0f : d), zero = _mm256_setzero_ps();
  const __m256 low = _mm256_set1_ps(-kLimit<T>), high = _mm256_set1_ps(kLimit<T>);
  alignas(32) int32_t values[32];
  for (int i = 0; i < 4; ++i) {
    __m256 r = _mm256_round_ps(_mm256_div_ps(eights[i], divisor),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = d == 0.0f ? zero : _mm256_min_ps(_mm256_max_ps(r, low), high);
    _mm256_store_si256(reinterpret_cast<__m256i*>(values + 8 * i), _mm256_cvtps_epi32(r));
  }
  for (int j = 0; j < 32; ++j) xq[stored_column<T>(j)] = static_cast<T>(values[j]);
  return d;
#else
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
  const float d = amax / kLimit<T>;
  for (int j = 0; j < 32; ++j) {
    const float r = d == 0.0f ? 0.0f : std::nearbyint(v[j] / d);  // x / d, as above
    xq[stored_column<T>(j)] = static_cast<T>(std::min(kLimit<T>, std::max(-kLimit<T>, r)));
  }
  return d;
#endif
}

// Per row and group: xq, d, the float sum of x and the integer sum of xq.
template <typename T>
struct Quantized {
  std::vector<T> xq;           // [M, K]
  std::vector<float> d;        // [M, K / 32]
  std::vector<float> sx;       // [M, K / 32]
  std::vector<int32_t> xsum;   // [M, K / 32]
};

template <typename T>
void quantize_row(const float* x, int64_t k, T* xq, float* d, float* sx, int32_t* xsum) {
  const int64_t groups = k / kGroup;
  for (int64_t g = 0; g < groups; ++g) {
    d[g] = quantize_group(x + g * kGroup, xq + g * kGroup);
    int32_t total = 0;
    for (int64_t j = 0; j < kGroup; ++j) total += xq[g * kGroup + j];
    xsum[g] = total;
  }
  // The group sums in column order, groups side by side so that their chains overlap.
  for (int64_t g = 0; g < groups; ++g) sx[g] = 0.0f;
  for (int64_t j = 0; j < kGroup; ++j)
    for (int64_t g = 0; g < groups; ++g) sx[g] += x[g * kGroup + j];
}

template <typename T>
Quantized<T> quantize(const float* x, int64_t rows, int64_t k) {
  const int64_t groups = k / kGroup;
  Quantized<T> q{std::vector<T>(rows * k), std::vector<float>(rows * groups),
                 std::vector<float>(rows * groups), std::vector<int32_t>(rows * groups)};
  // per row, so the same values whatever the thread count; rows below 16 stay on this thread
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row(x + r * k, k, q.xq.data() + r * k, q.d.data() + r * groups,
                   q.sx.data() + r * groups, q.xsum.data() + r * groups);
    }
  });
  return q;
}

inline float to_float(float v) { return v; }
inline float to_float(at::Half v) { return static_cast<float>(v); }

// What the kernel reads of one tile of activation rows (rows k and `groups` apart).
template <typename T>
struct Rows {
  const T* xq;
  const float* d;
  const float* sx;
  const int32_t* xsum;
};

#if defined(LAYERSERVE_VNNI)

inline __m512 load_floats(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_floats(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <typename T>
inline __m512i dot(__m512i acc, __m512i w, __m512i a) {
  if constexpr (sizeof(T) == 1) return _mm512_dpbusd_epi32(acc, w, a);
  else return _mm512_dpwssd_epi32(acc, w, a);
}

// R activation rows against one unit of 32 output rows (w: its bytes; scales: per group
// W::kSets vectors of 32, scale then offset) over all groups -> out[r * out_stride + i] for the
// unit's first `valid` rows. Up to 4 rows, alternate instructions go to two int32 accumulators
// (the chains are half as long; the integers add exactly either way).
template <typename W, typename T, typename P, int R>
void unit_rows(const uint8_t* w, const P* scales, int64_t groups, int64_t k, Rows<T> x,
               float* out, int64_t out_stride, int64_t valid) {
  constexpr Split split = W::template split<T>();
  constexpr int H = R <= 4 ? 2 : 1, per_int32 = 4 / sizeof(T);
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i isum[R][2][H];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 2; ++c)
        for (int h = 0; h < H; ++h) isum[r][c][h] = _mm512_setzero_si512();
    for (int64_t chunk = 0; chunk < kGroup / W::kColumns; ++chunk) {
      const uint8_t* bytes = w + (g * (kGroup / W::kColumns) + chunk) * kChunkBytes;
      const __m512i v[2] = {_mm512_loadu_si512(bytes), _mm512_loadu_si512(bytes + 64)};
      for (int s = 0; s < split.count; ++s) {
        const int h = (chunk * split.count + s) % H;
        __m512i part[2];
        for (int c = 0; c < 2; ++c) {
          part[c] = split.shifts[s] ? _mm512_srli_epi32(v[c], split.shifts[s]) : v[c];
          if (split.mask != 0xFFFFFFFFu)
            part[c] = _mm512_and_si512(part[c], _mm512_set1_epi32(split.mask));
        }
        for (int r = 0; r < R; ++r) {
          int32_t pair;
          std::memcpy(&pair, x.xq + r * k + g * kGroup + chunk * W::kColumns + s * per_int32,
                      sizeof(pair));
          const __m512i a = _mm512_set1_epi32(pair);
          for (int c = 0; c < 2; ++c) isum[r][c][h] = dot<T>(isum[r][c][h], part[c], a);
        }
      }
    }
    const P* set = scales + g * W::kSets * kUnitRows;
    for (int c = 0; c < 2; ++c) {
      const __m512 scale = load_floats(set + c * 16);
      for (int r = 0; r < R; ++r) {
        __m512i sum = H == 2 ? _mm512_add_epi32(isum[r][c][0], isum[r][c][H - 1]) : isum[r][c][0];
        if (W::kBias)
          sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(W::kBias * x.xsum[r * groups + g]));
        const __m512 sd = _mm512_mul_ps(scale, _mm512_set1_ps(x.d[r * groups + g]));
        acc[r][c] = _mm512_fmadd_ps(sd, _mm512_cvtepi32_ps(sum), acc[r][c]);
        if (W::kSets == 2) {
          const __m512 offset = load_floats(set + kUnitRows + c * 16);
          acc[r][c] = _mm512_fmadd_ps(offset, _mm512_set1_ps(x.sx[r * groups + g]), acc[r][c]);
        }
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

#if defined(LAYERSERVE_AMX)

// AMX tiles (from kAmxMinRows rows): per group, the int32 sums of up to 16 activation rows and
// 16 output rows come from one tile multiply (TDPBSSD s8 x s8, TDPBUSD u8 x s8: 16 x 16 x 32
// products), and the float32 steps after it are the VNNI kernel's, in its order: the same bits.
// - weights: a unit's bytes become B tiles of 8 rows of 4 columns x 16 output rows, per group
//   and half, by the int8 split above (4-bit: AND / shift; Q8_0's stored q + 128 XOR 0x80 back
//   to q, so no bias is subtracted: the same integer sums);
// - int8 activations are the A tile as they are; int16 ones, in column order, as two byte
//   planes, x = 256 * hi + lo (lo 0..255 unsigned, hi -128..127), a group's sum being
//   sum w * lo + 256 * sum w * hi, exact in int32 as above.
// A group's sums go through memory (a tile store) to the vector epilogue. Tile registers are not
// renamed, so a group's tile operations wait for the last group's stores (~32 ns a group and
// unit at any row count, Sapphire Rapids); the epilogue of group g runs while the tiles of the
// next kAmxAhead groups are in flight, and a unit's epilogues prefetch the next unit's weights.
// Measured (benchmarks.q4_linear, 1 thread, vector kernel -> tiles, docs/benchmarks.md session
// 17): a step's 4-bit linears 15.1 -> 14.3 ms at 9 rows, 71.4 -> 67.2 at 64; the Q8_0 head 4.9 ->
// 4.2 ms at 9 rows, 20.3 -> 15.7 at 64. Below 4 rows the vector kernel is as fast.
constexpr int64_t kAmxMinRows = 4;
constexpr int kAmxTileRows = 16;      // activation rows a tile (AMX's most)
constexpr int64_t kAmxAhead = 2;  // groups whose tile operations run ahead of the epilogue
constexpr int64_t kAmxSlots = 4;  // groups' sums held: more than kAmxAhead
constexpr int kTileBytes = 512;       // a B tile: 8 rows x 64 bytes

// Whether the process may use AMX: Linux hands out the tile state on request (arch_prctl), once.
inline bool amx_permitted() {
  static const bool permitted = [] {
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return permitted;
}

inline std::atomic<bool>& amx_switch() {
  static std::atomic<bool> on{amx_permitted()};
  return on;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0 and 1: activations (int8: 0; int16: 0 the low plane, 1 the high); 2 and 3: the weights
// of a unit's two halves; 4-7: sums, 4 + 2 * half + plane.
inline void configure_tiles(int rows) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    const bool weights = t == 2 || t == 3;
    config.rows[t] = weights ? kGroup / 4 : rows;
    config.colsb[t] = t < 2 ? kGroup : 64;
  }
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes (the rest of the stores can
  // be dropped), so the instruction is written out with the whole struct as its operand.
  asm volatile("ldtilecfg %0" : : "m"(config));
}

// GCC's _tile_loadd names no memory operand: the stores of the tiles' bytes must not move past it.
inline void tile_bytes_written() { asm volatile("" : : : "memory"); }

// A unit's weights as B tiles: b[((g * 2 + half) * 8 + row) * 64 + lane * 4 + j] = the s8 weight
// of output row 16 * half + lane, column g * 32 + 4 * row + j.
template <typename W>
void weight_tiles(const uint8_t* w, int64_t groups, int8_t* b) {
  static_assert(W::kBias == 0 || W::kBias == 128, "stored as q or q + 128");
  constexpr Split split = W::template split<int8_t>();
  constexpr int64_t chunks = kGroup / W::kColumns;
  const __m512i mask = _mm512_set1_epi32(static_cast<int32_t>(split.mask));
  const __m512i flip = _mm512_set1_epi8(W::kBias ? static_cast<char>(0x80) : 0);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const uint8_t* bytes = w + (g * chunks + chunk) * kChunkBytes;
      for (int half = 0; half < 2; ++half) {
        const __m512i v = _mm512_loadu_si512(bytes + 64 * half);
        for (int s = 0; s < split.count; ++s) {
          __m512i part = split.shifts[s] ? _mm512_srli_epi32(v, split.shifts[s]) : v;
          if (split.mask != 0xFFFFFFFFu) part = _mm512_and_si512(part, mask);
          if (W::kBias) part = _mm512_xor_si512(part, flip);
          const int64_t row = chunk * split.count + s;
          _mm512_storeu_si512(b + (g * 2 + half) * kTileBytes + row * 64, part);
        }
      }
    }
  }
}

// int16 activations (stored_column order) -> the low and high byte planes in column order.
inline void byte_planes(const int16_t* xq, int64_t count, uint8_t* lo, uint8_t* hi) {
  alignas(64) int16_t order[32];
  for (int j = 0; j < 32; ++j) order[j] = static_cast<int16_t>(stored_column<int16_t>(j));
  const __m512i index = _mm512_load_si512(order);
  for (int64_t i = 0; i < count; i += 32) {
    const __m512i v = _mm512_permutexvar_epi16(index, _mm512_loadu_si512(xq + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i), _mm512_cvtepi16_epi8(v));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i),
                        _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
  }
}

// What the tiles and the epilogue share for one tile of activation rows.
template <typename T, typename P>
struct AmxTile {
  const int8_t* b;               // the unit's B tiles (weight_tiles)
  const uint8_t* const* planes;  // activation byte planes [M, K]
  int64_t k, groups, r0;         // r0: the tile's first activation row
  int rows;
  const Quantized<T>* q;
  const P* scales;  // the unit's
  static constexpr int kSums = 2 * sizeof(T) * kAmxTileRows * 16;  // int32 a group
};

// Group g's int32 sums through the tiles into s ([half][plane][row][16]).
template <typename T, typename P>
void amx_sums(const AmxTile<T, P>& t, int64_t g, int32_t* s) {
  _tile_loadd(2, t.b + g * 2 * kTileBytes, 64);
  _tile_loadd(3, t.b + (g * 2 + 1) * kTileBytes, 64);
  _tile_loadd(0, t.planes[0] + t.r0 * t.k + g * kGroup, t.k);
  _tile_zero(4);
  _tile_zero(6);
  if constexpr (sizeof(T) == 1) {
    _tile_dpbssd(4, 0, 2);
    _tile_dpbssd(6, 0, 3);
    _tile_stored(4, s, 64);
    _tile_stored(6, s + 256, 64);
  } else {
    _tile_loadd(1, t.planes[1] + t.r0 * t.k + g * kGroup, t.k);
    _tile_zero(5);
    _tile_zero(7);
    _tile_dpbusd(4, 0, 2);
    _tile_dpbssd(5, 1, 2);
    _tile_dpbusd(6, 0, 3);
    _tile_dpbssd(7, 1, 3);
    _tile_stored(4, s, 64);
    _tile_stored(5, s + 256, 64);
    _tile_stored(6, s + 512, 64);
    _tile_stored(7, s + 768, 64);
  }
}

// Group g's float32 steps for each row from its int32 sums, acc in memory [row][32].
template <typename W, typename T, typename P>
void amx_epilogue(const AmxTile<T, P>& t, int64_t g, const int32_t* sums, float* acc) {
  constexpr int kPlanes = sizeof(T);
  const P* set = t.scales + g * W::kSets * kUnitRows;
  __m512 scale[2], offset[2];
  for (int c = 0; c < 2; ++c) {
    scale[c] = load_floats(set + c * 16);
    offset[c] = W::kSets == 2 ? load_floats(set + kUnitRows + c * 16) : _mm512_setzero_ps();
  }
  for (int r = 0; r < t.rows; ++r) {
    const int64_t at = (t.r0 + r) * t.groups + g;
    const __m512 d = _mm512_set1_ps(t.q->d[at]), sx = _mm512_set1_ps(t.q->sx[at]);
    for (int c = 0; c < 2; ++c) {
      const int32_t* half = sums + c * kPlanes * 256 + r * 16;
      __m512i sum = _mm512_loadu_si512(half);
      if constexpr (kPlanes == 2)
        sum = _mm512_add_epi32(sum, _mm512_slli_epi32(_mm512_loadu_si512(half + 256), 8));
      float* a = acc + r * kUnitRows + c * 16;
      __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(scale[c], d), _mm512_cvtepi32_ps(sum),
                                 _mm512_load_ps(a));
      if (W::kSets == 2) v = _mm512_fmadd_ps(offset[c], sx, v);
      _mm512_store_ps(a, v);
    }
  }
}

template <typename W, typename T, typename P>
void multiply_amx(const Quantized<T>& q, int64_t rows, int64_t k, const uint8_t* packed,
                  const P* scales, int64_t n, float* out) {
  const int64_t groups = k / kGroup, units = (n + kUnitRows - 1) / kUnitRows;
  const int64_t unit_bytes = (k / W::kColumns) * kChunkBytes;
  std::vector<uint8_t> low, high;
  const uint8_t* planes[2] = {reinterpret_cast<const uint8_t*>(q.xq.data()), nullptr};
  if constexpr (sizeof(T) == 2) {
    low.resize(rows * k);
    high.resize(rows * k);
    byte_planes(q.xq.data(), rows * k, low.data(), high.data());
    planes[0] = low.data();
    planes[1] = high.data();
    tile_bytes_written();
  }
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    constexpr int kSums = AmxTile<T, P>::kSums;
    thread_local std::vector<int8_t> b;
    thread_local std::vector<int32_t> sums;
    b.resize(groups * 2 * kTileBytes);
    sums.resize(kAmxSlots * kSums);
    alignas(64) float acc[kAmxTileRows * kUnitRows];
    int configured = 0;
    for (int64_t u = begin; u < end; ++u) {
      weight_tiles<W>(packed + u * unit_bytes, groups, b.data());
      tile_bytes_written();
      const uint8_t* next = u + 1 < end ? packed + (u + 1) * unit_bytes : nullptr;
      const int64_t valid = std::min<int64_t>(kUnitRows, n - u * kUnitRows);
      const __mmask16 first = valid >= 16 ? 0xFFFF : (1u << valid) - 1;
      const __mmask16 second = valid >= 32 ? 0xFFFF : valid <= 16 ? 0 : (1u << (valid - 16)) - 1;
      for (int64_t r0 = 0; r0 < rows; r0 += kAmxTileRows) {
        const int tile = static_cast<int>(std::min<int64_t>(kAmxTileRows, rows - r0));
        if (tile != configured) {
          configure_tiles(tile);
          configured = tile;
        }
        const AmxTile<T, P> t{b.data(), planes, k, groups, r0, tile, &q,
                              scales + u * groups * W::kSets * kUnitRows};
        std::memset(acc, 0, sizeof(acc));
        // Group g's epilogue runs while the tile operations of the next kAmxAhead are in flight
        // (tile registers are not renamed: a group's sums wait for the last group's store).
        const int64_t share = (unit_bytes / groups + 63) / 64 * 64;
        for (int64_t g = 0; g < groups + kAmxAhead; ++g) {
          if (g < groups) amx_sums(t, g, sums.data() + (g % kAmxSlots) * kSums);
          if (next != nullptr && r0 == 0 && g < groups) {  // the next unit's weights, a share a group
            for (int64_t at = g * share; at < std::min(unit_bytes, (g + 1) * share); at += 64)
              _mm_prefetch(reinterpret_cast<const char*>(next + at), _MM_HINT_T1);
          }
          if (g >= kAmxAhead) {
            const int64_t e = g - kAmxAhead;
            amx_epilogue<W, T, P>(t, e, sums.data() + (e % kAmxSlots) * kSums, acc);
          }
        }
        for (int r = 0; r < tile; ++r) {
          float* o = out + (r0 + r) * n + u * kUnitRows;
          _mm512_mask_storeu_ps(o, first, _mm512_load_ps(acc + r * kUnitRows));
          _mm512_mask_storeu_ps(o + 16, second, _mm512_load_ps(acc + r * kUnitRows + 16));
        }
      }
    }
    if (configured) _tile_release();
  });
}

#endif  // LAYERSERVE_AMX

#elif defined(LAYERSERVE_INT_AVX2)

inline __m256 load_floats(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_floats(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The activations of one instruction's columns as the int32s that vpmaddwd pairs with a part:
// int16, one pair; int8, (x0, x2) and (x1, x3) as s16 pairs for the even and the odd bytes, or
// the four bytes as they are (kWhole: vpmaddubsw's operand, below).
template <typename T, bool kWhole = false>
inline void broadcast_pairs(const T* xq, __m256i* pairs) {
  if constexpr (sizeof(T) == 2 || kWhole) {
    int32_t pair;
    std::memcpy(&pair, xq, sizeof(pair));
    pairs[0] = _mm256_set1_epi32(pair);
  } else {
    const auto s16 = [](int8_t v) { return static_cast<uint32_t>(static_cast<uint16_t>(v)); };
    pairs[0] = _mm256_set1_epi32(static_cast<int32_t>(s16(xq[0]) | s16(xq[2]) << 16));
    pairs[1] = _mm256_set1_epi32(static_cast<int32_t>(s16(xq[1]) | s16(xq[3]) << 16));
  }
}

// isum + the lanes' products: int16, one vpmaddwd; int8, the unsigned bytes split into even
// and odd s16 pairs, one vpmaddwd each (u8 x s8 products and their sums are exact in int32).
template <typename T>
inline __m256i dot(__m256i isum, __m256i w, const __m256i* pairs) {
  if constexpr (sizeof(T) == 2) return _mm256_add_epi32(isum, _mm256_madd_epi16(w, pairs[0]));
  const __m256i bytes = _mm256_set1_epi32(0x00FF00FF);
  const __m256i even = _mm256_and_si256(w, bytes);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(w, 8), bytes);
  return _mm256_add_epi32(_mm256_add_epi32(isum, _mm256_madd_epi16(even, pairs[0])),
                          _mm256_madd_epi16(odd, pairs[1]));
}

// As the VNNI kernel, with the unit's 32 rows as four vectors of 8 lanes: per chunk, each of the
// four 32-byte quarters is split and multiplied into its own int32 sums, so the unit's bytes are
// read once, in order (a pass per quarter, reading 32 bytes of every 128, ran at half the
// memory's speed). The float32 sums live in memory (a group's scale and offset touch them once).
constexpr int64_t kPrefetchBytes = 1024;  // 8 chunks ahead: a few % at one row (SmolLM2, Zen 3)

// int8 activations against 4-bit weights (bytes of at most 15 after the split) go through
// vpmaddubsw instead: u8 x s8 products in s16 pairs, which cannot saturate (2 x 15 x 127), summed
// in int16 over the group's 8 instructions (8 x 3810 < 32767), then widened to int32 once by
// vpmaddwd with ones: the same integer sums in 2 instructions a part and row instead of 7.
template <typename W, typename T>
constexpr bool kByteProducts = sizeof(T) == 1 && W::template split<T>().mask == 0x0F0F0F0Fu;

template <typename W, typename T, typename P, int R>
void unit_rows(const uint8_t* w, const P* scales, int64_t groups, int64_t k, Rows<T> x,
               float* out, int64_t out_stride, int64_t valid) {
  constexpr Split split = W::template split<T>();
  constexpr bool bytes16 = kByteProducts<W, T>;
  static_assert(!bytes16 || kGroup / W::kColumns * split.count * 2 * 15 * 127 <= 32767);
  constexpr int per_int32 = 4 / sizeof(T), pair_count = sizeof(T) == 2 || bytes16 ? 1 : 2;
  alignas(32) float acc[R][kUnitRows] = {};
  for (int64_t g = 0; g < groups; ++g) {
    __m256i isum[R][4];
    for (int r = 0; r < R; ++r)
      for (int q = 0; q < 4; ++q) isum[r][q] = _mm256_setzero_si256();
    for (int64_t chunk = 0; chunk < kGroup / W::kColumns; ++chunk) {
      const uint8_t* at = w + (g * (kGroup / W::kColumns) + chunk) * kChunkBytes;
      _mm_prefetch(reinterpret_cast<const char*>(at) + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(at) + kPrefetchBytes + 64, _MM_HINT_T0);
      const auto* bytes = reinterpret_cast<const __m256i*>(at);
      for (int s = 0; s < split.count; ++s) {
        __m256i pairs[R][pair_count];
        for (int r = 0; r < R; ++r)
          broadcast_pairs<T, bytes16>(
              x.xq + r * k + g * kGroup + chunk * W::kColumns + s * per_int32, pairs[r]);
        for (int q = 0; q < 4; ++q) {
          const __m256i v = _mm256_loadu_si256(bytes + q);
          __m256i part = split.shifts[s] ? _mm256_srli_epi32(v, split.shifts[s]) : v;
          if (split.mask != 0xFFFFFFFFu)
            part = _mm256_and_si256(part, _mm256_set1_epi32(static_cast<int32_t>(split.mask)));
          for (int r = 0; r < R; ++r) {
            if constexpr (bytes16) {
              isum[r][q] = _mm256_add_epi16(isum[r][q], _mm256_maddubs_epi16(part, pairs[r][0]));
            } else {
              isum[r][q] = dot<T>(isum[r][q], part, pairs[r]);
            }
          }
        }
      }
    }
    if constexpr (bytes16) {
      for (int r = 0; r < R; ++r)
        for (int q = 0; q < 4; ++q) isum[r][q] = _mm256_madd_epi16(isum[r][q], _mm256_set1_epi16(1));
    }
    const P* set = scales + g * W::kSets * kUnitRows;
    for (int q = 0; q < 4; ++q) {
      const __m256 scale = load_floats(set + 8 * q);
      for (int r = 0; r < R; ++r) {
        __m256i sum = isum[r][q];
        if (W::kBias)
          sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(W::kBias * x.xsum[r * groups + g]));
        const __m256 sd = _mm256_mul_ps(scale, _mm256_set1_ps(x.d[r * groups + g]));
        __m256 a = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(sum), _mm256_load_ps(acc[r] + 8 * q));
        if (W::kSets == 2) {
          const __m256 offset = load_floats(set + kUnitRows + 8 * q);
          a = _mm256_fmadd_ps(offset, _mm256_set1_ps(x.sx[r * groups + g]), a);
        }
        _mm256_store_ps(acc[r] + 8 * q, a);
      }
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(out + r * out_stride, acc[r], valid * sizeof(float));
}

#else  // plain code: the same operations per output, one at a time

template <typename W, typename T, typename P, int R>
void unit_rows(const uint8_t* w, const P* scales, int64_t groups, int64_t k, Rows<T> x,
               float* out, int64_t out_stride, int64_t valid) {
  constexpr Split split = W::template split<T>();
  constexpr int per_int32 = 4 / sizeof(T), bits = 8 * sizeof(T);
  constexpr uint32_t element = (1ull << bits) - 1;
  for (int r = 0; r < R; ++r) {
    for (int64_t i = 0; i < valid; ++i) {
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t isum = 0;
        for (int64_t chunk = 0; chunk < kGroup / W::kColumns; ++chunk) {
          uint32_t lane;
          std::memcpy(&lane, w + (g * (kGroup / W::kColumns) + chunk) * kChunkBytes + i * 4, 4);
          const T* a = x.xq + r * k + g * kGroup + chunk * W::kColumns;
          for (int s = 0; s < split.count; ++s) {
            const uint32_t part = (lane >> split.shifts[s]) & split.mask;
            for (int e = 0; e < per_int32; ++e)
              isum += static_cast<int32_t>((part >> (bits * e)) & element) * a[s * per_int32 + e];
          }
        }
        isum -= W::kBias * x.xsum[r * groups + g];
        const P* set = scales + g * W::kSets * kUnitRows;
        acc = std::fma(to_float(set[i]) * x.d[r * groups + g], static_cast<float>(isum), acc);
        if (W::kSets == 2) acc = std::fma(to_float(set[kUnitRows + i]), x.sx[r * groups + g], acc);
      }
      out[r * out_stride + i] = acc;
    }
  }
}

#endif

template <typename W, typename T, typename P>
using UnitRows = void (*)(const uint8_t*, const P*, int64_t, int64_t, Rows<T>, float*, int64_t,
                          int64_t);

template <typename W, typename T, typename P>
constexpr UnitRows<W, T, P> kUnitRowsFor[9] = {  // by tile rows, 1..8 (up to kMaxTile used)
    nullptr,
    unit_rows<W, T, P, 1>, unit_rows<W, T, P, 2>, unit_rows<W, T, P, 3>, unit_rows<W, T, P, 4>,
    unit_rows<W, T, P, 5>, unit_rows<W, T, P, 6>, unit_rows<W, T, P, 7>, unit_rows<W, T, P, 8>};

// The threads share the units (a split that depends on N only); each unit's bytes (9-24 KB at
// SmolLM2's K) stay in L1 while every tile of rows passes over them.
template <typename W, typename T, typename P>
void multiply(const Quantized<T>& q, int64_t rows, int64_t k, const uint8_t* packed,
              const P* scales, int64_t n, float* out) {
  const int64_t groups = k / kGroup, units = (n + kUnitRows - 1) / kUnitRows;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const uint8_t* w = packed + u * (k / W::kColumns) * kChunkBytes;
      const P* unit_scales = scales + u * groups * W::kSets * kUnitRows;
      const int64_t valid = std::min<int64_t>(kUnitRows, n - u * kUnitRows);
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxTile) {
        const int64_t tile = std::min<int64_t>(kMaxTile, rows - r0);
        const Rows<T> x{q.xq.data() + r0 * k, q.d.data() + r0 * groups,
                        q.sx.data() + r0 * groups, q.xsum.data() + r0 * groups};
        kUnitRowsFor<W, T, P>[tile](w, unit_scales, groups, k, x, out + r0 * n + u * kUnitRows,
                                    n, valid);
      }
    }
  });
}

// Whether calls of kAmxMinRows rows or more use AMX tiles (below), which `use` (when given) sets;
// never where the extension was compiled without AMX or the OS does not permit it.
inline bool use_amx(std::optional<bool> use) {
#if defined(LAYERSERVE_AMX)
  if (use.has_value()) amx_switch().store(*use && amx_permitted());
  return amx_switch().load();
#else
  (void)use;
  return false;
#endif
}

// The op: x [M, K] float32, packed [ceil(n / 32), K / W::kColumns, 128] uint8 and scales
// [ceil(n / 32), K / 32, (W::kSets,) 32] float16 or float32 in W's layout -> [M, n] float32.
template <typename W, typename T>
at::Tensor linear(const char* name, const at::Tensor& x, const at::Tensor& packed,
                  const at::Tensor& scales, int64_t n) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu() && scales.device().is_cpu(),
              "layerserve::", name, ": CPU tensors");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "layerserve::", name, ": x [M, K] float32 contiguous, got ", x.sizes(), " ",
              x.scalar_type());
  const int64_t units = (n + kUnitRows - 1) / kUnitRows;
  TORCH_CHECK(n > 0 && packed.dim() == 3 && packed.scalar_type() == at::kByte &&
                  packed.is_contiguous() && packed.size(0) == units &&
                  packed.size(2) == kChunkBytes,
              "layerserve::", name, ": packed [ceil(N / 32), K / ", W::kColumns,
              ", 128] uint8 contiguous for N = ", n, ", got ", packed.sizes(), " ",
              packed.scalar_type());
  TORCH_CHECK(x.size(1) % kGroup == 0 && packed.size(1) * W::kColumns == x.size(1),
              "layerserve::", name, ": K must divide by 32 and match packed's K / ", W::kColumns,
              ", got x ", x.sizes(), " and packed ", packed.sizes());
  std::vector<int64_t> sizes = {units, x.size(1) / kGroup, kUnitRows};
  if (W::kSets == 2) sizes.insert(sizes.begin() + 2, 2);
  TORCH_CHECK((scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kHalf) &&
                  scales.is_contiguous() && scales.sizes() == at::IntArrayRef(sizes),
              "layerserve::", name, ": ", W::kScalesName, " [ceil(N / 32), K / 32, ",
              W::kSets == 2 ? "2, " : "", "32] float16 or float32 contiguous, got ",
              scales.sizes(), " ", scales.scalar_type());
  const int64_t rows = x.size(0), k = x.size(1);
  at::Tensor out = at::empty({rows, n}, x.options());
  if (rows == 0) return out;
  const Quantized<T> q = quantize<T>(x.data_ptr<float>(), rows, k);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const auto run = [&](const auto* scale_data) {
#if defined(LAYERSERVE_AMX)
    if (rows >= kAmxMinRows && amx_switch().load(std::memory_order_relaxed)) {
      multiply_amx<W, T>(q, rows, k, w, scale_data, n, out.data_ptr<float>());
      return;
    }
#endif
    multiply<W, T>(q, rows, k, w, scale_data, n, out.data_ptr<float>());
  };
  if (scales.scalar_type() == at::kHalf) {
    run(scales.data_ptr<at::Half>());
  } else {
    run(scales.data_ptr<float>());
  }
  return out;
}

}  // namespace int_activations
