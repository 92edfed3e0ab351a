// Paged attention on the CPU that reads the KV cache in place through the block tables: no
// per-step gather of every block (torch_attention.py, the reference this is tested against,
// copies each sequence's blocks into one padded tensor per layer per step).
//
// One call per layer covers the whole flattened batch: decodes and prefill chunks (with a
// cached prefix or not), GQA, sliding windows. Work items are (query tile, KV head): a tile is
// up to QUERY_TILE tokens of one sequence, so the G query heads of a KV head and the tile's
// tokens share every K/V row loaded. Items run on OpenMP threads (at::get_num_threads(), so
// torch.set_num_threads governs them), longest first, dynamically scheduled.
//
// Per item, exact softmax in two passes over the item's key span (not online: the scores of a
// span fit in a thread's buffer, and one max per row keeps the result closest to SDPA):
//   1. scores S[r, t] = q_r . k_t for each row r (token, head) and key t it may see;
//   2. per row: max, exp, sum;
//   3. out_r = sum_t p[r, t] v_t / sum_r.
// K and V rows in float32 or half types are widened to float32 one block at a time; all
// arithmetic is float32. An int8 cache (kv_cache.py: one float32 scale per token and KV head)
// is widened the same way, each row times its scale, with q and out in the model's dtype; with
// AVX512-VNNI a decode over it runs in integers instead (avx512_int8.h's score16 and weigh16).
// Where the compiler targets AVX512-BF16, a bf16 cache is read as it is (avx512_bf16.h):
// VDPBF16PS multiplies its keys by bf16 q, 16 keys at a time, and value rows are widened in
// registers; the widened copies remain for other dtypes, and for bf16 and int8 when asked
// (avx512_bf16=false, the benchmark's "widened").
//
// Built by cpu_attention_ext.py (torch.utils.cpp_extension, from `make install`) and loaded
// with torch.ops.load_library: torch.ops.layerserve.paged_attention.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "vec_exp.h"

#if defined(__AVX512F__)
#include "avx512_sums.h"
#endif
#if defined(__AVX512BF16__)
#include "avx512_bf16.h"
#include "avx512_int8.h"
#define HAS_AVX512_BF16 1
#else
#define HAS_AVX512_BF16 0
#endif
// A decode over an int8 cache in integers on AVX2 where avx512_int8.h's VNNI passes are not
// built in (the same bits: avx2_int8.h).
#if !(HAS_AVX512_BF16 && defined(__AVX512VNNI__)) && defined(__AVX2__) && defined(__FMA__)
#include "avx2_int8.h"
#define HAS_AVX2_INT16 1
#else
#define HAS_AVX2_INT16 0
#endif

#include "layer_ops.h"

namespace {

// Tokens of one sequence per work item in a prefill chunk: 16 tokens x G heads of rows reuse
// each K/V row from L1 while the scores buffer (rows x span floats) stays small.
constexpr int64_t QUERY_TILE = 16;
// Keys a chunk of the 16-key passes (avx512_bf16.h, avx512_int8.h, avx2_int8.h).
constexpr int KEYS = 16;

// GCC/Clang vector extensions, so the hot loops vectorise the same on AVX2 and AVX-512 without
// -ffast-math (which would let the compiler reassociate everything and drop IEEE semantics):
// the reductions below state their own order, lanes first. A vec is one register: 16 lanes
// with AVX-512; 8 on AVX2, whose 16 registers hold accumulate_rows' sums for 2 rows (16-lane
// vecs there were two registers each, and 3 rows' sums spilled: 10x slower decode attention).
#if defined(__AVX512F__)
constexpr int64_t LANES = 16;
constexpr int64_t MAX_ROWS = 4;  // rows accumulate_rows takes at once: R x 4 sums + 4 values
#else
constexpr int64_t LANES = 8;
constexpr int64_t MAX_ROWS = 3;
#endif
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 2
#endif
// Software prefetch of the K/V rows ahead into L2 (prefetcht1), not L1: a chunk's 48+ lines
// into L1 queue behind L1's few outstanding misses and stall the loads they were meant to
// hide. Measured on the SmolLM2 step at 64 x 1k (benchmarks/cpu_attention.py, Zen 5): attention
// 576-600 -> 328-335 ms (float32 KV), 201-207 -> 145-161 ms (int8 KV).
inline void prefetch_l2(const void* address) { __builtin_prefetch(address, 0, 2); }

typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
typedef float vec_u __attribute__((vector_size(LANES * sizeof(float)), aligned(alignof(float))));
typedef float half_vec __attribute__((vector_size(LANES / 2 * sizeof(float))));
typedef float half_vec_u
    __attribute__((vector_size(LANES / 2 * sizeof(float)), aligned(alignof(float))));
typedef int32_t ivec __attribute__((vector_size(LANES * sizeof(int32_t))));

inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline float widen(c10::Half x) { return static_cast<float>(x); }

template <typename T>
inline T narrow(float x) {
  return static_cast<T>(x);  // c10's BFloat16/Half round to nearest even
}

inline vec load(const float* p) { return *reinterpret_cast<const vec_u*>(p); }
inline void store(float* p, vec v) { *reinterpret_cast<vec_u*>(p) = v; }

inline float hsum(vec v) {
  alignas(64) float lanes[LANES];
  store(lanes, v);
  half_vec h = *reinterpret_cast<const half_vec_u*>(lanes) +
               *reinterpret_cast<const half_vec_u*>(lanes + LANES / 2);
  float sum = 0.0f;
  for (int64_t l = 0; l < LANES / 2; ++l) sum += h[l];
  return sum;
}

// dim % LANES == 0 on the vector path (head dims 64, 128, 256, ...); the rest is scalar.
inline float dot(const float* a, const float* b, int64_t dim) {
  if (dim % LANES != 0) {
    float sum = 0.0f;
    for (int64_t d = 0; d < dim; ++d) sum += a[d] * b[d];
    return sum;
  }
  vec acc = load(a) * load(b);
  for (int64_t d = LANES; d < dim; d += LANES) acc += load(a + d) * load(b + d);
  return hsum(acc);
}

// acc[d] += sum_t probs[t] * values[t * stride + d] for t < count: each 16-lane slice of acc
// stays in a register across the keys.
inline void accumulate_row(const float* probs, const float* values, int64_t stride,
                           int64_t count, float* acc, int64_t dim) {
  if (dim % LANES != 0) {
    for (int64_t t = 0; t < count; ++t) {
      for (int64_t d = 0; d < dim; ++d) acc[d] += probs[t] * values[t * stride + d];
    }
    return;
  }
  for (int64_t d = 0; d < dim; d += LANES) {
    vec sum = load(acc + d);
    for (int64_t t = 0; t < count; ++t) sum += probs[t] * load(values + t * stride + d);
    store(acc + d, sum);
  }
}

constexpr int64_t ROW_LANES = 4 * LANES;  // the dims accumulate_rows keeps in registers per row

// accumulate_row for R rows (probs and acc rows probs_stride and dim apart), 64 dims at a time:
// R x 4 independent sums per key instead of one chain per 16 lanes, which waited on each FMA's
// latency. Each sum still adds its keys in order: the same float32 results.
template <int R>
inline void accumulate_rows(const float* probs, int64_t probs_stride, const float* values,
                            int64_t stride, int64_t count, float* acc, int64_t dim) {
  for (int64_t d = 0; d < dim; d += ROW_LANES) {
    vec sums[R][4];
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < 4; ++k) sums[r][k] = load(acc + r * dim + d + k * LANES);
    }
    for (int64_t t = 0; t < count; ++t) {
      const float* v = values + t * stride + d;
      const vec v0 = load(v), v1 = load(v + LANES), v2 = load(v + 2 * LANES),
                v3 = load(v + 3 * LANES);
      for (int r = 0; r < R; ++r) {
        const float pr = probs[r * probs_stride + t];
        sums[r][0] += pr * v0;
        sums[r][1] += pr * v1;
        sums[r][2] += pr * v2;
        sums[r][3] += pr * v3;
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < 4; ++k) store(acc + r * dim + d + k * LANES, sums[r][k]);
    }
  }
}

// accumulate_row for `rows` rows that see the same keys (a token's query heads of one KV head).
inline void accumulate(const float* probs, int64_t probs_stride, const float* values,
                       int64_t stride, int64_t count, float* acc, int64_t dim, int64_t rows) {
  if (dim % ROW_LANES != 0) {
    for (int64_t r = 0; r < rows; ++r) {
      accumulate_row(probs + r * probs_stride, values, stride, count, acc + r * dim, dim);
    }
    return;
  }
  for (int64_t r = 0; r < rows;) {
    const int64_t n = std::min<int64_t>(MAX_ROWS, rows - r);
    const float* pr = probs + r * probs_stride;
    float* ar = acc + r * dim;
    switch (n) {  // a row alone too: 4 chains a key, not one (the same sums)
      case 4: accumulate_rows<4>(pr, probs_stride, values, stride, count, ar, dim); break;
      case 3: accumulate_rows<3>(pr, probs_stride, values, stride, count, ar, dim); break;
      case 2: accumulate_rows<2>(pr, probs_stride, values, stride, count, ar, dim); break;
      default: accumulate_rows<1>(pr, probs_stride, values, stride, count, ar, dim);
    }
    r += n;
  }
}

inline vec exp_nonpositive(vec x) { return vec_exp::exp_nonpositive<vec, ivec>(x); }

// row[t] <- exp(row[t] - max(row)) for t < count; returns their sum.
inline float softmax_numerators(float* row, int64_t count) {
  vec maxes = vec{} - FLT_MAX;
  int64_t t = 0;
  for (; t + LANES <= count; t += LANES) {
    const vec x = load(row + t);
    maxes = x > maxes ? x : maxes;
  }
  float max = -FLT_MAX;
  for (int64_t l = 0; l < LANES; ++l) max = std::max(max, maxes[l]);
  for (; t < count; ++t) max = std::max(max, row[t]);
  vec sums{};
  t = 0;
  for (; t + LANES <= count; t += LANES) {
    const vec e = exp_nonpositive(load(row + t) - max);
    store(row + t, e);
    sums += e;
  }
  float sum = hsum(sums);
  if (t < count) {  // the tail through a padded vector
    alignas(64) float tail[LANES];
    for (int64_t l = 0; l < LANES; ++l) tail[l] = t + l < count ? row[t + l] - max : -FLT_MAX;
    store(tail, exp_nonpositive(load(tail)));
    for (int64_t l = 0; t + l < count; ++l) {
      row[t + l] = tail[l];
      sum += tail[l];
    }
  }
  return sum;
}

// Rows [first, first + count) of one KV head as float32 rows `dim` apart: the cache itself
// when it is float32 (row stride = the cache's token stride), else widened into `scratch`
// (int8 rows times their scales, `scale_stride` apart from `scale`).
template <typename C>
inline const float* rows_as_float(const C* src, int64_t stride, const float* scale,
                                  int64_t scale_stride, int64_t count, int64_t dim,
                                  float* scratch, int64_t* out_stride) {
  if constexpr (std::is_same_v<C, float>) {
    *out_stride = stride;
    return src;
  } else {
    for (int64_t t = 0; t < count; ++t) {
      const C* row = src + t * stride;
      float* dst = scratch + t * dim;
      if constexpr (std::is_same_v<C, int8_t>) {
        const float s = scale[t * scale_stride];
        for (int64_t d = 0; d < dim; ++d) dst[d] = s * static_cast<float>(row[d]);
      } else {
        for (int64_t d = 0; d < dim; ++d) dst[d] = widen(row[d]);
      }
    }
    *out_stride = dim;
    return scratch;
  }
}

struct Layout {
  const int64_t* query_start;
  const int64_t* context_lens;
  const int64_t* block_tables;
  int64_t table_stride;
  int64_t block_size;
  int64_t window;  // 0: none
  int64_t num_seqs;
};

// The first key the query at position `pos` sees (the last is `pos`).
inline int64_t first_key(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

// A work item: up to QUERY_TILE tokens of one sequence, for KV heads [head_begin, head_end).
struct Item {
  int64_t seq;
  int64_t first_token;  // row of the flattened batch
  int64_t num_tokens;
  int64_t head_begin, head_end;
  int64_t cost;  // keys read x tokens x heads, to start the longest items first
};

// Whole tiles (every KV head in one item, so each block's rows are read once, contiguously)
// unless that leaves too few items to keep `threads` busy.
std::vector<Item> make_items(const Layout& layout, int64_t kv_heads, int64_t threads) {
  std::vector<Item> tiles;
  for (int64_t s = 0; s < layout.num_seqs; ++s) {
    const int64_t begin = layout.query_start[s], end = layout.query_start[s + 1];
    const int64_t ctx = layout.context_lens[s];
    for (int64_t t = begin; t < end; t += QUERY_TILE) {
      const int64_t n = std::min(QUERY_TILE, end - t);
      const int64_t first_pos = ctx - (end - t);
      const int64_t span = first_pos + n - first_key(first_pos, layout.window);
      tiles.push_back({s, t, n, 0, kv_heads, span * n * kv_heads});
    }
  }
  std::vector<Item> items;
  if (static_cast<int64_t>(tiles.size()) >= 4 * threads || kv_heads == 1) {
    items = std::move(tiles);
  } else {
    for (const Item& tile : tiles) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        items.push_back({tile.seq, tile.first_token, tile.num_tokens, h, h + 1,
                         tile.cost / kv_heads});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return items;
}

// T: q's and out's dtype; C: the caches' (T, or int8 with scales).
template <typename T, typename C = T>
struct Problem {
  Layout layout;
  const T* q;
  int64_t q_token_stride, q_head_stride;
  const C* k_cache;
  const C* v_cache;
  int64_t block_stride, token_stride, head_stride;  // the caches' (K and V share them)
  const float* k_scale;  // int8 caches: [num_blocks, block_size, Hkv] contiguous; else null
  const float* v_scale;
  T* out;  // [T, H, D] contiguous
  int64_t num_heads, group, dim;
  float scale;
  bool avx512_bf16;  // bf16: avx512_bf16.h's passes where built in; int8: a decode's int16
                     // passes (VNNI); false: widened copies, float32 arithmetic
};

struct Scratch {
  std::vector<float> q, scores, acc, block, inv_sum, q_step;
  std::vector<int16_t> q16;  // a decode's query rows as int16 (avx512_int8.h's score16)
  void reserve(int64_t rows, int64_t span, int64_t dim, int64_t block_size) {
    q.resize(rows * dim);
    q16.resize(rows * dim);
    q_step.resize(rows);
    inv_sum.resize(rows);
    scores.resize(rows * span);
    acc.resize(rows * dim);
    block.resize(std::max<int64_t>(block_size, 16) * dim);  // 16: an int8 chunk's widened keys
  }
};

// The cache lines of tokens [t0, t1] of block `block`, KV heads [h0, h1), into the caches.
template <typename T, typename C>
inline void prefetch_rows(const Problem<T, C>& p, const C* cache, int64_t block, int64_t t0,
                          int64_t t1, int64_t h0, int64_t h1) {
  const int64_t bytes = ((h1 - h0 - 1) * p.head_stride + p.dim) * sizeof(C);
  for (int64_t t = t0; t <= t1; ++t) {
    const char* row = reinterpret_cast<const char*>(
        cache + block * p.block_stride + t * p.token_stride + h0 * p.head_stride);
    for (int64_t offset = 0; offset < bytes; offset += 64) prefetch_l2(row + offset);
  }
}

// Calls fn(head, t0, t1, rows, stride) for each block of keys [lo, hi] of `item` and each of
// its KV heads: rows[(t - t0) * stride + d] is that head's K (or V) of key t, as float32.
// The next block is prefetched while this one is used: blocks are scattered, so the hardware
// prefetcher, which stops at page boundaries, cannot see them coming. scales: an int8 cache's
// (p.k_scale or p.v_scale), else null.
template <typename T, typename C, typename Fn>
void for_each_block(const Problem<T, C>& p, const Item& item, const C* cache,
                    const float* scales, int64_t lo, int64_t hi, Scratch& scratch, Fn&& fn) {
  const int64_t bs = p.layout.block_size;
  const int64_t kv_heads = p.token_stride / p.dim;  // scales are [blocks, bs, Hkv] contiguous
  const int64_t* table = p.layout.block_tables + item.seq * p.layout.table_stride;
  for (int64_t j = lo / bs; j <= hi / bs; ++j) {
    const int64_t t0 = std::max(j * bs, lo), t1 = std::min((j + 1) * bs - 1, hi);
    const int64_t ahead = j + PREFETCH_AHEAD;
    if (j == lo / bs) {  // the first blocks, before any work hides their latency
      for (int64_t n = j; n < std::min(ahead, hi / bs + 1); ++n) {
        prefetch_rows(p, cache, table[n], 0, std::min(bs - 1, hi - n * bs), item.head_begin,
                      item.head_end);
      }
    }
    for (int64_t h = item.head_begin; h < item.head_end; ++h) {
      if (ahead <= hi / bs) {  // spread over the heads, so demand loads are not queued behind
        prefetch_rows(p, cache, table[ahead], 0, std::min(bs - 1, hi - ahead * bs), h, h + 1);
      }
      const C* src = cache + table[j] * p.block_stride + (t0 - j * bs) * p.token_stride +
                     h * p.head_stride;
      const float* scale =
          scales == nullptr ? nullptr : scales + (table[j] * bs + t0 - j * bs) * kv_heads + h;
      int64_t stride;
      const float* rows = rows_as_float(src, p.token_stride, scale, kv_heads, t1 - t0 + 1, p.dim,
                                        scratch.block.data(), &stride);
      fn(h, t0, t1, rows, stride);
    }
  }
}

// Where dim d of an item's sums lies: in place, or as avx512_bf16.h's passes leave it.
inline int64_t lane(int64_t d, [[maybe_unused]] bool bf16_passes,
                    [[maybe_unused]] bool int16_decode) {
#if HAS_AVX512_BF16
  if (bf16_passes) return avx512_bf16::lane_of(d);
#if defined(__AVX512VNNI__)
  if (int16_decode) return avx512_int8::lane_of16(d);
#endif
#endif
  return d;
}

// Where an item's rows look: its first token's position, and keys [lo, hi], the union of the
// rows' spans. Row r = ((h - head_begin) * num_tokens + i) * group + g is query head
// h * group + g of token i; it sees keys [first_key(pos_i), pos_i], pos_i = base_pos + i.
struct Span {
  int64_t base_pos, lo, hi, window, group;
  int64_t size() const { return hi - lo + 1; }
  int64_t first(int64_t i) const { return first_key(base_pos + i, window); }
  int64_t last(int64_t i) const { return base_pos + i; }
  int64_t row(const Item& item, int64_t h, int64_t i, int64_t g) const {
    return ((h - item.head_begin) * item.num_tokens + i) * group + g;
  }
};

// The item's query rows as float32 times the softmax scale, into scratch.q (row r at r * dim).
template <typename T, typename C>
void widen_queries(const Problem<T, C>& p, const Item& item, const Span& s, Scratch& scratch) {
  const int64_t dim = p.dim;
  float* qf = scratch.q.data();
  for (int64_t h = item.head_begin; h < item.head_end; ++h) {
    for (int64_t i = 0; i < item.num_tokens; ++i) {
      for (int64_t g = 0; g < s.group; ++g) {
        const T* src = p.q + (item.first_token + i) * p.q_token_stride +
                       (h * s.group + g) * p.q_head_stride;
        float* dst = qf + s.row(item, h, i, g) * dim;
        for (int64_t d = 0; d < dim; ++d) dst[d] = widen(src[d]) * p.scale;
      }
    }
  }
}

// scores[t] = q . keys[(t - t0) * stride] for keys t in [a, b]: with AVX-512, 16 keys at a time
// (avx512_sums.h's dot16: a score is the same bits whichever 16 keys it is computed with, so a
// decode and a verify step's rows over the same keys agree; one dot and its horizontal sum per
// key took ~4x as long); else one dot a key.
inline void score_rows(const float* q, const float* keys, int64_t stride, int64_t t0,
                       int64_t a, int64_t b, int64_t dim, float* scores) {
#if defined(__AVX512F__)
  if (dim % LANES == 0) {
    for (int64_t c = a; c <= b; c += avx512_sums::KEYS) {
      const int64_t n = std::min<int64_t>(avx512_sums::KEYS, b - c + 1);
      _mm512_mask_storeu_ps(scores + c, static_cast<__mmask16>((1u << n) - 1),
                            avx512_sums::dot16(q, keys + (c - t0) * stride, stride, n, dim));
    }
    return;
  }
#endif
  for (int64_t t = a; t <= b; ++t) scores[t] = dot(q, keys + (t - t0) * stride, dim);
}

// Pass 1 on float32 rows (half types and int8 widened a block at a time):
// scores[r * span + t - lo] = q_r . k_t * scale for every key t row r sees.
template <typename T, typename C>
void score_keys(const Problem<T, C>& p, const Item& item, const Span& s, Scratch& scratch) {
  const int64_t dim = p.dim, span = s.size();
  const float* qf = scratch.q.data();
  float* scores = scratch.scores.data();
  widen_queries(p, item, s, scratch);
  for_each_block(p, item, p.k_cache, p.k_scale, s.lo, s.hi, scratch,
                 [&](int64_t h, int64_t t0, int64_t t1, const float* keys, int64_t stride) {
    for (int64_t i = 0; i < item.num_tokens; ++i) {
      const int64_t a = std::max(t0, s.first(i)), b = std::min(t1, s.last(i));
      for (int64_t g = 0; g < s.group; ++g) {
        const int64_t r = s.row(item, h, i, g);
        score_rows(qf + r * dim, keys, stride, t0, a, b, dim, scores + r * span - s.lo);
      }
    }
  });
}

// Whether this item runs avx512_int8.h's passes (int8 cache, built in, dim fits).
template <typename T, typename C>
bool uses_int8_passes([[maybe_unused]] const Problem<T, C>& p) {
#if HAS_AVX512_BF16
  return std::is_same_v<C, int8_t> && p.dim % avx512_int8::ROW_DIMS == 0;
#else
  return false;
#endif
}

// Whether a decode item over an int8 cache runs int16 passes (score16 and weigh16: VNNI's in
// avx512_int8.h or AVX2's in avx2_int8.h built in, asked for by avx512_bf16; a prefill tile
// keeps the float32 passes).
template <typename T, typename C>
bool uses_int16_decode([[maybe_unused]] const Problem<T, C>& p,
                       [[maybe_unused]] const Item& item) {
#if HAS_AVX512_BF16 && defined(__AVX512VNNI__)
  return uses_int8_passes(p) && p.avx512_bf16 && item.num_tokens == 1 &&
         p.dim <= avx512_int8::Q16_MAX_DIM;
#elif HAS_AVX2_INT16
  return std::is_same_v<C, int8_t> && p.avx512_bf16 && item.num_tokens == 1 &&
         p.dim % 64 == 0 && p.dim <= avx2_int8::Q16_MAX_DIM;  // 64: the VNNI passes' dims
#else
  return false;
#endif
}

#if HAS_AVX512_BF16
static_assert(avx512_bf16::KEYS == KEYS && avx512_sums::KEYS == KEYS);

// Pointers to head 0's rows of keys [first, first + count) of the item's sequence in `cache`,
// through its block table (a chunk may cross blocks); slots past `count` repeat the last key.
inline void key_rows(const Problem<c10::BFloat16>& p, const Item& item, const uint16_t* cache,
                     int64_t first, int64_t count, const uint16_t* rows[KEYS]) {
  const int64_t bs = p.layout.block_size;
  const int64_t* table = p.layout.block_tables + item.seq * p.layout.table_stride;
  int64_t block = first / bs, offset = first % bs;
  for (int j = 0; j < KEYS; ++j) {
    rows[j] = cache + table[block] * p.block_stride + offset * p.token_stride;
    if (j + 1 < count && ++offset == bs) {
      offset = 0;
      ++block;
    }
  }
}

// Calls fn(c, n, rows) for each chunk of keys [c, c + n) of [s.lo, s.hi], n <= 16, with head 0's
// rows of them in `cache` (the item's heads are head_stride further on). Chunks cross blocks;
// the chunk PREFETCH_AHEAD further is prefetched (blocks are scattered: the hardware prefetcher
// cannot see them coming).
template <typename Fn>
void for_each_chunk(const Problem<c10::BFloat16>& p, const Item& item, const c10::BFloat16* cache,
                    const Span& s, Fn&& fn) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(cache);
  const int64_t bytes = ((item.head_end - item.head_begin - 1) * p.head_stride + p.dim) * 2;
  const uint16_t *rows[KEYS], *ahead[KEYS];
  for (int64_t c = s.lo; c <= s.hi; c += KEYS) {
    const int64_t next = c + PREFETCH_AHEAD * KEYS;
    if (next <= s.hi) {
      key_rows(p, item, bits, next, std::min<int64_t>(KEYS, s.hi - next + 1), ahead);
      for (int j = 0; j < KEYS; ++j) {
        const char* row = reinterpret_cast<const char*>(ahead[j] + item.head_begin * p.head_stride);
        for (int64_t offset = 0; offset < bytes; offset += 64) prefetch_l2(row + offset);
      }
    }
    const int64_t n = std::min<int64_t>(KEYS, s.hi - c + 1);
    key_rows(p, item, bits, c, n, rows);
    fn(c, n, rows);
  }
}

// Pass 1 on the bf16 cache by VDPBF16PS, every head and row per chunk of keys (so its K rows
// come from memory once); q stays bf16, read in place; the scale applies to the float32 scores.
void score_keys_bf16(const Problem<c10::BFloat16>& p, const Item& item, const Span& s,
                     Scratch& scratch) {
  const __m512 scale = _mm512_set1_ps(p.scale);
  for_each_chunk(p, item, p.k_cache, s, [&](int64_t c, int64_t n, const uint16_t** rows) {
    const uint16_t* keys[KEYS];
    for (int64_t h = item.head_begin; h < item.head_end; ++h) {
      for (int j = 0; j < KEYS; ++j) keys[j] = rows[j] + h * p.head_stride;
      for (int64_t i = 0; i < item.num_tokens; ++i) {
        const int64_t a = std::max(c, s.first(i)), b = std::min(c + n - 1, s.last(i));
        if (a > b) continue;
        const __mmask16 lanes = static_cast<__mmask16>(((1u << (b - a + 1)) - 1) << (a - c));
        for (int64_t g = 0; g < s.group; ++g) {
          const uint16_t* q = reinterpret_cast<const uint16_t*>(
              p.q + (item.first_token + i) * p.q_token_stride +
              (h * s.group + g) * p.q_head_stride);
          const __m512 dots = avx512_bf16::dot16(q, keys, p.dim);
          float* dst = scratch.scores.data() + s.row(item, h, i, g) * s.size() + (c - s.lo);
          _mm512_mask_storeu_ps(dst, lanes, _mm512_mul_ps(dots, scale));
        }
      }
    }
  });
}

// Pass 2 on the bf16 cache, V rows widened in registers: acc rows in avx512_bf16::lane_of order.
void weigh_values_bf16(const Problem<c10::BFloat16>& p, const Item& item, const Span& s,
                       Scratch& scratch) {
  for_each_chunk(p, item, p.v_cache, s, [&](int64_t c, int64_t n, const uint16_t** rows) {
    const uint16_t* values[KEYS];
    for (int64_t h = item.head_begin; h < item.head_end; ++h) {
      for (int j = 0; j < KEYS; ++j) values[j] = rows[j] + h * p.head_stride;
      for (int64_t i = 0; i < item.num_tokens; ++i) {
        const int64_t a = std::max(c, s.first(i)), b = std::min(c + n - 1, s.last(i));
        if (a > b) continue;
        const int64_t r = s.row(item, h, i, 0);  // the group's rows follow
        avx512_bf16::weigh(scratch.scores.data() + r * s.size() + a - s.lo, s.size(),
                           values + (a - c), b - a + 1, scratch.acc.data() + r * p.dim, p.dim,
                           s.group);
      }
    }
  });
}
#endif

// Flat slots of keys [first, first + count) of the item's sequence, through its block table;
// slots past `count` repeat the last key.
inline void key_slots(const Layout& layout, const Item& item, int64_t first, int64_t count,
                      int64_t slots[KEYS]) {
  const int64_t bs = layout.block_size;
  const int64_t* table = layout.block_tables + item.seq * layout.table_stride;
  int64_t block = first / bs, offset = first % bs;
  for (int j = 0; j < KEYS; ++j) {
    slots[j] = table[block] * bs + offset;
    if (j + 1 < count && ++offset == bs) {
      offset = 0;
      ++block;
    }
  }
}

// for_each_chunk on an int8 cache: fn(c, n, slots) for each chunk of keys [c, c + n) of
// [s.lo, s.hi], n <= 16, with their flat slots (a row lies at slot * token_stride, its scales at
// slot * Hkv). The chunk PREFETCH_AHEAD further is prefetched, rows and scales.
template <typename T, typename Fn>
void for_each_int8_chunk(const Problem<T, int8_t>& p, const Item& item, const int8_t* cache,
                         const float* scales, const Span& s, Fn&& fn) {
  const int64_t kv_heads = p.token_stride / p.dim;
  const int64_t bytes = (item.head_end - item.head_begin - 1) * p.head_stride + p.dim;
  int64_t slots[KEYS], ahead[KEYS];
  for (int64_t c = s.lo; c <= s.hi; c += KEYS) {
    const int64_t next = c + PREFETCH_AHEAD * KEYS;
    if (next <= s.hi) {
      key_slots(p.layout, item, next, std::min<int64_t>(KEYS, s.hi - next + 1), ahead);
      for (int j = 0; j < KEYS; ++j) {
        const int8_t* row = cache + ahead[j] * p.token_stride + item.head_begin * p.head_stride;
        for (int64_t offset = 0; offset < bytes; offset += 64) prefetch_l2(row + offset);
        prefetch_l2(scales + ahead[j] * kv_heads + item.head_begin);
      }
    }
    const int64_t n = std::min<int64_t>(KEYS, s.hi - c + 1);
    key_slots(p.layout, item, c, n, slots);
    fn(c, n, slots);
  }
}

#if HAS_AVX512_BF16
// Pass 1 on an int8 cache (avx512_int8.h): q_r . k_t * scale_t for every row r of the item. A
// decode's few rows are quantized to int16 once and score each key as it lies in the cache
// (VNNI's VPDPWSSD, exact int32 sums, then x step_r x scale_t); without VNNI they widen the keys
// in registers row by row. A prefill tile's many rows read the chunk's keys widened once.
template <typename T>
void score_keys_int8(const Problem<T, int8_t>& p, const Item& item, const Span& s,
                     Scratch& scratch) {
  widen_queries(p, item, s, scratch);
  const int64_t kv_heads = p.token_stride / p.dim;
  float* rows = scratch.block.data();  // [KEYS, dim], the chunk's keys widened
  const bool widen_once = item.num_tokens > 1;
  [[maybe_unused]] const bool q16 = uses_int16_decode(p, item);
#if defined(__AVX512VNNI__)
  const int64_t item_rows = (item.head_end - item.head_begin) * item.num_tokens * s.group;
  for (int64_t r = 0; q16 && r < item_rows; ++r) {
    scratch.q_step[r] = avx512_int8::quantize_query16(scratch.q.data() + r * p.dim, p.dim,
                                                      scratch.q16.data() + r * p.dim);
  }
#endif
  for_each_int8_chunk(p, item, p.k_cache, p.k_scale, s, [&](int64_t c, int64_t n,
                                                            const int64_t* slots) {
    const int8_t* keys[KEYS];
    alignas(64) float scale[KEYS];
    for (int64_t h = item.head_begin; h < item.head_end; ++h) {
      for (int j = 0; j < KEYS; ++j) {
        keys[j] = p.k_cache + slots[j] * p.token_stride + h * p.head_stride;
        scale[j] = p.k_scale[slots[j] * kv_heads + h];
      }
      const __m512 scales = widen_once ? _mm512_set1_ps(1.0f) : _mm512_load_ps(scale);
      if (widen_once) avx512_int8::widen_keys(keys, scale, p.dim, rows);
      for (int64_t i = 0; i < item.num_tokens; ++i) {
        const int64_t a = std::max(c, s.first(i)), b = std::min(c + n - 1, s.last(i));
        if (a > b) continue;
        const __mmask16 lanes = static_cast<__mmask16>(((1u << (b - a + 1)) - 1) << (a - c));
        for (int64_t g = 0; g < s.group; ++g) {
          const int64_t r = s.row(item, h, i, g);
          float* dst = scratch.scores.data() + r * s.size() + (c - s.lo);
#if defined(__AVX512VNNI__)
          if (q16) {
            const __m512i dots = avx512_int8::score16(scratch.q16.data() + r * p.dim, keys, p.dim);
            const __m512 step = _mm512_set1_ps(scratch.q_step[r]);
            _mm512_mask_storeu_ps(dst, lanes,
                                  _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dots), step), scales));
            continue;
          }
#endif
          const float* q = scratch.q.data() + r * p.dim;
          const __m512 dots = widen_once ? avx512_int8::dot16(q, rows, p.dim)
                                         : avx512_int8::dot16(q, keys, p.dim);
          _mm512_mask_storeu_ps(dst, lanes, _mm512_mul_ps(dots, scales));
        }
      }
    }
  });
}

// Pass 2 on an int8 cache: a decode's weights in int16 against the int8 values (VNNI); else
// V rows widened in registers, each key's scale folded into its p.
template <typename T>
void weigh_values_int8(const Problem<T, int8_t>& p, const Item& item, const Span& s,
                       Scratch& scratch) {
  const int64_t kv_heads = p.token_stride / p.dim;
  [[maybe_unused]] const bool int16 = uses_int16_decode(p, item);
  for_each_int8_chunk(p, item, p.v_cache, p.v_scale, s, [&](int64_t c, int64_t n,
                                                            const int64_t* slots) {
    const int8_t* values[KEYS];
    float scale[KEYS];
    for (int64_t h = item.head_begin; h < item.head_end; ++h) {
      for (int j = 0; j < KEYS; ++j) {
        values[j] = p.v_cache + slots[j] * p.token_stride + h * p.head_stride;
        scale[j] = p.v_scale[slots[j] * kv_heads + h];
      }
      for (int64_t i = 0; i < item.num_tokens; ++i) {
        const int64_t a = std::max(c, s.first(i)), b = std::min(c + n - 1, s.last(i));
        if (a > b) continue;
        const int64_t r = s.row(item, h, i, 0);  // the group's rows follow
#if defined(__AVX512VNNI__)
        if (int16) {
          const __mmask16 keys = static_cast<__mmask16>(((1u << (b - a + 1)) - 1) << (a - c));
          avx512_int8::weigh16(scratch.scores.data() + r * s.size() + c - s.lo, s.size(), keys,
                               _mm512_loadu_ps(scale), values, scratch.acc.data() + r * p.dim,
                               p.dim, s.group);
          continue;
        }
#endif
        avx512_int8::weigh(scratch.scores.data() + r * s.size() + a - s.lo, s.size(),
                           values + (a - c), scale + (a - c), b - a + 1,
                           scratch.acc.data() + r * p.dim, p.dim, s.group);
      }
    }
  });
}
#endif

#if HAS_AVX2_INT16
// for_each_int8_chunk for a decode item: fn(h, c, first, last, rows, scales) per chunk of keys
// c.. and KV head h, with the keys [c + first, c + last] its token sees and the chunk's 16 rows
// of head h in `cache` and their scales.
template <typename T, typename Fn>
void for_each_decode_chunk(const Problem<T, int8_t>& p, const Item& item, const int8_t* cache,
                           const float* scales, const Span& s, Fn&& fn) {
  const int64_t kv_heads = p.token_stride / p.dim;
  for_each_int8_chunk(p, item, cache, scales, s, [&](int64_t c, int64_t n, const int64_t* slots) {
    const int64_t a = std::max(c, s.first(0)), b = std::min(c + n - 1, s.last(0));
    if (a > b) return;
    const int8_t* rows[KEYS];
    float scale[KEYS];
    for (int64_t h = item.head_begin; h < item.head_end; ++h) {
      for (int j = 0; j < KEYS; ++j) {
        rows[j] = cache + slots[j] * p.token_stride + h * p.head_stride;
        scale[j] = scales[slots[j] * kv_heads + h];
      }
      fn(h, c, static_cast<int>(a - c), static_cast<int>(b - c), rows, scale);
    }
  });
}

// Pass 1 of a decode over an int8 cache on AVX2 (avx2_int8.h): each row's query rounded to int16
// once, each key scored as it lies in the cache (exact int32 sums, then x step_r x scale_t).
template <typename T>
void score_keys_int16(const Problem<T, int8_t>& p, const Item& item, const Span& s,
                      Scratch& scratch) {
  widen_queries(p, item, s, scratch);
  const int64_t rows = (item.head_end - item.head_begin) * s.group;  // one token
  for (int64_t r = 0; r < rows; ++r) {
    scratch.q_step[r] = avx2_int8::quantize_query16(scratch.q.data() + r * p.dim, p.dim,
                                                    scratch.q16.data() + r * p.dim);
  }
  for_each_decode_chunk(p, item, p.k_cache, p.k_scale, s,
                        [&](int64_t h, int64_t c, int first, int last, const int8_t** keys,
                            const float* scale) {
    for (int64_t g = 0; g < s.group; ++g) {
      const int64_t r = s.row(item, h, 0, g);
      avx2_int8::score16(scratch.q16.data() + r * p.dim, scratch.q_step[r], keys, scale, p.dim,
                         first, last, scratch.scores.data() + r * s.size() + (c - s.lo));
    }
  });
}

// Pass 2 of a decode over an int8 cache on AVX2: each chunk's weights in int16 against the int8
// values, the group's rows together.
template <typename T>
void weigh_values_int16(const Problem<T, int8_t>& p, const Item& item, const Span& s,
                        Scratch& scratch) {
  for_each_decode_chunk(p, item, p.v_cache, p.v_scale, s,
                        [&](int64_t h, int64_t c, int first, int last, const int8_t** values,
                            const float* scale) {
    const int64_t r = s.row(item, h, 0, 0);  // the group's rows follow
    avx2_int8::weigh16(scratch.scores.data() + r * s.size() + (c - s.lo), s.size(), first, last,
                       scale, values, scratch.acc.data() + r * p.dim, p.dim, s.group);
  });
}
#endif

// Pass 2 on float32 rows (half types widened a block at a time): acc_r += p_r . V.
template <typename T, typename C>
void weigh_values(const Problem<T, C>& p, const Item& item, const Span& s, Scratch& scratch) {
  const int64_t span = s.size(), dim = p.dim;
  for_each_block(p, item, p.v_cache, p.v_scale, s.lo, s.hi, scratch,
                 [&](int64_t h, int64_t t0, int64_t t1, const float* values, int64_t stride) {
    for (int64_t i = 0; i < item.num_tokens; ++i) {
      const int64_t a = std::max(t0, s.first(i)), b = std::min(t1, s.last(i));
      if (a > b) continue;
      const int64_t r = s.row(item, h, i, 0);  // the group's rows follow
      accumulate(scratch.scores.data() + r * span + a - s.lo, span, values + (a - t0) * stride,
                 stride, b - a + 1, scratch.acc.data() + r * dim, dim, s.group);
    }
  });
}

// Whether this item runs the AVX512-BF16 passes (bf16 cache, built in, asked for, dim fits).
template <typename T, typename C>
bool uses_avx512_bf16([[maybe_unused]] const Problem<T, C>& p) {
#if HAS_AVX512_BF16
  return std::is_same_v<T, c10::BFloat16> && std::is_same_v<C, T> && p.avx512_bf16 &&
         p.dim % avx512_bf16::PER_LOAD == 0;
#else
  return false;
#endif
}


// One work item: scores, softmax and the weighted values of its rows. Out rows are written by
// this item only.
template <typename T, typename C>
void attend(const Problem<T, C>& p, const Item& item, Scratch& scratch) {
  const int64_t seq_end = p.layout.query_start[item.seq + 1];
  const int64_t ctx = p.layout.context_lens[item.seq];
  const int64_t base_pos = ctx - (seq_end - item.first_token);  // the first token's position
  const Span s{base_pos, first_key(base_pos, p.layout.window), base_pos + item.num_tokens - 1,
               p.layout.window, p.group};
  const int64_t span = s.size(), dim = p.dim, group = p.group, ntok = item.num_tokens;
  const int64_t rows = (item.head_end - item.head_begin) * ntok * group;
  scratch.reserve(rows, span, dim, p.layout.block_size);
  float* scores = scratch.scores.data();
  float* acc = scratch.acc.data();
  float* inv_sum = scratch.inv_sum.data();
  std::fill(acc, acc + rows * dim, 0.0f);
  const bool bf16_passes = uses_avx512_bf16(p), int8_passes = uses_int8_passes(p);
  const bool int16_decode = uses_int16_decode(p, item);
#if HAS_AVX512_BF16
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<C, T>) {
    if (bf16_passes) score_keys_bf16(p, item, s, scratch);
  }
  if constexpr (std::is_same_v<C, int8_t>) {
    if (int8_passes) score_keys_int8(p, item, s, scratch);
  }
#endif
#if HAS_AVX2_INT16
  if constexpr (std::is_same_v<C, int8_t>) {
    if (int16_decode) score_keys_int16(p, item, s, scratch);
  }
#endif
  if (!bf16_passes && !int8_passes && !int16_decode) score_keys(p, item, s, scratch);
  // Softmax per row over its own keys; the numerators replace the scores.
  for (int64_t h = item.head_begin; h < item.head_end; ++h) {
    for (int64_t i = 0; i < ntok; ++i) {
      const int64_t a = s.first(i) - s.lo, b = s.last(i) - s.lo;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = s.row(item, h, i, g);
        inv_sum[r] = 1.0f / softmax_numerators(scores + r * span + a, b - a + 1);
      }
    }
  }
#if HAS_AVX512_BF16
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<C, T>) {
    if (bf16_passes) weigh_values_bf16(p, item, s, scratch);
  }
  if constexpr (std::is_same_v<C, int8_t>) {
    if (int8_passes) weigh_values_int8(p, item, s, scratch);
  }
#endif
#if HAS_AVX2_INT16
  if constexpr (std::is_same_v<C, int8_t>) {
    if (int16_decode) weigh_values_int16(p, item, s, scratch);
  }
#endif
  if (!bf16_passes && !int8_passes && !int16_decode) weigh_values(p, item, s, scratch);
  for (int64_t h = item.head_begin; h < item.head_end; ++h) {
    for (int64_t i = 0; i < ntok; ++i) {
      for (int64_t g = 0; g < group; ++g) {
        const float* sums = acc + s.row(item, h, i, g) * dim;
        const float inv = inv_sum[s.row(item, h, i, g)];
        T* dst = p.out + ((item.first_token + i) * p.num_heads + h * group + g) * dim;
        if (bf16_passes || int16_decode) {
          for (int64_t d = 0; d < dim; ++d) {
            dst[d] = narrow<T>(sums[lane(d, bf16_passes, int16_decode)] * inv);
          }
        } else {  // in place: a loop the compiler vectorises
          for (int64_t d = 0; d < dim; ++d) dst[d] = narrow<T>(sums[d] * inv);
        }
      }
    }
  }
}

// Denormal floats read and written as zero (MXCSR's DAZ and FTZ) on this thread while it lives.
// A softmax weight near e^-87 (vec_exp's floor) times a value, or an int8 value's scale, is
// denormal, and x86 takes a microcode assist of ~100 cycles for each such operation: a prefill
// over an int8 cache whose scores spread widely took 25x its time (benchmarks.cpu_attention's
// random caches, 573 -> 23 ms a layer). Terms below 2^-126 of a softmax's largest change no
// float32 sum they join.
class FlushDenormals {
 public:
#if defined(__SSE__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }  // FTZ | DAZ
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

// Every item on OpenMP threads; a thread keeps its scratch across items, and flushes denormals
// while it attends. Scales: an int8 cache's (C = int8_t), else undefined tensors.
template <typename T, typename C = T>
void attend_all(const Layout& layout, const at::Tensor& q, const at::Tensor& k_cache,
                const at::Tensor& v_cache, const at::Tensor& k_scale, const at::Tensor& v_scale,
                at::Tensor& out, float scale, bool avx512_bf16) {
  const int64_t threads = at::get_num_threads();
  const std::vector<Item> items =
      make_items(layout, k_cache.size(2), threads);
  const bool int8 = std::is_same_v<C, int8_t>;
  const Problem<T, C> p{layout, q.data_ptr<T>(), q.stride(0), q.stride(1),
                        k_cache.data_ptr<C>(), v_cache.data_ptr<C>(), k_cache.stride(0),
                        k_cache.stride(1), k_cache.stride(2),
                        int8 ? k_scale.data_ptr<float>() : nullptr,
                        int8 ? v_scale.data_ptr<float>() : nullptr, out.data_ptr<T>(), q.size(1),
                        q.size(1) / k_cache.size(2), q.size(2), scale, avx512_bf16};
  const int64_t count = static_cast<int64_t>(items.size());
#pragma omp parallel num_threads(static_cast<int>(std::max<int64_t>(1, std::min(threads, count))))
  {
    const FlushDenormals flush;
    Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) attend(p, items[i], scratch);
  }
}

void check_inputs(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& query_start, const at::Tensor& context_lens,
                  const at::Tensor& block_tables) {
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu(),
              "layerserve::paged_attention runs on the CPU");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4, "q [T, H, D], caches [N, bs, Hkv, D]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.strides() == v_cache.strides(),
              "K and V caches must have one shape and layout");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "K and V caches share a dtype");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() || k_cache.scalar_type() == at::kChar,
              "q and the caches must share a dtype (or the caches be int8)");
  TORCH_CHECK(q.size(2) == k_cache.size(3), "q and the caches must share head_dim");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(q.stride(2) == 1 && k_cache.stride(3) == 1, "head_dim must be contiguous");
  // The int8 passes find a token's scales from its row's offset: [blocks, bs, Hkv, D] dense.
  TORCH_CHECK(k_cache.scalar_type() != at::kChar || k_cache.is_contiguous(),
              "int8 caches must be contiguous");
  for (const at::Tensor* t : {&query_start, &context_lens, &block_tables}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(),
                "query_start, context_lens and block_tables must be contiguous int64");
  }
  TORCH_CHECK(query_start.numel() == context_lens.numel() + 1 &&
                  block_tables.size(0) == context_lens.numel(),
              "one context length and block table per sequence");
}

// An int8 cache's scales: [num_blocks, block_size, Hkv] float32 contiguous each; none else.
void check_scales(const at::Tensor& k_cache, const std::optional<at::Tensor>& k_scale,
                  const std::optional<at::Tensor>& v_scale) {
  const bool int8 = k_cache.scalar_type() == at::kChar;
  TORCH_CHECK(int8 == k_scale.has_value() && int8 == v_scale.has_value(),
              "layerserve::paged_attention: scales go with int8 caches, and only with them");
  if (!int8) return;
  for (const at::Tensor& s : {*k_scale, *v_scale}) {
    TORCH_CHECK(s.device().is_cpu() && s.scalar_type() == at::kFloat && s.is_contiguous() &&
                    s.sizes() == k_cache.sizes().slice(0, 3),
                "layerserve::paged_attention: scales [num_blocks, block_size, Hkv] float32");
  }
}

// An int8 cache with q (and out) in T.
at::Tensor& attend_int8(const Layout& layout, const at::Tensor& q, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& k_scale,
                        const at::Tensor& v_scale, at::Tensor& out, float scale,
                        bool int_queries) {
  switch (q.scalar_type()) {
    case at::kFloat:
      attend_all<float, int8_t>(layout, q, k_cache, v_cache, k_scale, v_scale, out, scale,
                                int_queries);
      break;
    case at::kBFloat16:
      attend_all<c10::BFloat16, int8_t>(layout, q, k_cache, v_cache, k_scale, v_scale, out,
                                        scale, int_queries);
      break;
    case at::kHalf:
      attend_all<c10::Half, int8_t>(layout, q, k_cache, v_cache, k_scale, v_scale, out, scale,
                                    int_queries);
      break;
    default:
      TORCH_CHECK(false, "layerserve::paged_attention: q in float32, bfloat16 or float16, not ",
                  q.scalar_type());
  }
  return out;
}

// Whether this build has avx512_bf16.h's passes (compiled for a CPU with AVX512-BF16).
bool has_avx512_bf16() { return HAS_AVX512_BF16; }

// Whether a decode's queries over an int8 cache are scored as int16 (avx512_int8.h's score16
// with VNNI, avx2_int8.h's with AVX2).
bool has_int16_queries() {
#if (HAS_AVX512_BF16 && defined(__AVX512VNNI__)) || HAS_AVX2_INT16
  return true;
#else
  return false;
#endif
}

}  // namespace

namespace layerserve {  // layer_ops.h

// q [T, H, D], caches [num_blocks, block_size, Hkv, D] (the step's K/V already written),
// query_start [S + 1], context_lens [S], block_tables [S, max_blocks] (int64; -1 entries only
// outside each query's window) -> out [T, H, D]. window <= 0: every earlier key. avx512_bf16:
// bf16 caches read by avx512_bf16.h where built in (has_avx512_bf16()); false: widened copies.
// k_scale, v_scale: int8 caches' scales [num_blocks, block_size, Hkv] (q in any float dtype).
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& query_start,
                           const at::Tensor& context_lens, const at::Tensor& block_tables,
                           int64_t window, double scale, bool avx512_bf16,
                           const std::optional<at::Tensor>& k_scale,
                           const std::optional<at::Tensor>& v_scale) {
  check_inputs(q, k_cache, v_cache, query_start, context_lens, block_tables);
  check_scales(k_cache, k_scale, v_scale);
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  const Layout layout{query_start.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(),
                      block_tables.data_ptr<int64_t>(), block_tables.size(1),
                      k_cache.size(1), window, context_lens.numel()};
  const float scale_f = static_cast<float>(scale);
  if (k_cache.scalar_type() == at::kChar) {
    return attend_int8(layout, q, k_cache, v_cache, *k_scale, *v_scale, out, scale_f,
                       avx512_bf16);
  }
  const at::Tensor none;
  switch (q.scalar_type()) {
    case at::kFloat:
      attend_all<float>(layout, q, k_cache, v_cache, none, none, out, scale_f, avx512_bf16);
      break;
    case at::kBFloat16:
      attend_all<c10::BFloat16>(layout, q, k_cache, v_cache, none, none, out, scale_f,
                                avx512_bf16);
      break;
    case at::kHalf:
      attend_all<c10::Half>(layout, q, k_cache, v_cache, none, none, out, scale_f, avx512_bf16);
      break;
    default:
      TORCH_CHECK(false, "layerserve::paged_attention: float32, bfloat16 or float16, not ",
                  q.scalar_type());
  }
  return out;
}

}  // namespace layerserve

TORCH_LIBRARY(layerserve, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor query_start, "
      "Tensor context_lens, Tensor block_tables, int window, float scale, bool avx512_bf16=True, "
      "Tensor? k_scale=None, Tensor? v_scale=None) -> Tensor");
  m.impl("paged_attention", c10::DispatchKey::CPU, &layerserve::paged_attention);
  m.def("has_avx512_bf16() -> bool", &has_avx512_bf16);
  m.def("has_int16_queries() -> bool", &has_int16_queries);
}
