// e^x on GCC vector types (any width: the caller's float vector V and int32 vector IV of as
// many lanes), for the softmaxes of the CPU attention (cpu_attention.cpp) and the sampler's
// candidates (sampling_ops.cpp). No libm call per lane, no -ffast-math.
#pragma once

namespace vec_exp {

// e^x for x <= 0 (scores minus their row max), to ~2 ulp: 2^n * e^r with |r| <= ln2/2 and a
// degree-6 Taylor polynomial; inputs below -87 flush to ~0 (never a denormal or a NaN).
template <typename V, typename IV>
inline V exp_nonpositive(V x) {
  x = x < -87.0f ? V{} - 87.0f : x;
  // Round to nearest by truncation: x * log2(e) <= 0, so subtracting 0.5 then truncating
  // towards zero rounds; n in [-126, 0].
  const IV n_int = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, IV);
  const V n = __builtin_convertvector(n_int, V);
  const V r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  V p = r * (1.0f / 720) + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const IV bits = (n_int + 127) << 23;
  return p * reinterpret_cast<const V&>(bits);
}

}  // namespace vec_exp
