// The sampler's candidates (services/worker/engine/sampler.py, _draw_among_candidates) in one op
// over each row of logits: the k most likely tokens of logits / temperature and the row's
// logsumexp. The torch ops it replaces on the CPU (a copy, the division, topk, logsumexp) took
// ~0.45 ms a row of SmolLM2's 49,152 logits on one core (Zen 5; a whole sampled row ~0.65 ms,
// near a tenth of a batch-1 decode step, and 1 + k times that in a speculative verify step);
// this op takes ~0.04 ms, and the whole row ~0.2.
//
// Per row: s = x / T (a float32 division, as torch's div_), its max m, and
// lse = m + log(sum exp(s - m)) with vec_exp.h's exp (~2 ulp, where torch's is ~1: a
// candidate's probability exp(s - lse) agrees to ~1e-6 relative); the k largest s by a heap
// over one pass (a value ties the kept set's smallest only by a lower token id, which was
// seen first), best first. A row is the same bits whatever shares its batch.
//
// Also the greedy rows' argmax (argmax_rows), for the same reason.
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.top_candidates, argmax_rows.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "vec_exp.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t LANES = 16;
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
typedef float vec_u __attribute__((vector_size(LANES * sizeof(float)), aligned(alignof(float))));
typedef int32_t ivec __attribute__((vector_size(LANES * sizeof(int32_t))));

using Candidate = std::pair<float, int64_t>;  // (s, token id)

// a before b: the larger s, then the lower id. A heap under this keeps its worst on top.
inline bool better(const Candidate& a, const Candidate& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Bit l set where lane l of s is above `worst`.
inline uint32_t above(vec s, float worst) {
#if defined(__AVX512F__)
  return _mm512_cmp_ps_mask(reinterpret_cast<__m512&>(s), _mm512_set1_ps(worst), _CMP_GT_OQ);
#else
  uint32_t bits = 0;
  for (int64_t l = 0; l < LANES; ++l) bits |= static_cast<uint32_t>(s[l] > worst) << l;
  return bits;
#endif
}

// Candidate (s, id) into the heap of the k best (full); returns the new worst kept value.
inline float replace_worst(std::vector<Candidate>& heap, float s, int64_t id) {
  std::pop_heap(heap.begin(), heap.end(), better);
  heap.back() = {s, id};
  std::push_heap(heap.begin(), heap.end(), better);
  return heap.front().first;
}

// One row: s into `scaled` (v floats) and the k best kept in one pass (a chunk of 16 with no
// value above the kept set's worst costs one compare), the sum of exps in a second; the k best
// into values/ids, best first; returns lse.
float row_candidates(const float* x, int64_t v, float t, int64_t k, float* scaled,
                     std::vector<Candidate>& heap, float* values, int64_t* ids) {
  heap.clear();
  float m = -INFINITY;
  int64_t i = 0;
  for (; i < k || (i % LANES != 0 && i < v); ++i) {  // the first k, then up to a whole chunk
    scaled[i] = x[i] / t;
    m = std::max(m, scaled[i]);
    if (i < k) heap.emplace_back(scaled[i], i);
  }
  std::make_heap(heap.begin(), heap.end(), better);
  float worst = heap.front().first;
  for (int64_t j = k; j < i; ++j) {
    if (scaled[j] > worst) worst = replace_worst(heap, scaled[j], j);
  }
  vec maxes = vec{} + m;
  for (; i + LANES <= v; i += LANES) {
    const vec s = *reinterpret_cast<const vec_u*>(x + i) / t;
    *reinterpret_cast<vec_u*>(scaled + i) = s;
    maxes = s > maxes ? s : maxes;
    for (uint32_t bits = above(s, worst); bits != 0; bits &= bits - 1) {
      const int lane = __builtin_ctz(bits);  // in id order: an equal value never displaces
      if (s[lane] > worst) worst = replace_worst(heap, s[lane], i + lane);
    }
  }
  for (int64_t l = 0; l < LANES; ++l) m = std::max(m, maxes[l]);
  for (; i < v; ++i) {
    scaled[i] = x[i] / t;
    m = std::max(m, scaled[i]);
    if (scaled[i] > worst) worst = replace_worst(heap, scaled[i], i);
  }
  vec sums{};
  i = 0;
  for (; i + LANES <= v; i += LANES) {
    sums += vec_exp::exp_nonpositive<vec, ivec>(*reinterpret_cast<const vec_u*>(scaled + i) - m);
  }
  float sum = 0.0f;
  for (int64_t l = 0; l < LANES; ++l) sum += sums[l];
  for (; i < v; ++i) sum += std::exp(scaled[i] - m);
  std::sort_heap(heap.begin(), heap.end(), better);  // best first
  for (int64_t j = 0; j < k; ++j) {
    values[j] = heap[j].first;
    ids[j] = heap[j].second;
  }
  return m + std::log(sum);
}

// logits [R, V] float32, temperature [R] float32 (> 0) -> (values [R, k] float32: the k largest
// logits / temperature, descending; ids [R, k] int64; lse [R] float32).
std::tuple<at::Tensor, at::Tensor, at::Tensor> top_candidates(const at::Tensor& logits,
                                                              const at::Tensor& temperature,
                                                              int64_t k) {
  TORCH_CHECK(logits.device().is_cpu() && temperature.device().is_cpu(),
              "layerserve::top_candidates: CPU tensors");
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat,
              "layerserve::top_candidates: logits [R, V] float32, got ", logits.sizes(), " ",
              logits.scalar_type());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(temperature.dim() == 1 && temperature.size(0) == rows &&
                  temperature.scalar_type() == at::kFloat,
              "layerserve::top_candidates: temperature [R] float32");
  TORCH_CHECK(k >= 1 && k <= vocab, "layerserve::top_candidates: k in [1, V], got ", k);
  const at::Tensor x = logits.contiguous();
  const at::Tensor temps = temperature.contiguous();
  at::Tensor values = at::empty({rows, k}, logits.options());
  at::Tensor ids = at::empty({rows, k}, logits.options().dtype(at::kLong));
  at::Tensor lse = at::empty({rows}, logits.options());
  const float* xp = x.data_ptr<float>();
  const float* tp = temps.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  int64_t* ip = ids.data_ptr<int64_t>();
  float* lp = lse.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::unique_ptr<float[]> scaled(new float[vocab]);  // every value written before read
    std::vector<Candidate> heap;
    heap.reserve(k);
    for (int64_t r = begin; r < end; ++r) {
      lp[r] = row_candidates(xp + r * vocab, vocab, tp[r], k, scaled.get(), heap, vp + r * k,
                             ip + r * k);
    }
  });
  return {values, ids, lse};
}

// The index of a row's largest value, the first where several tie (torch.argmax's answer; a
// NaN counts as the largest, as there). One pass finds the max 16 lanes at a time, a second
// the first lane holding it: ~10 us a row of 49,152 where torch's argmax took ~80.
int64_t row_argmax(const float* x, int64_t v) {
  vec maxes = vec{} - INFINITY;
  ivec nans{};
  int64_t i = 0;
  for (; i + LANES <= v; i += LANES) {
    const vec s = *reinterpret_cast<const vec_u*>(x + i);
    maxes = s > maxes ? s : maxes;
    nans |= s != s;
  }
  float m = -INFINITY;
  bool nan = false;
  for (int64_t l = 0; l < LANES; ++l) {
    m = std::max(m, maxes[l]);
    nan |= nans[l] != 0;
  }
  for (int64_t j = i; j < v; ++j) {
    m = std::max(m, x[j]);
    nan |= std::isnan(x[j]);
  }
  for (int64_t j = 0; j < v; ++j) {
    if (nan ? std::isnan(x[j]) : x[j] == m) return j;
  }
  return 0;  // every value -inf: the first, as torch
}

// logits [R, V] float32 -> [R] int64.
at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.scalar_type() == at::kFloat &&
                  logits.size(1) > 0,
              "layerserve::argmax_rows: logits [R, V > 0] float32 on the CPU, got ",
              logits.sizes(), " ", logits.scalar_type());
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), vocab = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) op[r] = row_argmax(xp + r * vocab, vocab);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def("argmax_rows(Tensor logits) -> Tensor");
  m.impl("argmax_rows", c10::DispatchKey::CPU, &argmax_rows);
  m.def("top_candidates(Tensor logits, Tensor temperature, int k) -> (Tensor, Tensor, Tensor)");
  m.impl("top_candidates", c10::DispatchKey::CPU, &top_candidates);
}
