// out [M, N] = x [M, K] @ W.T for a weight W [N, K] held 4-bit, GGUF's Q4_0 / Q4_1 / Q4_K values
// (int4_weight.py): per group of 32 columns, w = q * scale + offset with q in 0..15, float32
// activations and results. torch's int4pack matmul has no float32 path, so without this op
// every 4-bit linear of a float32 model casts its rows to bfloat16 and back.
//
// Layout (int4_weight.pack_q4_columns): the weight rows in blocks of 64 output rows, and in a
// block, for each pair of input columns (2p, 2p + 1), one byte per row (2p in the low nibble,
// 2p + 1 in the high one, as Int4Weight.nibbles holds them): packed [N / 64, K / 2, 64]. The
// scales and offsets likewise, [N / 64, K / 32, 2, 64], float16 where that is exact (GGUF's d
// and m are; int4_weight.py checks) or float32. So a call reads the weight as one sequential
// stream, 64 bytes (a cache line) a column pair: a batch-1 step is bound by reading weights,
// and several interleaved streams (one per weight row) measured up to 2x slower.
//
// Vector lanes run over output rows (as torch's int4pack kernel does): for each input column,
// x's value is broadcast and multiplied into 64 rows' lanes, so no lane sums are needed. Two
// paths, by the number of activation rows M:
// - up to kStreamMaxRows (decode): each nibble becomes a float as it is used, by a permute of
//   the table 0..15 (which reads only an index's low 4 bits, so the high nibble needs a shift
//   and no mask), and per group sum_k q * x is accumulated in float32 and then scaled: out +=
//   scale * (q . x) + offset * sum(x) (the products q * x are exact; only the rounding order
//   differs from dequantize-then-GEMM). A tile of up to 4 rows shares one pass over a block;
// - more (a decode batch, prefill): a block's weights are decoded to float32, w = q * scale +
//   offset, into a 32 KB scratch a few groups at a time, and a register-tiled kernel multiplies
//   6 rows at a time by it (a float32 GEMM's inner loop): the nibbles are decoded once per
//   panel of up to 120 rows instead of once per 4 rows. The weights are dequantize()'s values
//   exactly and each output is summed in column order, in float32.
// Both split their work so that two threads share it evenly at the model's small N (k_proj's
// 192 rows are 3 blocks): the first by halves of K (a shape-only choice, so results do not
// depend on the thread count), the second by panels of rows.
//
// Written with GCC vector extensions like q8_0_matmul.cpp; the uint8 -> int32 widening, the
// table look-up, the float16 loads and the fused multiply-add name AVX-512 instructions, with
// plain code as the fallback.
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.q4_linear.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "layer_ops.h"

namespace {

constexpr int64_t kGroup = 32;  // weights per group (a GGUF Q4 block)
constexpr int kLanes = 16;
constexpr int kBlockVectors = 4;                     // vectors of lanes a block of rows spans
constexpr int64_t kBlockRows = kLanes * kBlockVectors;  // output rows a block: 64
constexpr int kTileRows = 4;  // activation rows sharing one pass over a block (registers)
// Streaming (up to kStreamMaxRows rows): K is halved into two work items below this many blocks.
constexpr int64_t kSplitBelowBlocks = 16;
constexpr int64_t kStreamMaxRows = 4;  // more rows: decode to float32 once, then register tiles
constexpr int kPanelTile = 6;          // activation rows a decoded-path tile (registers)
constexpr int64_t kChunkGroups = 4;    // groups decoded at a time: 128 x 64 float32, 32 KB
constexpr int64_t kPanelRows = 120;    // most rows sharing a decoded chunk (x's chunk in L2)
constexpr int64_t kMinPanelRows = 24;  // fewest, where panels are cut for threads
constexpr int64_t kMinItems = 8;       // work items wanted for two threads to share evenly

typedef float FloatLanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t IntLanes __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline FloatLanes load_floats(const float* p) {
  FloatLanes v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store_floats(float* p, FloatLanes v) { std::memcpy(p, &v, sizeof(v)); }

inline FloatLanes broadcast(float v) {
#if defined(__AVX512F__)
  return reinterpret_cast<FloatLanes>(_mm512_set1_ps(v));
#else
  return FloatLanes{} + v;
#endif
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline FloatLanes load_floats(const at::Half* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<FloatLanes>(
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#else
  FloatLanes v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(p[i]);
  return v;
#endif
}

// 16 bytes -> 16 int32 lanes (zero-extended).
inline IntLanes load_bytes(const uint8_t* p) {
#if defined(__AVX512F__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return reinterpret_cast<IntLanes>(_mm512_cvtepu8_epi32(bytes));
#else
  IntLanes v;
  for (int i = 0; i < kLanes; ++i) v[i] = p[i];
  return v;
#endif
}

// float(q[i] & 15) for each lane.
inline FloatLanes nibble_values(IntLanes q) {
  const FloatLanes table = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#if defined(__AVX512F__)
  return reinterpret_cast<FloatLanes>(
      _mm512_permutexvar_ps(reinterpret_cast<__m512i>(q), reinterpret_cast<__m512>(table)));
#else
  return __builtin_convertvector(q & 15, FloatLanes);
#endif
}

// acc + a * b, rounded once where the CPU has FMA.
inline FloatLanes multiply_add(FloatLanes a, FloatLanes b, FloatLanes acc) {
#if defined(__AVX512F__)
  return reinterpret_cast<FloatLanes>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a),
                                                      reinterpret_cast<__m512>(b),
                                                      reinterpret_cast<__m512>(acc)));
#else
  return acc + a * b;
#endif
}

// R activation rows (x: row r at x + r * k; xsum: their group sums, k / 32 apart) against C
// vectors of a block of 64 weight rows, from vector c0, over `groups` groups (packed: the
// block's bytes from the first group's first column pair; pairs: from the first group's) ->
// out[r * out_stride + i] for those of the C * 16 rows below `valid`. R * C accumulators, their
// group sums and R broadcast columns stay in registers: 1 x 4, 2 x 4 and 4 x 2 fit AVX-512's 32.
// One row alone gets two group sums per vector (even and odd columns), so that enough
// multiply-adds are in flight.
template <typename P, int R, int C>
void block_rows(const uint8_t* packed, const P* pairs, int64_t groups, int64_t k, const float* x,
                const float* xsum, float* out, int64_t out_stride, int64_t valid, int c0) {
  constexpr int H = R == 1 ? 2 : 1;
  const int64_t xsum_stride = k / kGroup;
  FloatLanes acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = FloatLanes{};
  for (int64_t g = 0; g < groups; ++g) {
    FloatLanes dot[R][C][H];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c)
        for (int h = 0; h < H; ++h) dot[r][c][h] = FloatLanes{};
    for (int64_t p = 0; p < kGroup / 2; ++p) {
      const uint8_t* bytes = packed + (g * kGroup / 2 + p) * kBlockRows;
      FloatLanes even[R], odd[R];
      for (int r = 0; r < R; ++r) {
        even[r] = FloatLanes{} + x[r * k + g * kGroup + 2 * p];
        odd[r] = FloatLanes{} + x[r * k + g * kGroup + 2 * p + 1];
      }
      for (int c = 0; c < C; ++c) {
        const IntLanes q = load_bytes(bytes + (c0 + c) * kLanes);
        const FloatLanes low = nibble_values(q), high = nibble_values(q >> 4);
        for (int r = 0; r < R; ++r) {
          dot[r][c][0] = multiply_add(low, even[r], dot[r][c][0]);
          dot[r][c][H - 1] = multiply_add(high, odd[r], dot[r][c][H - 1]);
        }
      }
    }
    const P* pair = pairs + g * 2 * kBlockRows;
    for (int c = 0; c < C; ++c) {
      const FloatLanes scale = load_floats(pair + (c0 + c) * kLanes);
      const FloatLanes offset = load_floats(pair + kBlockRows + (c0 + c) * kLanes);
      for (int r = 0; r < R; ++r) {
        const FloatLanes sum = H == 2 ? dot[r][c][0] + dot[r][c][H - 1] : dot[r][c][0];
        acc[r][c] = multiply_add(scale, sum, acc[r][c]);
        acc[r][c] = multiply_add(offset, FloatLanes{} + xsum[r * xsum_stride + g], acc[r][c]);
      }
    }
  }
  const int64_t first = c0 * kLanes, count = std::min<int64_t>(C * kLanes, valid - first);
  if (count <= 0) return;
  for (int r = 0; r < R; ++r) {
    float lanes[C * kLanes];
    for (int c = 0; c < C; ++c) std::memcpy(lanes + c * kLanes, &acc[r][c], sizeof(acc[r][c]));
    std::memcpy(out + r * out_stride + first, lanes, count * sizeof(float));
  }
}

template <typename P>
using BlockRows = void (*)(const uint8_t*, const P*, int64_t, int64_t, const float*,
                           const float*, float*, int64_t, int64_t, int);

// A tile of `tile` activation rows over one block: one pass of all four vectors for one or two
// rows, two passes of two vectors for three or four (what fits in registers).
template <typename P>
void tile_block(int64_t tile, const uint8_t* packed, const P* pairs, int64_t groups, int64_t k,
                const float* x, const float* xsum, float* out, int64_t out_stride,
                int64_t valid) {
  constexpr BlockRows<P> whole[3] = {nullptr, block_rows<P, 1, 4>, block_rows<P, 2, 4>};
  constexpr BlockRows<P> halves[5] = {nullptr, nullptr, nullptr, block_rows<P, 3, 2>,
                                      block_rows<P, 4, 2>};
  if (tile <= 2) {
    whole[tile](packed, pairs, groups, k, x, xsum, out, out_stride, valid, 0);
    return;
  }
  for (int c0 = 0; c0 < kBlockVectors; c0 += 2) {
    halves[tile](packed, pairs, groups, k, x, xsum, out, out_stride, valid, c0);
  }
}

// Up to kStreamMaxRows rows: each nibble decoded as it is used (the weight read once, as one
// stream; batch-1 decode is bound by that read). The work items are (block, half of K) while
// there are fewer than kSplitBelowBlocks blocks, so that two threads share k_proj's 3 blocks or
// o_proj's 9 evenly: the second halves' sums go to `second` and are added after. The split
// depends on the shape only, so the result is the same for any number of threads.
template <typename P>
void multiply_streaming(const float* x, int64_t rows, int64_t k, const uint8_t* packed,
                        const P* pairs, int64_t n, float* out) {
  const int64_t groups = k / kGroup, blocks = (n + kBlockRows - 1) / kBlockRows;
  std::vector<float> xsum(rows * groups);  // each group's sum of x
  for (int64_t i = 0; i < rows * groups; ++i) {
    float total = 0.0f;
    for (int64_t j = 0; j < kGroup; ++j) total += x[i * kGroup + j];
    xsum[i] = total;
  }
  const int64_t parts = blocks < kSplitBelowBlocks && groups >= 2 ? 2 : 1;
  std::vector<float> second(parts > 1 ? rows * n : 0);
  at::parallel_for(0, blocks * parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / parts, part = item % parts;
      const int64_t g0 = groups * part / parts, g1 = groups * (part + 1) / parts;
      const int64_t valid = std::min<int64_t>(kBlockRows, n - b * kBlockRows);
      const uint8_t* block = packed + (b * (k / 2) + g0 * kGroup / 2) * kBlockRows;
      const P* block_pairs = pairs + (b * groups + g0) * 2 * kBlockRows;
      float* dst = part == 0 ? out : second.data();
      for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
        const int64_t tile = std::min<int64_t>(kTileRows, rows - r0);
        tile_block(tile, block, block_pairs, g1 - g0, k, x + r0 * k + g0 * kGroup,
                   xsum.data() + r0 * groups + g0, dst + r0 * n + b * kBlockRows, n, valid);
      }
    }
  });
  for (size_t i = 0; i < second.size(); ++i) out[i] += second[i];
}

// A block's weights for `groups` groups (packed, pairs: from the first one) as float32 into
// w [groups * 32, 64]: w = q * scale + offset, dequantize()'s value (GGUF's scales have at most
// 17 significant bits, so q * scale is exact and the fused add rounds once, as its add does).
template <typename P>
void decode_chunk(const uint8_t* packed, const P* pairs, int64_t groups, float* w) {
  for (int64_t g = 0; g < groups; ++g) {
    FloatLanes scale[kBlockVectors], offset[kBlockVectors];
    for (int c = 0; c < kBlockVectors; ++c) {
      scale[c] = load_floats(pairs + g * 2 * kBlockRows + c * kLanes);
      offset[c] = load_floats(pairs + g * 2 * kBlockRows + kBlockRows + c * kLanes);
    }
    for (int64_t p = 0; p < kGroup / 2; ++p) {
      const uint8_t* bytes = packed + (g * kGroup / 2 + p) * kBlockRows;
      float* even = w + (g * kGroup + 2 * p) * kBlockRows;
      for (int c = 0; c < kBlockVectors; ++c) {
        const IntLanes q = load_bytes(bytes + c * kLanes);
        const FloatLanes low = nibble_values(q), high = nibble_values(q >> 4);
        store_floats(even + c * kLanes, multiply_add(low, scale[c], offset[c]));
        store_floats(even + kBlockRows + c * kLanes, multiply_add(high, scale[c], offset[c]));
      }
    }
  }
}

// acc [R, 64] += R activation rows (x, k apart) times a decoded chunk w [columns, 64]: R x 4
// accumulators in registers (6 x 4 = 24 of AVX-512's 32, beside the four weight vectors), each
// weight vector loaded once for R rows, each x value broadcast once for four vectors.
template <int R>
void rows_times_chunk(const float* w, int64_t columns, const float* x, int64_t k, float* acc) {
  FloatLanes a[R][kBlockVectors];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kBlockVectors; ++c) a[r][c] = load_floats(acc + r * kBlockRows + c * kLanes);
  for (int64_t j = 0; j < columns; ++j) {
    FloatLanes wv[kBlockVectors];
    for (int c = 0; c < kBlockVectors; ++c) wv[c] = load_floats(w + j * kBlockRows + c * kLanes);
    for (int r = 0; r < R; ++r) {
      const FloatLanes xr = broadcast(x[r * k + j]);
      for (int c = 0; c < kBlockVectors; ++c) a[r][c] = multiply_add(wv[c], xr, a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kBlockVectors; ++c) store_floats(acc + r * kBlockRows + c * kLanes, a[r][c]);
}

using RowsTimesChunk = void (*)(const float*, int64_t, const float*, int64_t, float*);
constexpr RowsTimesChunk kRowsTimesChunk[kPanelTile + 1] = {
    nullptr,
    rows_times_chunk<1>,
    rows_times_chunk<2>,
    rows_times_chunk<3>,
    rows_times_chunk<4>,
    rows_times_chunk<5>,
    rows_times_chunk<6>};

// More rows: per (panel of rows, block) work item, the block's weights are decoded to float32
// kChunkGroups groups at a time (64 KB, in L1/L2) and every row of the panel, kPanelTile at a
// time, is multiplied by the chunk, summing in column order: the weight is decoded once per
// panel instead of once per 4 rows. Panels are at most kPanelRows (their x chunk stays in L2),
// and, with more than one thread, shorter when there are few blocks, so that the threads have
// work to share (each panel decodes the block again; a row's sums are the same either way).
template <typename P>
void multiply_decoded(const float* x, int64_t rows, int64_t k, const uint8_t* packed,
                      const P* pairs, int64_t n, float* out) {
  const int64_t groups = k / kGroup, blocks = (n + kBlockRows - 1) / kBlockRows;
  const int64_t for_threads = at::get_num_threads() > 1 ? ceil_div(kMinItems, blocks) : 1;
  const int64_t wanted = std::max<int64_t>(
      ceil_div(rows, kPanelRows), std::min(ceil_div(rows, kMinPanelRows), for_threads));
  const int64_t panel_rows = ceil_div(ceil_div(rows, wanted), kPanelTile) * kPanelTile;
  const int64_t panels = ceil_div(rows, panel_rows);
  at::parallel_for(0, panels * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(kChunkGroups * kGroup * kBlockRows), acc(panel_rows * kBlockRows);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item % blocks, r0 = item / blocks * panel_rows;
      const int64_t count = std::min(panel_rows, rows - r0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t g0 = 0; g0 < groups; g0 += kChunkGroups) {
        const int64_t chunk = std::min(kChunkGroups, groups - g0);
        const uint8_t* bytes = packed + (b * (k / 2) + g0 * kGroup / 2) * kBlockRows;
        decode_chunk(bytes, pairs + (b * groups + g0) * 2 * kBlockRows, chunk, w.data());
        // the next chunk's bytes start coming from memory while this one is multiplied
        const int64_t ahead = std::min(kChunkGroups, groups - g0 - chunk) * kGroup / 2;
        for (int64_t line = 0; line < ahead; ++line) {
          __builtin_prefetch(bytes + (chunk * kGroup / 2 + line) * kBlockRows);
        }
        for (int64_t t = 0; t < count; t += kPanelTile) {
          const int64_t tile = std::min<int64_t>(kPanelTile, count - t);
          kRowsTimesChunk[tile](w.data(), chunk * kGroup, x + (r0 + t) * k + g0 * kGroup, k,
                                acc.data() + t * kBlockRows);
        }
      }
      const int64_t valid = std::min<int64_t>(kBlockRows, n - b * kBlockRows);
      for (int64_t r = 0; r < count; ++r) {
        std::memcpy(out + (r0 + r) * n + b * kBlockRows, acc.data() + r * kBlockRows,
                    valid * sizeof(float));
      }
    }
  });
}

template <typename P>
void multiply(const float* x, int64_t rows, int64_t k, const uint8_t* packed, const P* pairs,
              int64_t n, float* out) {
  if (rows <= kStreamMaxRows) {
    multiply_streaming(x, rows, k, packed, pairs, n, out);
  } else {
    multiply_decoded(x, rows, k, packed, pairs, n, out);
  }
}

void check(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& pairs, int64_t n) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu() && pairs.device().is_cpu(),
              "layerserve::q4_linear: CPU tensors");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "layerserve::q4_linear: x [M, K] float32 contiguous");
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  TORCH_CHECK(n > 0 && packed.dim() == 3 && packed.scalar_type() == at::kByte &&
                  packed.is_contiguous() && packed.size(0) == blocks &&
                  packed.size(2) == kBlockRows,
              "layerserve::q4_linear: packed [ceil(N / 64), K / 2, 64] uint8 contiguous for N = ",
              n, ", got ", packed.sizes());
  TORCH_CHECK(x.size(1) % kGroup == 0 && packed.size(1) * 2 == x.size(1),
              "layerserve::q4_linear: K must divide by 32 and match packed's K / 2, got x ",
              x.sizes(), " and packed ", packed.sizes());
  TORCH_CHECK((pairs.scalar_type() == at::kFloat || pairs.scalar_type() == at::kHalf) &&
                  pairs.is_contiguous() && pairs.dim() == 4 && pairs.size(0) == blocks &&
                  pairs.size(1) == x.size(1) / kGroup && pairs.size(2) == 2 &&
                  pairs.size(3) == kBlockRows,
              "layerserve::q4_linear: pairs [ceil(N / 64), K / 32, 2, 64] float16 or float32 "
              "contiguous, got ", pairs.sizes(), " ", pairs.scalar_type());
}

}  // namespace

namespace layerserve {  // layer_ops.h

// x [M, K] float32; packed and pairs as int4_weight.pack_q4_columns makes them; n: the weight's
// rows (the last block may be partly padding) -> [M, n] float32.
at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& pairs,
                     int64_t n) {
  check(x, packed, pairs, n);
  const int64_t rows = x.size(0), k = x.size(1);
  at::Tensor out = at::empty({rows, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint8_t* q = packed.data_ptr<uint8_t>();
  if (pairs.scalar_type() == at::kHalf) {
    multiply(xp, rows, k, q, pairs.data_ptr<at::Half>(), n, out.data_ptr<float>());
  } else {
    multiply(xp, rows, k, q, pairs.data_ptr<float>(), n, out.data_ptr<float>());
  }
  return out;
}

}  // namespace layerserve

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def("q4_linear(Tensor x, Tensor packed, Tensor pairs, int n) -> Tensor");
  m.impl("q4_linear", c10::DispatchKey::CPU, &layerserve::q4_linear);
}
