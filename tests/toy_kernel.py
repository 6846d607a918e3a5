"""A tiny emitted kernel (z = alpha * x + y, through a workspace) for the build/cache/runtime tests.

It is an `EmittedKernel` like the GEMM backends produce, so the whole build -> cache -> runtime path
is exercised without depending on them. Shapes: x, y, z are (M, N) with N contiguous; M is symbolic,
N symbolic or static.
"""
from gemmc.backends import EmittedKernel, Param
from gemmc.types import DType

TOY_SOURCE = '''\
import cutlass
import cutlass.cute as cute

THREADS = 128


@cute.kernel
def toy_axpy_kernel(gx: cute.Tensor, gy: cute.Tensor, gz: cute.Tensor, gw: cute.Tensor,
                    alpha: cutlass.Float32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    m, n = gx.shape
    if i < m * n:
        r = i // n
        c = i % n
        gw[i] = gx[r, c].to(cutlass.Float32) * alpha + gy[r, c].to(cutlass.Float32)
        gz[r, c] = gw[i].to(gz.element_type)


@cute.jit
def toy_axpy(x: cute.Tensor, y: cute.Tensor, z: cute.Tensor, w: cute.Tensor,
             alpha: cutlass.Float32, stream):
    m, n = x.shape
    toy_axpy_kernel(x, y, z, w, alpha).launch(
        grid=[(m * n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)
'''


def toy_params(n="N", dtype=DType.bf16):
    return (
        Param("x", "tensor", dtype, ("M", n), -1, role="a"),
        Param("y", "tensor", dtype, ("M", n), -1, role="input"),
        Param("z", "tensor", dtype, ("M", n), -1, role="out"),
        Param("w", "workspace", DType.f32, ("W",), 0, role="workspace",
              workspace_elems="M * N" if n == "N" else f"M * {n}"),
        Param("alpha", "scalar", DType.f32, (), role="scalar"),
    )


def toy_emitted(n="N", dtype=DType.bf16, arch="sm_90a", tag=""):
    """`tag` changes the source (a comment) so a test can force a distinct cache key."""
    src = TOY_SOURCE + (f"\n# {tag}\n" if tag else "")
    return EmittedKernel(arch=arch, source=src, entry="toy_axpy", params=toy_params(n, dtype),
                         compile_arch=arch)
