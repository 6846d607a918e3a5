"""gemmc kernels as PyTorch ops: torch.ops.gemmc.linear and torch.ops.gemmc.gemm, with fake kernels and autograd.

    import gemmc.torch_ops as gto
    y = gto.linear(x, weight, bias, activation="gelu")    # == F.gelu(F.linear(x, weight, bias)), one kernel
    c = gto.gemm(a, b, a_layout="km", b_layout="kn")       # a.T @ b, in gemmc's storage layouts
    h = gto.gated_linear(x, w_gate_up, gate="silu")        # SwiGLU: silu(x @ w[:N].T) * (x @ w[N:].T), one kernel
    y = gto.grouped_gemm(x, w_experts, offsets)            # every expert's rows through its weight, one launch
    y = gto.grouped_scaled_gemm(x8, w8, sx, sw, offsets)   # the same in fp8 with DeepSeek-V3 block scales
    gto.unsupported_reason(weight, bias, "gelu")           # None, or why gemmc cannot run this Linear
    gto.prepare_linear(n, k, torch.bfloat16, True, "gelu", [1, 16], training=True)   # before a graph capture

The ops trace under torch.compile (fullgraph, dynamic=True: the token dim is symbolic in every kernel, so one
compile of a model serves every batch size) and under make_fx; CPU tensors run the torch reference. The
backward's dX and dW are gemmc GEMMs too (see autograd.py). Eager calls on CUDA tensors that need no gradient
skip the dispatcher (functional.py).

Tolerance. For a result R (the output, dX, dW or db) computed from bf16 or f16 inputs, let R32 be the same
formula (forward and torch.autograd) in fp32 from those inputs upcast, and err(R) = ||R - R32||_F / ||R32||_F.
gemmc's err is at most 2 err(torch) + 2u, where torch is the same computation in the inputs' dtype and u the
dtype's unit roundoff (2^-8 bf16, 2^-11 f16). Both accumulate in f32 and round each GEMM once, so they differ by
summation order, a rounding step or two (the fused epilogue rounds once where torch rounds z, then act(z)).
`tolerance.error_bound` is that bound; tests/test_torch_ops_autograd.py (CPU reference) and
tests/test_gpu_torch_ops.py (gemmc kernels) check it.
"""
from .activations import ACTIVATIONS, GATES
from .checks import gated_unsupported_reason, unsupported_reason
from .functional import gated_linear, gemm, linear
from .grouped import GROUPED_GATES, grouped_gemm, grouped_kernel
from .grouped_scaled import grouped_scaled_gemm, grouped_scaled_kernel
from .kernels import gated_kernel, gemm_kernel, linear_kernel, prepare_gated, prepare_linear
from . import autograd as _autograd

_autograd.register()

__all__ = ["ACTIVATIONS", "GATES", "GROUPED_GATES", "gated_kernel", "gated_linear", "gated_unsupported_reason", "gemm",
           "gemm_kernel", "grouped_gemm", "grouped_kernel", "grouped_scaled_gemm", "grouped_scaled_kernel", "linear",
           "linear_kernel", "prepare_gated", "prepare_linear", "unsupported_reason"]
