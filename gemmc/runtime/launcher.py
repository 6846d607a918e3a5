"""The Launcher: a compiled kernel called with torch tensors.

`Launcher(params, ...)` validates arguments against the kernel's params before anything launches
(device, dtype, rank, static dims, named dims agreeing across tensors, stride-1 contiguous dim,
16-byte aligned strides and data pointers), allocates the output and the split-K workspace, and calls
the TVM-FFI function. The stream is not an argument: the kernels are compiled with
`make_fake_stream(use_tvm_ffi_env_stream=True)`, and TVM-FFI sets its env stream from torch's current
stream for the tensors' device on every call (the DLPack exchange API's `current_work_stream`), so a
launch follows `torch.cuda.stream(...)` and CUDA graph capture. `launcher_from_artifact` builds one from a
cached artifact's meta.
"""
from __future__ import annotations

import operator
import os
from dataclasses import replace
from typing import Any, Callable, NamedTuple, Optional, Sequence

from ..alignment import ALIGN_BYTES as _ALIGN_BYTES
from ..backends import GROUP_ROLES, Param
from ..errors import LaunchError
from ..types import DType
from .checks import TensorCheck, check_groups, is_batched, unit_dims
from .gpu import check_persistent_grid
from .load import DamagedKernelError, load_function
from .scratch import SEMAPHORES, WORKSPACES
from .signature import CallSignature

_MAX_SCRATCH_ELEMS = 2 ** 31     # kernels index their scratch with 32-bit integers


def param_from_dict(d: dict) -> Param:
    """A kernel param from its record in a cached artifact's meta (gemmc.build.param_to_dict's inverse)."""
    return Param(name=d["name"], kind=d["kind"], dtype=DType(d["dtype"]),
                 shape=tuple(d.get("shape", ())), contiguous=d.get("contiguous", -1),
                 role=d.get("role", ""), workspace_elems=d.get("workspace_elems"),
                 limits=tuple(tuple(x) for x in d.get("limits", ())))


def _dtype_name(torch_dtype) -> str:
    return str(torch_dtype).replace("torch.", "")


class Launcher:
    """Call a compiled kernel with torch tensors: `launcher(*inputs, out=None, **named)`.

    Positional arguments fill, in order, the kernel's tensor params other than the output and the
    scalars; any of them may be passed by name instead. The output is allocated unless `out=` is given.
    With `signature` (a CallSignature), the arguments are the caller's own instead, in its order and by its
    names (a @gemmc.kernel function's parameters), and messages name them.
    `function` is the TVM-FFI callable; alternatively `so_path` + `function_name` load it lazily.
    `device_type` is "cuda"; the CPU tests pass "cpu" to exercise the other checks without a GPU.
    `always_validate` (or GEMMC_VALIDATE=1) runs the Python validator on every call instead of only
    when the compiled function's prologue rejects the arguments.
    An empty problem never launches: with M, N or the batch 0 the (empty) output is returned as it is; with
    K = 0, `zero_k(a, b, inputs, out)` writes the epilogue of a zero accumulator (a LaunchError without it).
    `strided=True` (with `always_validate`, for a torch function rather than a kernel) checks no strides or
    alignment.
    A grouped GEMM's kernel takes its offsets (E + 1 of them: checked against B's E on every call) or counts
    after B; output rows outside every group are not written. Validating every call also reads them back
    (check_groups: sorted and in range), which synchronises.
    """

    def __init__(self, params: Sequence[Param], *, function: Optional[Callable] = None,
                 so_path: Optional[str] = None, function_name: Optional[str] = None,
                 runtime_flavor: str = "", so_sha256: Optional[str] = None,
                 name: str = "kernel", device_type: str = "cuda",
                 on_load_error: Optional[Callable[[Exception], Callable]] = None,
                 always_validate: Optional[bool] = None, signature: Optional[CallSignature] = None,
                 zero_k: Optional[Callable] = None, strided: bool = False):
        if function is None and so_path is None:
            raise ValueError("Launcher needs a function or a so_path")
        if signature is not None:       # messages name the caller's parameters: x and w, not a and b
            renamed = dict(signature.operands)
            params = [replace(p, name=renamed[p.name]) if p.name in renamed else p for p in params]
            name = signature.name
        self.params = tuple(params)
        self.name = name
        self.device_type = device_type
        self._function = function
        self._so_path = so_path
        self._function_name = function_name
        self._flavor = runtime_flavor
        self._so_sha256 = so_sha256
        self._on_load_error = on_load_error
        self._zero_k = zero_k
        self._strided = strided

        outs = [i for i, p in enumerate(self.params) if p.kind == "tensor" and p.role == "out"]
        if len(outs) != 1:
            raise LaunchError(f"{name}: expected exactly one tensor param with role 'out', found {len(outs)}")
        self._out_index = outs[0]
        user = [i for i, p in enumerate(self.params)
                if (p.kind == "tensor" and i != self._out_index) or p.kind == "scalar"]
        if signature is None:
            signature = CallSignature(name, [self.params[i].name for i in user])
        by_name = {self.params[i].name: i for i in user}
        if sorted(signature.names) != sorted(by_name):
            raise LaunchError(f"{name}: the call signature ({signature.usage}) does not name the kernel's "
                              f"arguments ({', '.join(by_name)})")
        self.signature = signature
        self._user = tuple(by_name[n] for n in signature.names)     # kernel param index per call position
        batched = is_batched(self.params)
        self._tensor_checks = tuple(TensorCheck(p, i, batched) for i, p in enumerate(self.params)
                                    if p.kind == "tensor" and i != self._out_index)
        self._out_check = TensorCheck(self.params[self._out_index], self._out_index, batched)
        self._scalars = tuple(i for i, p in enumerate(self.params) if p.kind == "scalar")
        self._operands = tuple(i for i, p in enumerate(self.params) if p.kind == "tensor" and p.role in ("a", "b"))
        self._groups = next((i for i, p in enumerate(self.params) if p.role in GROUP_ROLES), None)
        # contiguous groups: (call position of the offsets, of B), whose lengths E + 1 and E the prologue cannot
        # relate (the offsets' length is a dim of its own when E is symbolic)
        self._offsets_of_b = None
        if self._groups is not None and self.params[self._groups].role == "group_offsets":
            b = next(i for i, p in enumerate(self.params) if p.role == "b")
            self._offsets_of_b = (self._user.index(self._groups), self._user.index(b))
        # what a K = 0 call's epilogue reads: an fp8 kernel's scales (params after b), then its epilogue inputs
        self._epilogue_inputs = tuple(i for i, p in enumerate(self.params) if p.role in ("scale", "input", "scalar"))
        self._workspaces = tuple(
            (i, compile(p.workspace_elems or "0", f"<{p.name}.workspace_elems>", "eval"))
            for i, p in enumerate(self.params) if p.kind in ("workspace", "semaphore"))
        # fast path: where each named dim is read from (user arg position, dim), and a value template
        self._n_user = len(self._user)
        self._dim_sources = []
        seen = set()
        for j, i in enumerate(self._user):
            p = self.params[i]
            if p.kind != "tensor":
                continue
            for d, dim in enumerate(p.shape):
                if isinstance(dim, str) and dim not in seen:
                    seen.add(dim)
                    self._dim_sources.append((dim, j, d))
        self._dim_sources = tuple(self._dim_sources)
        # named dims a launch grid carries, with their largest extent: a larger call takes the checked path
        self._limit_dims = tuple((p.shape[d], most, f"{p.name}.shape[{d}]") for p in self.params
                                 if p.kind == "tensor" for d, most in p.limits if isinstance(p.shape[d], str))
        # Static extents of 1 are compiled as free symbols (gemmc.build._fake_extent), so the prologue cannot
        # check them: the fast path does, (call position, dim) and the output's dims.
        self._unit_dims = tuple((j, d) for j, i in enumerate(self._user) if self.params[i].kind == "tensor"
                                for d in unit_dims(self.params[i].shape))
        self._out_unit_dims = unit_dims(self.params[self._out_index].shape)
        firsts = [j for j, i in enumerate(self._user) if self.params[i].kind == "tensor"]
        self._first_tensor = firsts[0] if firsts else 0
        self._template = [None] * len(self.params)
        # Vectors declared with unit dims ((M, 1), (1, N)) reach the kernel as views without them; a 0-D
        # per-tensor fp8 scale as its (1,) view.
        self._unit_vectors = tuple(
            (signature.position(n), unit_dims(shape), len(shape), "(" + ", ".join(str(v) for v in shape) + ")")
            for n, shape in signature.declared)
        # Batched kernels take per-batch vectors (L, N) / (L, M), whatever the batch dim is called or however
        # big it is; a vector without it is shared by every batch, so it is passed as a stride-0 expansion
        # rather than copied.
        self._batch_vectors = tuple(j for j, i in enumerate(self._user)
                                    if batched and self.params[i].role == "input" and len(self.params[i].shape) == 2)
        self._reshapes = bool(self._unit_vectors or self._batch_vectors)
        if always_validate is None:
            always_validate = os.environ.get("GEMMC_VALIDATE", "") not in ("", "0")
        self.always_validate = always_validate

    @property
    def always_validate(self) -> bool:
        return self._always_validate

    @always_validate.setter
    def always_validate(self, value: bool) -> None:
        self._always_validate = bool(value)
        self._lean = None if value else self._lean_plan()

    def _lean_plan(self) -> Optional["_LeanCall"]:
        """What the lean call path needs, for a kernel whose calls need no more than their arguments and an
        output: no static extents of 1 to check, no grid limit, no scratch, no reshaped vectors, a row-major
        output. None for any other kernel (the general fast path in __call__ takes it)."""
        c = self._out_check
        if (self._unit_dims or self._out_unit_dims or self._limit_dims or self._workspaces or self._reshapes
                or c.contig != c.rank - 1 or len(self.params) != self._n_user + 1 or self._offsets_of_b):
            return None
        position = {i: j for j, i in enumerate(self._user)}
        position[self._out_index] = self._n_user
        source = {name: (j, d) for name, j, d in self._dim_sources}
        out_shape = self.params[self._out_index].shape
        if any(isinstance(d, str) and d not in source for d in out_shape):
            return None         # an output dim no argument gives: the checked path says so
        return _LeanCall(
            kernel_order=operator.itemgetter(*(position[i] for i in range(len(self.params)))),
            nonzero=tuple((j, d) for _, j, d in self._dim_sources),
            out_dims=tuple(source[d] if isinstance(d, str) else int(d) for d in out_shape),
            out_dtype=c.torch_dtype)

    # -- the compiled function --
    @property
    def function(self) -> Callable:
        fn = self._function
        if fn is None:
            try:
                fn = load_function(self._so_path, self._function_name, self._flavor, self._so_sha256)
            except DamagedKernelError as e:
                # Only a damaged file is worth rebuilding; a host problem (KernelLoadError) is raised as it
                # is, and the cache entry, which other hosts can load, is left alone.
                if self._on_load_error is None:
                    raise
                fn = self._on_load_error(e)      # e.g. the cache rebuilds the entry
            self._function = fn
        return fn

    # -- argument binding --
    def _arguments(self, args: tuple, named: dict) -> tuple:
        """The call's arguments in call order: bound (LaunchError if they do not bind), vectors reshaped."""
        if named or len(args) != self._n_user:
            args = self.signature.bind(args, named)
        return self._reshaped(args) if self._reshapes else args

    def _reshaped(self, args: tuple) -> tuple:
        args = list(args)
        for j, dims, rank, declared in self._unit_vectors:
            t = args[j]
            if not hasattr(t, "dim"):
                continue                 # not a tensor: the validator says so
            if t.dim() != rank or any(t.shape[d] != 1 for d in dims):
                raise LaunchError(f"{self.signature.names[j]} must be {rank}-D with shape {declared} (as "
                                  f"{self.signature.name} declares it), got {t.dim()}-D shape {tuple(t.shape)}")
            args[j] = t.squeeze(dims) if rank else t.reshape(1)     # a 0-D scale: its (1,) view
        if self._batch_vectors:
            lead = next((a.shape[0] for a in args if hasattr(a, "dim") and a.dim() == 3), None)
            if lead is not None:
                for j in self._batch_vectors:
                    t = args[j]
                    if hasattr(t, "dim") and t.dim() == 1:
                        args[j] = t.expand(lead, t.shape[0])
        return tuple(args)

    # -- validation --
    def _check_tensor(self, c: TensorCheck, t, sizes: dict, where: dict, device) -> Any:
        import torch
        # `out` is written in place: a converted copy would take the result instead of the caller's buffer
        remedy = ((lambda copy, alloc: f"allocate {c.name} {alloc} (a converted copy would receive the result, "
                   f"not your buffer)") if c.is_out else (lambda copy, alloc: f"pass {copy}"))
        if not isinstance(t, torch.Tensor):
            raise LaunchError(f"{c.name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != self.device_type:
            raise LaunchError(f"{c.name} must be on a {self.device_type} device, got {t.device}: "
                              + remedy(f"{c.name}.to('{self.device_type}')", f"on a {self.device_type} device"))
        if device is None:
            device = t.device
        elif t.device != device:
            raise LaunchError(f"{c.name} is on {t.device} but the other arguments are on {device}: "
                              + remedy(f"{c.name}.to('{device}')", f"on {device}"))
        if t.dtype is not c.torch_dtype:
            torch_name = f"torch.{_dtype_name(c.torch_dtype)}"
            raise LaunchError(f"{c.name} must be {c.dtype}, got {t.dtype}: "
                              + remedy(f"{c.name}.to({torch_name})", f"with dtype={torch_name}"))
        if t.dim() != c.rank:
            raise LaunchError(f"{c.name} must be {c.rank}-D with shape {c.shape_text}, "
                              f"got {t.dim()}-D shape {tuple(t.shape)}")
        shape = t.shape
        for i, v in c.static:
            if shape[i] != v:
                raise LaunchError(f"{c.name}.shape[{i}] must be {v} (the kernel was compiled for a static "
                                  f"{c.shape_text}), got shape {tuple(shape)}: compile a kernel for this "
                                  "size or make the dim symbolic")
        for i, d in c.named:
            v = shape[i]
            prev = sizes.get(d)
            if prev is None:
                sizes[d] = v
                where[d] = f"{c.name}.shape[{i}]"
            elif prev != v:
                raise LaunchError(f"{c.name}.shape[{i}] gives {d}={v} but {where[d]} gives {d}={prev}: "
                                  f"the arguments disagree on {d} (expected {c.name} of shape {c.shape_text})")
        if t.numel() == 0 or self._strided:     # an empty problem never launches; torch.matmul takes any strides
            return device
        stride = t.stride()
        if stride[c.contig] != 1 and shape[c.contig] != 1:
            raise LaunchError(f"{c.name}.stride({c.contig - c.rank}) must be 1 (dim {c.contig} is the "
                              f"contiguous one), got strides {stride}: "
                              + remedy(f"{c.name}.contiguous()", "contiguous (torch.empty)"))
        a = c.align_elems
        if shape[c.contig] % a and c.contig in c.sym_dims and not c.vector:
            raise LaunchError(f"{c.name}.shape[{c.contig}] = {shape[c.contig]} must be a multiple of {a} "
                              f"({_ALIGN_BYTES} bytes of {c.dtype}) because it is the contiguous dim: "
                              "pad it (e.g. torch.nn.functional.pad) and slice the result")
        for i in range(c.rank):
            if i != c.contig and stride[i] % a:
                raise LaunchError(f"{c.name}.stride({i}) = {stride[i]} is not a multiple of {a} elements "
                                  f"({c.align_bytes} bytes), needed for vector/TMA loads: pad dim {c.contig} "
                                  f"to a multiple of {a} or "
                                  + remedy(f"{c.name}.contiguous() if it is already a multiple of {a}",
                                           f"contiguous if it is already a multiple of {a}"))
        if t.data_ptr() % c.align_bytes:
            raise LaunchError(f"{c.name}.data_ptr() is not {c.align_bytes}-byte aligned (a view at an odd "
                              f"offset?): " + remedy(f"{c.name}.clone()", "as a tensor of its own (torch.empty)"))
        return device

    def validate(self, *args, out=None, **named):
        """Bind and check every argument; return (values, sizes, device) or raise LaunchError."""
        return self._validate(self._arguments(args, named), out)

    def _validate(self, args: tuple, out):
        values: list = [None] * len(self.params)
        for i, a in zip(self._user, args):
            values[i] = a
        sizes: dict[str, int] = {}
        where: dict[str, str] = {}
        device = None
        for c in self._tensor_checks:
            device = self._check_tensor(c, values[c.index], sizes, where, device)
        for i in self._scalars:
            v = values[i]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise LaunchError(f"{self.params[i].name} must be a Python number (float), "
                                  f"got {type(v).__name__}: pass float({self.params[i].name})")
        if out is not None:
            self._check_tensor(self._out_check, out, sizes, where, device)
        else:
            missing = [d for _, d in self._out_check.named if d not in sizes]
            if missing:
                raise LaunchError(f"{self.name}: cannot size the output: dims {missing} appear only in "
                                  f"{self._out_check.name}; pass out=")
        if self._offsets_of_b is not None:
            self._check_offsets_length(args)
        if self._groups is not None and self.always_validate:
            p, a = self.params[self._groups], values[self._operands[0]]
            check_groups(values[self._groups], a.shape[-2], "contiguous" if p.role == "group_offsets" else "masked",
                         p.name)
        for d, most, where_d in self._limit_dims:
            if sizes.get(d, 0) > most:
                raise LaunchError(f"{self.name}: {where_d} ({d}) = {sizes[d]} is more than the {most} blocks this "
                                  "kernel's launch grid carries along that dim: split the call (e.g. the batch in "
                                  f"chunks of {most}), or use an SM90 schedule without serial split-K (its grid is "
                                  "persistent)")
        return values, sizes, device

    def _offsets_fit(self, args: tuple) -> bool:
        j, b = self._offsets_of_b
        return args[j].shape[0] == args[b].shape[0] + 1

    def _check_offsets_length(self, args: tuple) -> None:
        if not self._offsets_fit(args):
            j, b = self._offsets_of_b
            names = self.signature.names
            e = args[b].shape[0]
            raise LaunchError(f"{names[j]} has {args[j].shape[0]} entries but {names[b]} holds E = {e} groups' "
                              f"weights: pass E + 1 = {e + 1} row offsets (group g owns rows {names[j]}[g] .. "
                              f"{names[j]}[g + 1] - 1)")

    # -- allocation --
    def _allocate_out(self, sizes: dict, device):
        import torch
        c = self._out_check
        p = self.params[self._out_index]
        shape = [sizes[d] if isinstance(d, str) else int(d) for d in p.shape]
        if c.contig == c.rank - 1:
            return torch.empty(shape, dtype=c.torch_dtype, device=device)
        order = [i for i in range(c.rank) if i != c.contig] + [c.contig]
        t = torch.empty([shape[i] for i in order], dtype=c.torch_dtype, device=device)
        return t.permute([order.index(i) for i in range(c.rank)])

    def workspace(self, index: int, elems: int, device):
        """Scratch of at least `elems` elements from the process-wide pool (see `WorkspacePool`), or zeroed
        split-K semaphores (see `SemaphorePool`)."""
        if elems >= _MAX_SCRATCH_ELEMS:
            raise LaunchError(f"{self.name}: the split-K scratch {self.params[index].name!r} needs {elems} elements, "
                              f"past the kernels' 32-bit index ({_MAX_SCRATCH_ELEMS - 1}); use fewer splits "
                              "(split_k) or split the problem (batch or M) across calls")
        if self.params[index].kind == "semaphore":
            return SEMAPHORES.get(elems, device)
        return WORKSPACES.get(self.params[index].dtype, elems, device)

    def prepare(self, *args, out=None, **named) -> tuple[list, Any]:
        """Validated, allocated argument list in kernel order, and the output tensor. Nothing launches."""
        return self._prepare(self._arguments(args, named), out)

    def _prepare(self, args: tuple, out) -> tuple[list, Any]:
        values, sizes, device = self._validate(args, out)
        if out is None:
            out = self._allocate_out(sizes, device)
        values[self._out_index] = out
        if self._workspaces:
            env = {"L": 1, **sizes}
            for i, code in self._workspaces:
                try:
                    elems = int(eval(code, {"__builtins__": {}}, env))
                except NameError as e:
                    raise LaunchError(f"{self.name}: workspace size {self.params[i].workspace_elems!r} uses a "
                                      f"dim that no tensor argument names ({e}); the backend must write "
                                      "static dims as numbers") from None
                values[i] = self.workspace(i, elems, device)
        for i in self._scalars:
            values[i] = float(values[i])
        return values, out

    def __call__(self, *args, out=None, **named):
        """Launch. Fast path: the compiled function's own prologue (TVM-FFI, in C) checks device, dtype,
        rank, shapes, strides and alignment before it launches, so here we only check the static extents of
        1 it cannot, and size the output and the workspace. If the prologue rejects the arguments, the
        Python validator explains what to change."""
        lean = self._lean
        if lean is not None and not named and len(args) == self._n_user:
            run = self._lean_call(lean, args, out)
            if run is not None:
                return run
        return self._general_call(args, out, named)

    def _lean_call(self, lean: "_LeanCall", args: tuple, out):
        """The lean path (see _lean_plan): the output sized from the arguments' shapes, the function called
        with them in kernel order. None: the call needs the general path (an empty problem, or arguments too
        malformed to size the output from)."""
        given = out
        try:
            for j, d in lean.nonzero:
                if not args[j].shape[d]:
                    return None     # an empty problem never launches (see _empty_problem)
            if out is None:
                first = args[self._first_tensor]
                shape = [v if v.__class__ is int else args[v[0]].shape[v[1]] for v in lean.out_dims]
                # without dtype= when it is the input's: torch parses fewer arguments (host time per call)
                out = (first.new_empty(shape) if first.dtype is lean.out_dtype
                       else first.new_empty(shape, dtype=lean.out_dtype))
            values = lean.kernel_order(args + (out,))
        except Exception:          # malformed arguments: let the validator say what is wrong
            return None
        fn = self._function if self._function is not None else self.function
        try:
            fn(*values)
        except (ValueError, TypeError) as e:    # raised by the prologue, before any launch
            return self._call_checked(args, given, rejected=e)
        return out

    def _general_call(self, args: tuple, out, named: dict):
        if named or len(args) != self._n_user or self._reshapes:
            args = self._arguments(args, named)
        if self.always_validate:
            return self._call_checked(args, out)
        try:
            prepared = ((not self._unit_dims or all(args[j].shape[d] == 1 for j, d in self._unit_dims))
                        and (out is None or not self._out_unit_dims
                             or all(out.shape[d] == 1 for d in self._out_unit_dims)))
            if prepared:
                sizes = {name: args[j].shape[d] for name, j, d in self._dim_sources}
                # an empty problem, or one past a grid limit, takes the checked path
                prepared = 0 not in sizes.values() and not (
                    self._limit_dims and any(sizes.get(d, 0) > most for d, most, _ in self._limit_dims)) and (
                    self._offsets_of_b is None or self._offsets_fit(args))
                device = args[self._first_tensor].device
                values = self._template.copy()
                for j, i in enumerate(self._user):
                    values[i] = args[j]
                values[self._out_index] = result = self._allocate_out(sizes, device) if out is None else out
                for i, code in self._workspaces:
                    values[i] = self.workspace(i, int(eval(code, {"__builtins__": {}}, {"L": 1, **sizes})), device)
        except Exception:          # malformed arguments: let the validator say what is wrong
            prepared = False
        if not prepared:
            return self._call_checked(args, out)
        try:
            self.function(*values)
        except (ValueError, TypeError) as e:    # raised by the prologue, before any launch
            return self._call_checked(args, out, rejected=e)
        return result

    def _call_checked(self, args: tuple, out, rejected: Optional[Exception] = None):
        values, result = self._prepare(args, out)
        if result.numel() == 0 or any(values[i].numel() == 0 for i in self._operands):
            return self._empty_problem(values, result)
        try:
            self.function(*values)
        except (ValueError, TypeError) as e:
            raise LaunchError(f"{self.name}: the kernel rejected its arguments: {e}") from (rejected or e)
        return result

    def _empty_problem(self, values: list, out):
        """M, N or a batch of 0: nothing to compute. K of 0: the accumulator is 0, so the output is the epilogue
        of 0, as torch gives it. Neither launches: the kernels' host code divides by the tile counts and
        would stop the process (SIGFPE), and a TMA descriptor cannot describe an empty dim."""
        if out.numel() == 0:
            return out
        if self._groups is not None:
            b = next(values[i] for i in self._operands if self.params[i].role == "b")
            if b.shape[0] == 0:         # no groups: no row is any group's, and none is written
                return out
            raise LaunchError(f"{self.name}: K = 0 (empty A and B): a grouped kernel does not run an empty "
                              "product; compile for a K of at least 1")
        if self._zero_k is None:
            raise LaunchError(f"{self.name}: K = 0 (empty A and B) and this launcher has no spec to evaluate the "
                              "epilogue of a zero accumulator; call it through gemmc.compile(...) or skip K = 0")
        a, b = (values[i] for i in self._operands)
        self._zero_k(a, b, [values[i] for i in self._epilogue_inputs], out)
        return out


class _LeanCall(NamedTuple):
    kernel_order: Callable          # (args..., out) -> the kernel's arguments in its param order
    nonzero: tuple                  # (call position, dim) of every named dim: 0 there is an empty problem
    out_dims: tuple                 # per output dim: a static int, or (call position, dim) it is read from
    out_dtype: Any


def launcher_from_artifact(artifact, *, on_load_error=None, signature: Optional[CallSignature] = None,
                           zero_k: Optional[Callable] = None) -> Launcher:
    """A Launcher for a cached `Artifact` (needs only its meta, never the compiler). Loading an SM90
    kernel on a GPU whose SM count differs from the one its grid was sized for warns once per device.
    `signature`: the caller's own arguments (see `Launcher`), e.g. a @gemmc.kernel function's. `zero_k(a, b,
    inputs, out)` writes the output of a K = 0 call (see `Launcher`)."""
    meta = artifact.meta
    check_persistent_grid(meta.get("arch", ""))
    return Launcher([param_from_dict(d) for d in meta["params"]], so_path=artifact.so_path,
                    function_name=meta["function"], runtime_flavor=meta.get("runtime_flavor", ""),
                    so_sha256=artifact.so_sha256,
                    name=meta.get("entry", "kernel"), on_load_error=on_load_error, signature=signature,
                    zero_k=zero_k)
