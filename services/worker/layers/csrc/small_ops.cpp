// The torch backend's small per-layer ops (torch_ops.py) as one op each from Python: at batch 1
// on the CPU each op called from Python costs its dispatch (a few µs), more than its arithmetic.
//
// silu_mul is written out with torch's own exp where the CPU has AVX2 (the same bits as
// torch_ops.silu_mul's ATen calls, checked once per process), else makes those calls from C++.
//
// rms_norm and add_rms_norm_ are written out, and give torch_ops.rms_norm's bits: the only
// rounding-order-sensitive step of a norm is the sum of squares, and torch's CPU sum has a
// fixed order (aten/src/ATen/native/cpu/SumKernel.cpp, "cascade sum") that sum_of_squares
// below follows step for step; the rest is one rounding per elementwise op, in the same order
// as the ATen ops torch_ops.rms_norm reaches (_fused_rms_norm on the CPU: x * x, sum, / d,
// + eps, 1 / sqrt, x * r, then * weight in x's dtype). Making those ATen calls from C++
// instead was tried first and is not what this does: it gave the stack another greedy token
// in one float32 e2e run though a unit test found the same bits. The bits are checked by
// tests/unit/worker/test_cpu_rope.py against torch_ops.rms_norm, and once per process by
// matches_torch(), which makes the ops fall back to torch's if they ever differ (another torch,
// another vector width).
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.silu_mul, rms_norm, add_rms_norm_.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "layer_ops.h"

namespace {

// [T, 2I] (gate | up) -> silu(gate) * up [T, I], the silu in place in gate_up's first half
// (torch_ops.silu_mul, op for op).
at::Tensor aten_silu_mul(at::Tensor gate_up) {
  auto halves = gate_up.chunk(2, -1);
  return at::silu_(halves[0]) * halves[1];
}

#if defined(__AVX2__) && defined(__FMA__)
// torch's own vectorised exp (libtorch_cpu exports Sleef): ATen's silu kernel computes
// x / (1 + exp(-x)) on Vectorized<float>, 8 lanes with this exp (the AVX2 kernels: see the
// sum below), then the product with up is one rounding: written out here, the same bits in
// one pass over gate_up, without the five dispatches (chunk, silu_, mul and their views) that
// took ~5 us a layer at batch 1 for ~2 us of arithmetic. Checked once per process
// (silu_matches_torch), as the norms are.
extern "C" __m256 Sleef_expf8_u10(__m256);

// gate_up [T, 2I] float32 contiguous, I % 8 == 0 -> [T, I].
at::Tensor written_silu_mul(const at::Tensor& gate_up) {
  const int64_t tokens = gate_up.size(0), inter = gate_up.size(1) / 2;
  at::Tensor out = at::empty({tokens, inter}, gate_up.options());
  const float* src = gate_up.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* gate = src + t * 2 * inter;
    for (int64_t i = 0; i < inter; i += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      const __m256 e = Sleef_expf8_u10(_mm256_xor_ps(g, sign));
      const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
      _mm256_storeu_ps(dst + t * inter + i, _mm256_mul_ps(silu, _mm256_loadu_ps(gate + inter + i)));
    }
  }
  return out;
}

// Whether written_silu_mul gives torch's bits, on values across silu's range (large negative,
// where exp(-x) overflows to inf, to large positive).
bool silu_matches_torch() {
  static const bool matches = [] {
    const at::Tensor i = at::arange(4 * 2 * 512, at::kFloat);
    const at::Tensor x = ((i * 0.61).sin() * (i.remainder(37) * 3 - 50)).view({4, 2 * 512});
    if (!at::equal(written_silu_mul(x), aten_silu_mul(x.clone()))) {
      TORCH_WARN("layerserve::silu_mul: torch's silu rounds otherwise here; using its ops");
      return false;
    }
    return true;
  }();
  return matches;
}
#endif

// torch's float sum is AVX2's Vectorized<float> of 8 lanes, on AVX512 CPUs too (measured: its
// bits match 8 lanes, not 16, with torch 2.13 on an AVX512 CPU).
constexpr int64_t kLanes = 8;
constexpr int64_t kIlp = 4;        // row_sum's ilp_factor
constexpr int64_t kLevels = 4;     // multi_row_sum's num_levels

int64_t ceil_log2(int64_t x) {  // ATen's utils::CeilLog2
  if (x <= 2) return 1;
  int64_t bits = 0;
  for (uint64_t v = static_cast<uint64_t>(x) - 1; v != 0; v >>= 1) ++bits;
  return bits;
}

// torch's cascade sum of a contiguous row of `n` float32 values, in its order. The row is seen
// as `count` "elements" of `lanes` values each (element i: values [i * lanes, (i + 1) * lanes)),
// every lane summed on its own as a Vectorized<float> lane would be; lanes == 1 is the scalar
// path. partial[k] receives, per lane, the sum of elements i with i % 4 == k (multi_row_sum's
// levels: blocks of 2^p elements summed, then the block sums, and so on), then the elements
// past the last group of four go into partial[0], and the four partials are added in order.
// fp-contract off: no a + b * c may become one FMA, as no ATen op here rounds once.
__attribute__((optimize("fp-contract=off"))) void lane_row_sum(const float* x, int64_t count,
                                                               int64_t lanes, float* out) {
  const int64_t groups = count / kIlp;
  const int64_t power = std::max<int64_t>(4, ceil_log2(groups) / kLevels);
  const int64_t step = int64_t{1} << power, mask = step - 1;
  float acc[kLevels][kIlp][kLanes] = {};
  auto add_group = [&](int64_t i) {
    for (int64_t k = 0; k < kIlp; ++k) {
      const float* element = x + (i * kIlp + k) * lanes;
      for (int64_t l = 0; l < lanes; ++l) acc[0][k][l] += element[l];
    }
  };
  int64_t i = 0;
  while (i + step <= groups) {
    for (int64_t j = 0; j < step; ++j, ++i) add_group(i);
    for (int64_t level = 1; level < kLevels; ++level) {
      for (int64_t k = 0; k < kIlp; ++k) {
        for (int64_t l = 0; l < lanes; ++l) {
          acc[level][k][l] += acc[level - 1][k][l];
          acc[level - 1][k][l] = 0.0f;
        }
      }
      if ((i & (mask << (level * power))) != 0) break;
    }
  }
  for (; i < groups; ++i) add_group(i);
  for (int64_t level = 1; level < kLevels; ++level) {
    for (int64_t k = 0; k < kIlp; ++k) {
      for (int64_t l = 0; l < lanes; ++l) acc[0][k][l] += acc[level][k][l];
    }
  }
  for (int64_t e = groups * kIlp; e < count; ++e) {
    for (int64_t l = 0; l < lanes; ++l) acc[0][0][l] += x[e * lanes + l];
  }
  for (int64_t k = 1; k < kIlp; ++k) {
    for (int64_t l = 0; l < lanes; ++l) acc[0][0][l] += acc[0][k][l];
  }
  std::copy(acc[0][0], acc[0][0] + lanes, out);
}

// sum(x[i]^2) over a row of d squares as torch.sum gives it (vectorized_inner_sum: the lanes'
// partial sums from lane_row_sum, the tail past the last whole vector summed first, then each
// lane added in order; rows shorter than a vector take the scalar path, which is one lane).
__attribute__((optimize("fp-contract=off"))) float sum_of_squares(const float* squares,
                                                                  int64_t d) {
  const int64_t lanes = d < kLanes ? 1 : kLanes;
  const int64_t vectors = d / lanes;
  float partials[kLanes];
  lane_row_sum(squares, vectors, lanes, partials);
  float total = 0.0f;
  for (int64_t e = vectors * lanes; e < d; ++e) total += squares[e];
  for (int64_t l = 0; l < lanes; ++l) total += partials[l];
  return total;
}

// One row: out = (x * r) * weight with r = 1 / sqrt(sum(x^2) / d + eps), each op rounded as
// torch_ops.rms_norm's are: x * r rounded to T before the weight's product (the half-precision
// path's .to(dtype) then weight * ...; for float32 both are float32 roundings).
template <typename T>
__attribute__((optimize("fp-contract=off"))) void norm_row(const T* x, const T* weight, T* out,
                                                           int64_t d, float eps, float* squares) {
  for (int64_t i = 0; i < d; ++i) {
    const float v = static_cast<float>(x[i]);
    squares[i] = v * v;
  }
  const float mean = sum_of_squares(squares, d) / static_cast<float>(d);
  const float r = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < d; ++i) {
    const T normed = static_cast<T>(static_cast<float>(x[i]) * r);
    out[i] = static_cast<T>(static_cast<float>(weight[i]) * static_cast<float>(normed));
  }
}

// Rows of x [T, d] normed into out; when `residual` is given, it is first updated in place to
// residual + x (rounded to T, as torch's add rounds it) and normed instead of x.
template <typename T>
void norm_rows(const at::Tensor& x, at::Tensor* residual, const at::Tensor& weight,
               at::Tensor& out, double eps) {
  const int64_t d = x.size(1);
  const float eps32 = static_cast<float>(eps);  // as add_(eps) rounds it for a float tensor
  const T* w = weight.data_ptr<T>();
  const T* src = x.data_ptr<T>();
  T* sums = residual != nullptr ? residual->data_ptr<T>() : nullptr;
  T* dst = out.data_ptr<T>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t begin, int64_t end) {
    std::vector<float> squares(d);
    for (int64_t t = begin; t < end; ++t) {
      const T* row = src + t * d;
      if (sums != nullptr) {
        T* sum = sums + t * d;
        for (int64_t i = 0; i < d; ++i) {
          sum[i] = static_cast<T>(static_cast<float>(sum[i]) + static_cast<float>(row[i]));
        }
        row = sum;
      }
      norm_row<T>(row, w, dst + t * d, d, eps32, squares.data());
    }
  });
}

void check(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(),
              "layerserve::rms_norm: x [T, d] contiguous on the CPU");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1) &&
                  weight.scalar_type() == x.scalar_type(),
              "layerserve::rms_norm: weight [d] contiguous in x's dtype");
}

at::Tensor normed(const at::Tensor& x, at::Tensor* residual, const at::Tensor& weight,
                  double eps) {
  at::Tensor out = at::empty_like(x);
  switch (x.scalar_type()) {
    case at::kFloat:
      norm_rows<float>(x, residual, weight, out, eps);
      break;
    case at::kBFloat16:
      norm_rows<c10::BFloat16>(x, residual, weight, out, eps);
      break;
    case at::kHalf:
      norm_rows<c10::Half>(x, residual, weight, out, eps);
      break;
    default:
      TORCH_CHECK(false, "layerserve::rms_norm: float32, bfloat16 or float16, not ",
                  x.scalar_type());
  }
  return out;
}

// torch_ops.rms_norm's ATen calls: what the ops below make instead if the written-out norm
// does not give their bits (matches_torch).
at::Tensor aten_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t d = x.size(1);
  if (x.scalar_type() == at::kFloat) return at::rms_norm(x, {d}, weight, eps);
  return weight * at::rms_norm(x.to(at::kFloat), {d}, std::nullopt, eps).to(x.scalar_type());
}

// Whether the written-out norm gives torch's float32 bits, checked once per process on rows
// of several widths (shorter than a vector, with a tail, long enough for the cascade's
// levels) and magnitudes; a torch whose sum is ordered otherwise gets its own ops, slower.
bool matches_torch() {
  static const bool matches = [] {
    for (int64_t d : {7, 64, 100, 576, 2304, 5000}) {
      const at::Tensor i = at::arange(8 * d, at::kFloat);
      const at::Tensor x = ((i * 0.37).sin() * (i.remainder(29) + 1)).view({8, d});
      const at::Tensor w = (at::arange(d, at::kFloat) * 0.11).cos();
      if (!at::equal(normed(x, nullptr, w, 1e-6), aten_rms_norm(x, w, 1e-6))) {
        TORCH_WARN("layerserve::rms_norm: torch's sum is ordered otherwise; using its ops");
        return false;
      }
    }
    return true;
  }();
  return matches;
}

}  // namespace

namespace layerserve {  // layer_ops.h

// [T, 2I] (gate | up) -> silu(gate) * up [T, I]: written out where it gives torch's bits.
at::Tensor silu_mul(at::Tensor gate_up) {
#if defined(__AVX2__) && defined(__FMA__)
  if (gate_up.scalar_type() == at::kFloat && gate_up.dim() == 2 && gate_up.is_contiguous() &&
      gate_up.size(1) % 16 == 0 && silu_matches_torch()) {
    return written_silu_mul(gate_up);
  }
#endif
  return aten_silu_mul(gate_up);
}

// x [T, d] -> [T, d], torch_ops.rms_norm's bits.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check(x, weight);
  return matches_torch() ? normed(x, nullptr, weight, eps) : aten_rms_norm(x, weight, eps);
}

// residual += x in place, then rms_norm(residual): a pre-norm block's residual add fused into
// the next norm (x = x + f(x); h = norm(x), in one op). residual and x [T, d] contiguous.
at::Tensor add_rms_norm_(at::Tensor residual, const at::Tensor& x, const at::Tensor& weight,
                         double eps) {
  check(residual, weight);
  TORCH_CHECK(x.sizes() == residual.sizes() && x.is_contiguous() &&
                  x.scalar_type() == residual.scalar_type(),
              "layerserve::add_rms_norm_: x like residual [T, d], contiguous");
  if (!matches_torch()) return aten_rms_norm(residual.add_(x), weight, eps);
  return normed(x, &residual, weight, eps);
}

}  // namespace layerserve

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def("silu_mul(Tensor(a!) gate_up) -> Tensor");
  m.impl("silu_mul", c10::DispatchKey::CPU, &layerserve::silu_mul);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.impl("rms_norm", c10::DispatchKey::CPU, &layerserve::rms_norm);
  m.def("add_rms_norm_(Tensor(a!) residual, Tensor x, Tensor weight, float eps) -> Tensor");
  m.impl("add_rms_norm_", c10::DispatchKey::CPU, &layerserve::add_rms_norm_);
}
