// out [M, N] = x [M, K] @ W.T for a 4-bit weight W [N, K] (Int4Weight's values: per group of 32
// input columns and output row, w = q * scale + offset, q in 0..15), with the activations
// quantized to integers per group inside the op and each group's products summed exactly in
// int32 by AVX512-VNNI, or AVX2 where the CPU has no VNNI (int_activations.h: the formula, the
// kernels, batch invariance):
// - q4_q8_linear: int8 activations, vpdpbusd (u8 x s8, 64 products an instruction), as
//   llama.cpp's Q8 blocks do;
// - q4_q16_linear: int16 activations, vpdpwssd (s16 x s16, 32 products an instruction: half
//   vpdpbusd's rate, twice float32 FMA's).
// torch.ops.layerserve.q4_linear (q4_matmul.cpp) multiplies the float32 x instead: from 3 rows
// on it is bound by float32 multiply-adds, so a speculative verify step of 1 + k rows costs
// nearly k + 1 plain steps; here a row costs a few integer instructions per 32 or 64 products.
//
// Exact in int32: a group's sum is at most 32 * 15 * 127 (int8) or 32 * 15 * 32767 = 15,728,160
// (int16) in magnitude, below 2^31 (and below 2^24, so float(isum) is exact too).
//
// Against float32 sums this changes one thing that matters: x is rounded to L steps per group
// (L = 127 or 32767), an error of up to d / 2 a value, which multiplies q * scale (0..15 steps
// above the group's minimum, not centred on 0): on random Gaussian data an int8 output is ~1.2%
// (relative RMS) off the float32 product with the same weights, an int16 one ~256x less, where
// q4_linear is ~1e-7 off. The offset part (offset * sum x) stays in float32. Measured on whole
// models (benchmarks/perplexity.py, float32 + the GGUF's 4-bit weights kept, the Q8_0 head with
// the same activations; perplexity over float32 dense, top-1 = float32's, mean KL):
//   SmolLM2-135M Q4_1: int16 +0.00%, 99.97%, 6.4e-7 nats; int8 +1.09%, 90.97%, 0.033;
//   Gemma 3 270M Q4_K: int16 +0.00%, 99.96%, 2e-7 nats;   int8 +1.28%, 96.18%, 0.012
// (q4_linear: +0.00%, 100%). Greedy, 24 prompts x 32 tokens (benchmarks/default_choice.py,
// SmolLM2): int16act equals float32 dense on 24 (q4_linear 24, int8act 4). Per kind of linear
// (SmolLM2, int8 activations in that kind alone, 2,048 tokens): q/k/v cost a mean KL of 0.014
// nats, gate/up and down 0.008 each, o 0.001.
//
// Layout (int8_activations.pack_q4_q8, both ops): output rows in units of 32 (two vectors of 16
// int32 lanes, the last unit padded with zero rows); in a unit, per 8 input columns c..c+7,
// lane i = row i's 8 nibbles as 4 bytes, byte j = q[c + j] | q[c + 4 + j] << 4: packed [N / 32,
// K / 8, 32 * 4] uint8. So AND 0x0F gives the u8 operand of columns c..c+3 and a shift by 4
// (then the AND) that of c+4..c+7; for int16, AND 0x000F000F after shifts of 0, 8, 4 and 12
// gives s16 pairs of columns (c, c+2), (c+1, c+3), (c+4, c+6), (c+5, c+7). A unit's bytes are
// one sequential stream (128 bytes, two cache lines, per 8 columns) and the units follow one
// another, so each thread reads its share of the weight as one stream. The scales and offsets
// likewise: pairs [N / 32, K / 32, 2, 32], float16 where exact, or float32.
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.q4_q8_linear, q4_q16_linear.

#include <torch/library.h>

#include <string>

#include "int_activations.h"

#include "layer_ops.h"

namespace {

// The layout above, for int_activations.h's kernel.
struct Q4Weights {
  static constexpr int64_t kColumns = 8;  // input columns a lane: two nibbles a byte
  static constexpr int kSets = 2;         // scale and offset per group and row
  static constexpr int32_t kBias = 0;
  static constexpr const char* kScalesName = "pairs";
  template <typename T>
  static constexpr int_activations::Split split() {
    return sizeof(T) == 1 ? int_activations::Split{0x0F0F0F0Fu, 2, {0, 4}}
                          : int_activations::Split{0x000F000Fu, 4, {0, 8, 4, 12}};
  }
};

std::string instruction_set() { return int_activations::instruction_set(); }

}  // namespace

namespace layerserve {  // layer_ops.h

// x [M, K] float32; packed and pairs as int8_activations.pack_q4_q8 makes them; n: the weight's
// rows (the last unit may be partly padding) -> [M, n] float32.
at::Tensor q4_q8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& pairs,
                        int64_t n) {
  return int_activations::linear<Q4Weights, int8_t>("q4_q8_linear", x, packed, pairs, n);
}

at::Tensor q4_q16_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& pairs,
                         int64_t n) {
  return int_activations::linear<Q4Weights, int16_t>("q4_q16_linear", x, packed, pairs, n);
}

}  // namespace layerserve

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def("q4_q8_linear(Tensor x, Tensor packed, Tensor pairs, int n) -> Tensor");
  m.impl("q4_q8_linear", c10::DispatchKey::CPU, &layerserve::q4_q8_linear);
  m.def("q4_q16_linear(Tensor x, Tensor packed, Tensor pairs, int n) -> Tensor");
  m.impl("q4_q16_linear", c10::DispatchKey::CPU, &layerserve::q4_q16_linear);
  m.def("int_activations_isa() -> str", &instruction_set);
  m.def("int_activations_amx(bool? use=None) -> bool", &int_activations::use_amx);
}
