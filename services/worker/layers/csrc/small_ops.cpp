// The torch backend's SiLU-mul (torch_ops.py) as one op from Python: the same ATen calls in the
// same order, so the same bits, but at batch 1 on the CPU each op called from Python costs its
// dispatch (a few µs); from C++ the three calls cost far less.
//
// Not RMSNorm: torch_ops.rms_norm's ATen calls made the same way from C++ gave the stack other
// greedy tokens (tests/e2e/test_reference.py, float32), though equal bit for bit in a unit test;
// at::rms_norm below the autograd keys may take another path. Not investigated further.
//
// Built into the same library as cpu_attention.cpp (cpu_attention_ext.py):
// torch.ops.layerserve.silu_mul.

#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

// [T, 2I] (gate | up) -> silu(gate) * up [T, I], the silu in place in gate_up's first half
// (torch_ops.silu_mul, op for op).
at::Tensor silu_mul(at::Tensor gate_up) {
  auto halves = gate_up.chunk(2, -1);
  return at::silu_(halves[0]) * halves[1];
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(layerserve, m) {
  m.def("silu_mul(Tensor(a!) gate_up) -> Tensor");
  m.impl("silu_mul", c10::DispatchKey::CPU, &silu_mul);
}
