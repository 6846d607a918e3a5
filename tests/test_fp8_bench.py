"""`gemmc bench --dtype fp8 --scaling ...` on the CPU: the problem class, quantized input sets, the torch
baselines (torch._scaled_mm runs on a CPU too), and the harness checking and timing fp8 kernels (fakes on a
virtual clock) against the dequantized fp32 reference."""
import argparse

import pytest
import torch

from gemmc.bench import cli, suites, timing
from gemmc.bench.fp8 import baseline, blockwise_torch, fp8_dtype, fp8_scaling, scaled_mm, spec_kwargs
from gemmc.bench.timing import make_fp8_input_sets
from gemmc.errors import GemmcError
from gemmc.quantize import Quantized, dequantize

from bench_fakes import VirtualClock

SHAPES = [suites.Shape(64, 256, 512), suites.Shape(8, 384, 256)]


class FakeFp8Kernel:
    """A compiled fp8 GEMM's call (a, b, scale_a, scale_b, out=): the dequantized product for real, on a
    virtual clock."""

    def __init__(self, clock, us, factor=1.0):
        self.clock, self.us, self.factor, self.calls = clock, us, factor, 0
        self.schedule = None

    def __call__(self, a, b, sa, sb, out=None):
        self.calls += 1
        self.clock.now_ms += self.us / 1000
        res = (dequantize(a, sa) @ dequantize(b, sb).T * self.factor).to(torch.bfloat16)
        return res if out is None else out.copy_(res)


class Timed:
    """A baseline on the virtual clock."""

    def __init__(self, clock, us, fn):
        self.clock, self.us, self.fn = clock, us, fn

    def __call__(self, a, b, out=None):
        self.clock.now_ms += self.us / 1000
        return self.fn(a, b, out=out)


def test_the_problem_class_names_the_scaling():
    assert fp8_dtype("row") == "fp8-row" and fp8_scaling("fp8-block") == "block" and fp8_scaling("bf16") is None
    assert spec_kwargs("fp8-tensor") == {"dtype": "f8e4m3", "scaling": "tensor"}
    assert spec_kwargs("bf16") == {"dtype": "bf16"}
    with pytest.raises(ValueError, match="use fp8-tensor, fp8-row or fp8-block"):
        fp8_scaling("fp8-col")
    assert baseline("row") is scaled_mm and baseline("tensor") is scaled_mm and baseline("block") is blockwise_torch


@pytest.mark.parametrize("argv,needle", [(["--dtype", "fp8"], "--dtype fp8 needs --scaling tensor, row or block"),
                                         (["--scaling", "row"], "--scaling row scales fp8 inputs: add --dtype fp8")])
def test_cli_pairs_dtype_fp8_with_a_scaling(argv, needle):
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    args = p.parse_args(["--suite", "llm"] + argv)
    with pytest.raises(GemmcError, match=needle):
        cli.problem_dtype(args)
    args = p.parse_args(["--suite", "llm", "--dtype", "fp8", "--scaling", "block"])
    assert cli.problem_dtype(args) == "fp8-block"


@pytest.mark.parametrize("mode", ["tensor", "row", "block"])
def test_input_sets_hold_quantized_operands_and_bf16_outputs(mode):
    sets = make_fp8_input_sets(suites.Shape(64, 256, 512), mode, "cpu", 3, seed=1)
    assert sets.n == 3 and isinstance(sets.a[0], Quantized) and sets.a[0].q.dtype == torch.float8_e4m3fn
    assert sets.out_gemmc[0].dtype == torch.bfloat16 and sets.set_bytes == 64 * 512 + 256 * 512 + 64 * 256 * 2
    ref = timing.reference_with_bound(sets.a[0], sets.b[0], torch.bfloat16)
    base = baseline(mode)(sets.a[0], sets.b[0])
    rel, elem = timing.error_figures(base, ref.ref, ref.bound)
    assert rel < 1e-2 and elem <= 1     # torch's own fp8 GEMM passes the check gemmc's kernels take


@pytest.mark.parametrize("mode", ["tensor", "row", "block"])
def test_bench_checks_and_times_an_fp8_kernel_beside_its_torch_baseline(mode):
    clock = VirtualClock()
    made = []

    def compile_fn(shape):
        made.append(FakeFp8Kernel(clock, 10.0))
        return made[-1]

    cfg = timing.TimingConfig(repeats=3, warmup=1, min_unit_us=100)
    results = timing.run_bench(SHAPES, "heuristic", cfg, dtype=fp8_dtype(mode), device="cpu", compile_fn=compile_fn,
                               cublas=Timed(clock, 12.0, baseline(mode)), clock=clock, l2_bytes=64 * 1024,
                               progress=False)
    for r in results:
        assert r["status"] == "ok", r["error"]
        assert r["rel_err"] < 1e-2 and r["elem_err"] <= 1 and r["ratio"] == pytest.approx(1.2)
    assert all(k.calls > 1 for k in made)


def test_bench_fails_a_wrong_fp8_kernel():
    clock = VirtualClock()
    cfg = timing.TimingConfig(repeats=3, warmup=1, min_unit_us=100)
    (r,) = timing.run_bench(SHAPES[:1], "heuristic", cfg, dtype="fp8-row", device="cpu",
                            compile_fn=lambda s: FakeFp8Kernel(clock, 10.0, factor=1.02),
                            cublas=Timed(clock, 12.0, scaled_mm), clock=clock, l2_bytes=64 * 1024, progress=False)
    assert r["status"] == "check_failed" and "elementwise" in r["error"]
