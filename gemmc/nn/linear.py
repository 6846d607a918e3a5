"""`gemmc.nn.Linear`: a torch.nn.Linear whose forward runs gemmc's fused GEMM where gemmc can run it."""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

import gemmc.torch_ops as gto

from ..errors import SpecError

# torch's path for each epilogue gemmc fuses; "gelu" is erf GELU, as torch's default.
_TORCH_ACTIVATION = {
    "none": None,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}


def check_activation(activation, where: str) -> str:
    """`activation` if gemmc.nn knows it, else a SpecError that lists the choices."""
    if activation not in _TORCH_ACTIVATION:
        raise SpecError(
            f"{where}: activation {activation!r} is not one of {tuple(_TORCH_ACTIVATION)}; pass one of those, "
            "or apply your activation to the layer's output")
    return activation


def torch_activation(activation: str):
    """The torch function of a gemmc activation name (None for "none")."""
    return _TORCH_ACTIVATION[activation]


def _cuda_stand_ins(weight, bias):
    """Fake CUDA tensors with `weight`'s and `bias`'s shapes, dtypes and strides (no memory, no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake_w = torch.empty_strided(weight.shape, weight.stride(), dtype=weight.dtype, device="cuda")
        fake_b = None if bias is None else torch.empty_strided(
            bias.shape, bias.stride(), dtype=bias.dtype, device="cuda")
    return fake_w, fake_b


def gemmc_reason(weight, bias, activation: str, allow_cpu: bool = False) -> str | None:
    """Why gemmc cannot run a Linear with these parameters, else None (gemmc.torch_ops decides).

    With `allow_cpu`, a CPU layer is judged as if it were on CUDA: gemmc's op runs its torch reference on the
    CPU, so tests and debugging exercise the same path as a GPU run."""
    reason = gto.unsupported_reason(weight, bias, activation)
    if reason is None or not allow_cpu or weight.device.type != "cpu":
        return reason
    return gto.unsupported_reason(*_cuda_stand_ins(weight, bias), activation)


class Linear(nn.Linear):
    """A drop-in for torch.nn.Linear (same `weight` and `bias` Parameters and state_dict keys) with an optional
    fused activation: y = act(x @ weight.T + bias).

    The forward runs `gemmc.torch_ops.linear` (one gemmc kernel, the activation fused in its epilogue) where
    gemmc can run the layer, else torch's F.linear and the activation; `fallback_reason` says which and why.
    The decision is cached and re-made only when the parameters move, change dtype or are reassigned.
    An input whose dtype differs from the weight's (e.g. under torch.autocast) takes torch's path.

    `allow_cpu=True` runs gemmc's op on CPU tensors too (its CPU implementation is torch's reference); it is
    meant for tests and debugging, not speed.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 activation: str = "none", allow_cpu: bool = False):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._init_route(activation, allow_cpu)

    @classmethod
    def from_linear(cls, lin: nn.Linear, activation: str = "none", allow_cpu: bool = False) -> "Linear":
        """A gemmc Linear that shares `lin`'s Parameters (no copy): training one trains the other, and
        optimizers built over `lin`'s parameters keep working. `lin`'s hooks are not carried over."""
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"Linear.from_linear takes a torch.nn.Linear, got {type(lin).__name__}")
        return cls._wrap(lin.weight, lin.bias, activation, allow_cpu, training=lin.training)

    @classmethod
    def _wrap(cls, weight: nn.Parameter, bias: nn.Parameter | None, activation: str, allow_cpu: bool,
              training: bool = True) -> "Linear":
        """A gemmc Linear around existing Parameters (weight [out, in], bias [out] or None)."""
        check_activation(activation, f"gemmc.nn.{cls.__name__}")
        if weight.dim() != 2:
            raise SpecError(f"gemmc.nn.{cls.__name__}: the weight must be 2-D [out, in], got {tuple(weight.shape)}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.out_features, layer.in_features = weight.shape
        layer.weight = weight
        layer.register_parameter("bias", bias)
        layer.train(training)
        layer._init_route(activation, allow_cpu)
        return layer

    def _init_route(self, activation: str, allow_cpu: bool) -> None:
        self._activation = check_activation(activation, f"gemmc.nn.{type(self).__name__}")
        self._allow_cpu = bool(allow_cpu)
        self._refresh_route()

    # The route (gemmc or torch) is decided once and cached. It is dropped when the parameters may have moved
    # or changed dtype: nn.Module._apply (.to, .cuda, .half, ...), an assignment of weight or bias (also
    # load_state_dict(assign=True)), a new activation or allow_cpu; and the forward re-decides when the
    # weight's dtype is not the one decided for (a `.data =` swap). That check is one identity test per call.
    def _drop_route(self) -> None:
        self.__dict__["_route_dtype"] = None

    def _refresh_route(self) -> None:
        p = self._parameters
        self._fallback_reason = gemmc_reason(p["weight"], p["bias"], self._activation, self._allow_cpu)
        self._runs_gemmc = self._fallback_reason is None
        self.__dict__["_route_dtype"] = p["weight"].dtype

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._drop_route()
        return out

    def __setattr__(self, name, value) -> None:
        super().__setattr__(name, value)
        if name in ("weight", "bias"):
            self._drop_route()

    @property
    def activation(self) -> str:
        return self._activation

    @activation.setter
    def activation(self, value: str) -> None:
        self._activation = check_activation(value, f"gemmc.nn.{type(self).__name__}")
        self._drop_route()

    @property
    def allow_cpu(self) -> bool:
        return self._allow_cpu

    @allow_cpu.setter
    def allow_cpu(self, value: bool) -> None:
        self._allow_cpu = bool(value)
        self._drop_route()

    @property
    def fallback_reason(self) -> str | None:
        """Why this layer runs torch's path, or None when it runs gemmc (decided afresh on each read)."""
        self._refresh_route()
        return self._fallback_reason

    @property
    def kernel_key(self) -> tuple:
        """(N, K, dtype, has_bias, activation): the key of gemmc.torch_ops' shared kernel registry."""
        return (self.out_features, self.in_features, self.weight.dtype, self.bias is not None, self._activation)

    def gemmc_weight(self, x: torch.Tensor) -> torch.Tensor | None:
        """The weight, when this layer's forward on `x` runs gemmc (else None): GatedMLP asks before it runs
        the gated kernel over this layer's [gate; up] weight."""
        w = self._parameters["weight"]
        if w.dtype is not self._route_dtype:
            self._refresh_route()
        return w if self._runs_gemmc and x.dtype is w.dtype else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self._parameters            # not self.weight: nn.Module.__getattr__ costs host time on every call
        w, b = p["weight"], p["bias"]
        if w.dtype is not self._route_dtype:
            self._refresh_route()
        if self._runs_gemmc and x.dtype is w.dtype:
            return gto.linear(x, w, b, self._activation)
        y = F.linear(x, w, b)
        act = _TORCH_ACTIVATION[self._activation]
        return y if act is None else act(y)

    def extra_repr(self) -> str:
        reason = self.fallback_reason
        runs = "gemmc" if reason is None else f"torch ({reason})"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activation={self._activation!r}, runs={runs}")
