"""Calling compiled kernels: every route checks its arguments before anything runs, and a kernel compiled from
a @gemmc.kernel function takes that function's own arguments.

No GPU: kernels are compiled (IR, emitted params) but not built; `cpu_kernels` gives them the real launcher
(runtime.launcher_from_artifact, with the compile's call signature) on device "cpu" with a function that
records what it was passed, as a compiled prologue that accepts everything would. The cuBLAS route runs
torch.matmul on CPU tensors through `CublasRoute(..., device_type="cpu")`.
"""
import pytest
import torch

import gemmc
from gemmc import GemmSpec, LaunchError, Schedule
from gemmc import runtime
from gemmc.build import dim_divisibility, param_to_dict
from gemmc.cache import Artifact
from gemmc.compiled import CompiledKernel
from gemmc.compiler import CublasRoute
from gemmc.runtime import Launcher

T = gemmc.Tensor
bf16, f32 = gemmc.bf16, gemmc.f32
TILE = Schedule(tile=(128, 128, 64))
M, L = "M", "L"        # symbolic dims (names, not strings in annotations: pyflakes reads those as code)


class Recorder:
    """Stands in for a compiled function: records the values it was called with (kernel param order)."""

    def __init__(self):
        self.calls = []

    def __call__(self, *values):
        self.calls.append(values)


@pytest.fixture
def cpu_kernels(monkeypatch):
    recorder = Recorder()

    def artifact_without_building(self):
        return Artifact(key="k", so_path="/nonexistent/kernel.so", ptx_path=None, source_path=None,
                        meta={"function": "gemmc_k", "entry": self.emitted.entry, "arch": self.emitted.arch,
                              "params": [param_to_dict(p) for p in self.emitted.params]})

    real_launcher_from_artifact = runtime.launcher_from_artifact

    def cpu_launcher(artifact, **kw):
        launcher = real_launcher_from_artifact(artifact, **kw)
        launcher.device_type = "cpu"
        launcher._function = recorder
        return launcher

    monkeypatch.setattr(CompiledKernel, "build", artifact_without_building)
    monkeypatch.setattr(runtime, "launcher_from_artifact", cpu_launcher)
    return recorder


@pytest.fixture
def cublas_db(monkeypatch, tmp_path):
    """A tuning DB with no shipped tables; `record_cublas_win(spec)` stores a measurement where cuBLAS was
    faster, so `auto` runs torch.matmul for that problem."""
    from gemmc.search.db import TuningDB
    from gemmc.search.strategy import Measurement
    path = tmp_path / "t.sqlite"
    monkeypatch.setenv("GEMMC_TUNING_DB", str(path))
    monkeypatch.setenv("GEMMC_PRETUNED", "0")
    # the rows are stored as measured on "H200": no GPU named or visible, so `auto` reads them on any host
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    monkeypatch.delenv("GEMMC_GPU", raising=False)

    def record_cublas_win(spec):
        with TuningDB(path) as db:
            db.record(spec, "sm_90a", Measurement(TILE, 9.0, None, 6.0), "H200")
    return record_cublas_win


def bf(*shape):
    return torch.randn(*shape).bfloat16()


def message(fn, *args, **kw) -> str:
    with pytest.raises(LaunchError) as info:
        fn(*args, **kw)
    return str(info.value)


# -- 1. the cuBLAS route checks what the kernel route checks --------------------------------------

def test_cublas_route_checks_its_arguments_and_never_takes_a_third_as_out(cublas_db):
    spec = GemmSpec(m=256, n=256, k=128)
    cublas_db(spec)
    k = gemmc.compile(spec, "auto")
    assert k.decision.use_cublas
    assert "a must be on a cuda device, got cpu" in message(k, torch.randn(3, 7), torch.randn(5, 7))
    a, b, bias = bf(256, 128), bf(256, 128), torch.zeros(256, 256).bfloat16()
    assert "gemm_sm90 takes 2 arguments (a, b), got 3 positional" in message(k, a, b, bias)
    assert "gemm_sm90 has no argument 'c'" in message(k, a=a, c=b)
    assert torch.count_nonzero(bias) == 0         # never used as the output


def test_cublas_route_computes_into_out_and_fails_as_the_kernel_route_does():
    spec = GemmSpec(m="M", n=64, k=32)
    params = gemmc.compile(spec, TILE).emitted.params
    route = CublasRoute(spec, params, name="gemm_sm90", device_type="cpu")
    kernel_route = Launcher(params, function=Recorder(), name="gemm_sm90", device_type="cpu", always_validate=True)
    a, b = bf(24, 32), bf(64, 32)
    assert torch.equal(route(a, b), a @ b.T)
    assert torch.equal(route(b=b, a=a), a @ b.T)
    out = torch.full((24, 64), float("nan")).bfloat16()
    assert route(a, b, out=out) is out and torch.equal(out, a @ b.T)
    bad_calls = [((a, b, out), {}), ((a,), {}), ((a.float(), b), {}), ((a, bf(64, 16)), {}), ((a, bf(32, 64)), {}),
                 ((bf(32, 24).T, b), {}), ((a[:, :24], b[:, :24]), {}), ((a, b), {"out": torch.empty(24, 64)}),
                 ((a, b), {"out": bf(24, 32)}), ((a, b), {"out": bf(64, 24).T})]
    for args, kw in bad_calls:
        assert message(route, *args, **kw) == message(kernel_route, *args, **kw)


def test_cublas_route_takes_the_layouts_batches_and_a_kernels_own_argument_order():
    spec = GemmSpec(m="M", n=64, k=32, a_layout="km", b_layout="kn", batch="L")
    route = CublasRoute(spec, gemmc.compile(spec, TILE).emitted.params, device_type="cpu")
    a, b = bf(3, 32, 16), bf(3, 32, 64)            # (L, K, M), (L, K, N)
    assert torch.equal(route(a, b), a.mT @ b)

    @gemmc.kernel
    def linear(w: T[(64, 32), bf16], x: T[(M, 32), bf16]):
        return x @ w.T
    k = gemmc.compile(linear, TILE)
    route = CublasRoute(k.spec, k.emitted.params, signature=k.signature, device_type="cpu")
    w, x = bf(64, 32), bf(8, 32)
    assert torch.equal(route(w, x), x @ w.T) and torch.equal(route(x=x, w=w), x @ w.T)
    assert "w.shape[0] must be 64" in message(route, x, w)          # swapped: named as the function names them


def test_symbolic_m_checks_alike_in_every_bucket(cublas_db, cpu_kernels):
    spec = GemmSpec(m="M", n=256, k=128)
    cublas_db(spec.with_dims(m=16))
    k = gemmc.compile(spec, "auto")
    assert k.for_m(16)[1] is None and k.for_m(64)[1] is not None       # cuBLAS at 16, a kernel at 64
    w, bias = bf(256, 128), torch.zeros(16, 256).bfloat16()
    for m in (16, 64):
        assert "takes 2 arguments (a, b), got 3 positional" in message(k, bf(m, 128), w, bias)
        assert "has no argument 'bias'" in message(k, bf(m, 128), w, bias=bias)
    assert "a must be on a cuda device" in message(k, bf(16, 128), w)   # the cuBLAS route, on CPU tensors
    assert k(bf(64, 128), w).shape == (64, 256)                          # the kernel route (recorded)


# -- 2. static extents of 1 are checked before every launch ---------------------------------------

def test_static_m_of_1_is_checked_on_the_fast_path(cpu_kernels):
    k = gemmc.compile(GemmSpec(m=1, n=256, k=256), TILE)
    assert not k.launcher.always_validate
    w = bf(256, 256)
    assert "a.shape[0] must be 1" in message(k, bf(8, 256), w)
    assert "out.shape[0] must be 1" in message(k, bf(1, 256), w, out=bf(8, 256))
    assert cpu_kernels.calls == []                 # nothing launched
    assert k(bf(1, 256), w).shape == (1, 256)


def test_static_batch_of_1_is_checked_on_the_fast_path(cpu_kernels):
    k = gemmc.compile(GemmSpec(m="M", n=256, k=256, batch=1), TILE)
    assert "a.shape[0] must be 1" in message(k, bf(3, 16, 256), bf(1, 256, 256))
    assert cpu_kernels.calls == []
    assert k(bf(1, 16, 256), bf(1, 256, 256)).shape == (1, 16, 256)


# -- 3. a kernel compiled from a function takes the function's arguments --------------------------

@gemmc.kernel
def weight_first(w: T[(256, 256), bf16], x: T[(M, 256), bf16], bias: T[(256,), bf16]):
    return x @ w.T + bias


def test_compiled_function_takes_its_own_order_and_names(cpu_kernels):
    k = gemmc.compile(weight_first, TILE)
    w, x, bias = bf(256, 256), bf(32, 256), bf(256)
    assert k(w, x, bias).shape == (32, 256)
    a, b, _, passed_bias = cpu_kernels.calls[-1]
    assert a is x and b is w and passed_bias is bias
    assert k(bias=bias, x=x, w=w).shape == (32, 256)
    assert cpu_kernels.calls[-1][0] is x
    # the errors name the function and its parameters
    assert "weight_first takes 3 arguments (w, x, bias), got 4 positional" in message(k, w, x, bias, bias)
    assert "weight_first: missing argument 'bias'; call it as weight_first(w, x, bias)" in message(k, w, x)
    k.launcher.always_validate = True          # the recorder checks nothing, as a real prologue would
    assert "w.shape[0] must be 256" in message(k, x, w, bias)
    assert "weight_first has no argument 'a'" in message(k, a=x, w=w, bias=bias)


def test_a_spec_still_takes_a_b_then_inputs(cpu_kernels):
    k = gemmc.compile(weight_first.spec, TILE)
    w, x, bias = bf(256, 256), bf(32, 256), bf(256)
    k(x, w, bias)
    assert cpu_kernels.calls[-1][0] is x
    k(a=x, b=w, bias=bias)
    assert "has no argument 'w'" in message(k, w=w, x=x, bias=bias)


def test_symbolic_m_reads_m_from_the_functions_own_operand(cublas_db, cpu_kernels):
    @gemmc.kernel
    def linear(w: T[(256, 128), bf16], x: T[(M, 128), bf16]):
        return x @ w.T
    cublas_db(linear.spec.with_dims(m=16))
    k = gemmc.compile(linear, "auto")
    w = bf(256, 128)
    assert "x must be on a cuda device" in message(k, w, bf(16, 128))    # M = 16 (x's rows): cuBLAS
    x = bf(64, 128)
    assert k(w, x).shape == (64, 256) and cpu_kernels.calls[-1][0] is x    # M = 64: a kernel


# -- 4. batched vectors, whatever the batch dim ----------------------------------------------------

@pytest.mark.parametrize("validate", ["0", "1"])
@pytest.mark.parametrize("batch", [4, "B", "L"])
def test_batched_kernels_share_vectors_whatever_the_batch_dim(batch, validate, cpu_kernels, monkeypatch):
    monkeypatch.setenv("GEMMC_VALIDATE", validate)

    @gemmc.kernel
    def f(x: T[(batch, M, 64), bf16], w: T[(batch, 128, 64), bf16], bias: T[(128,), bf16], c: T[(M,), f32]):
        return (x @ w.mT + bias) * c[:, None]
    k = gemmc.compile(f, TILE)
    assert dim_divisibility(k.emitted.params).get("M", 1) == 1     # a column vector sets no hint on M
    x, w, bias, c = bf(4, 30, 64), bf(4, 128, 64), bf(128), torch.randn(30)
    assert k(x, w, bias, c).shape == (4, 30, 128)
    passed_bias, passed_c = cpu_kernels.calls[-1][3:5]
    assert passed_bias.shape == (4, 128) and passed_bias.stride() == (0, 1)
    assert passed_bias.data_ptr() == bias.data_ptr()
    assert passed_c.shape == (4, 30) and passed_c.stride() == (0, 1)
    assert k(x, w, bias=bias, c=c).shape == (4, 30, 128)      # by name too


# -- 5. vectors declared (M, 1) and (1, N) ---------------------------------------------------------

@gemmc.kernel
def col_row(x: T[(M, 64), bf16], w: T[(128, 64), bf16], c: T[(M, 1), f32], r: T[(1, 128), f32]):
    return (x @ w.T) * c + r


def test_vectors_take_their_declared_shape_as_views(cpu_kernels):
    k = gemmc.compile(col_row, TILE)
    x, w, c, r = bf(32, 64), bf(128, 64), torch.randn(32, 1), torch.randn(1, 128)
    assert k(x, w, c, r).shape == (32, 128)
    passed_c, passed_r = cpu_kernels.calls[-1][3:5]
    assert passed_c.shape == (32,) and passed_c.data_ptr() == c.data_ptr()
    assert passed_r.shape == (128,) and passed_r.data_ptr() == r.data_ptr()
    k(x, w, r=r, c=c)
    assert cpu_kernels.calls[-1][3].shape == (32,)
    assert "c must be 2-D with shape (M, 1) (as col_row declares it), got 1-D shape (32,)" in \
        message(k, x, w, c[:, 0], r)
    assert "r must be 2-D with shape (1, 128)" in message(k, x, w, c, torch.randn(2, 128))
    k.launcher.always_validate = True
    assert "c.shape[0] gives M=31" in message(k, x, w, torch.randn(31, 1), r)


def test_batched_kernel_takes_a_column_declared_m_by_1(cpu_kernels):
    @gemmc.kernel
    def f(x: T[(L, M, 64), bf16], w: T[(L, 128, 64), bf16], c: T[(M, 1), f32]):
        return (x @ w.mT) * c
    k = gemmc.compile(f, TILE)
    c = torch.randn(30, 1)
    k(bf(2, 30, 64), bf(2, 128, 64), c)
    passed = cpu_kernels.calls[-1][3]
    assert passed.shape == (2, 30) and passed.stride() == (0, 1) and passed.data_ptr() == c.data_ptr()


# -- 6. calling a @gemmc.kernel directly -----------------------------------------------------------

@gemmc.kernel
def scaled(x: T[(M, 64), bf16], w: T[(128, 64), bf16], s: gemmc.Scalar = 2.0):
    return (x @ w.T) * s


@pytest.fixture
def fresh_scaled():
    scaled._compiled = None
    yield scaled
    scaled._compiled = None


def test_calling_a_kernel_honours_defaults_and_out(fresh_scaled, cpu_kernels, monkeypatch):
    monkeypatch.setattr(runtime, "visible_arch", lambda: "sm_80")
    x, w = bf(16, 64), bf(128, 64)
    assert fresh_scaled(x, w).shape == (16, 128)
    assert fresh_scaled._compiled.arch == "sm_80"      # compiled for the visible GPU
    assert cpu_kernels.calls[-1][3] == 2.0             # the default scale
    out = bf(16, 128)
    assert fresh_scaled(x, w, 3.0, out=out) is out
    assert cpu_kernels.calls[-1][2] is out and cpu_kernels.calls[-1][3] == 3.0
    assert fresh_scaled(w=w, x=x, s=0.5).shape == (16, 128)


def test_calling_a_kernel_with_bad_arguments_fails_before_compiling(fresh_scaled, monkeypatch):
    import gemmc.compiler
    monkeypatch.setattr(gemmc.compiler, "compile", lambda *a, **kw: pytest.fail("compiled"))
    x, w = bf(16, 64), bf(128, 64)
    assert "scaled: missing argument 'w'; call it as scaled(x, w, s)" in message(fresh_scaled, x)
    assert "scaled takes 3 arguments (x, w, s), got 4 positional" in message(fresh_scaled, x, w, 1.0, 2.0)
    assert "scaled has no argument 'scale'" in message(fresh_scaled, x, w, scale=1.0)


def test_a_kernel_compiles_for_its_declared_arch(cpu_kernels, monkeypatch):
    monkeypatch.setattr(runtime, "visible_arch", lambda: None)

    @gemmc.kernel(arch="sm_80")
    def f(x: T[(M, 64), bf16], w: T[(128, 64), bf16]):
        return gemmc.relu(x @ w.T)
    f(bf(16, 64), bf(128, 64))
    assert f._compiled.arch == "sm_80"


@pytest.mark.parametrize("capability,arch", [((9, 0), "sm_90a"), ((8, 0), "sm_80"), ((8, 9), "sm_80"),
                                             ((10, 0), None), (None, None)])
def test_visible_arch_follows_the_compute_capability(capability, arch, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: capability is not None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    assert runtime.visible_arch() == arch


# -- 8. out= is written in place, so its errors never suggest a copy ------------------------------

def test_out_errors_say_to_allocate_out_not_to_convert_it(cpu_kernels, monkeypatch):
    monkeypatch.setenv("GEMMC_VALIDATE", "1")       # the recorder checks nothing: let the validator speak
    k = gemmc.compile(GemmSpec(m="M", n=128, k=64), TILE)
    x, w = bf(16, 64), bf(128, 64)
    msg = message(k, x, w, out=torch.empty(16, 128))
    assert "out must be bf16, got torch.float32: allocate out with dtype=torch.bfloat16" in msg
    assert "out.to(" not in msg
    msg = message(k, x, w, out=bf(128, 16).T)
    assert "allocate out contiguous" in msg and "out.contiguous()" not in msg
    assert "pass a.to(torch.bfloat16)" in message(k, x.float(), w)     # inputs may still be converted
