"""`trace(fn)`: bind a kernel function's annotated parameters to traced values, call it once under a `Tracer`,
and hand what it returned to `spec_from_trace`."""
from __future__ import annotations

import inspect
import re
import sys
import traceback

from ..errors import SpecError, TraceError
from ..spec import Ref
from ..types import DType, as_dtype
from .locations import file_line, is_library_file, trace_error
from .parameter_types import GroupIndexType, Scalar, TensorType
from .spec_from_trace import spec_from_trace
from .tracer import Tracer
from .values import Value


def _param_line(fn, name: str) -> str:
    filename = fn.__code__.co_filename
    try:
        lines, start = inspect.getsourcelines(fn)
        for i, text in enumerate(lines):
            if re.search(rf"\b{re.escape(name)}\s*[:,)=]", text) and i + start >= fn.__code__.co_firstlineno:
                return file_line(filename, start + i)
    except (OSError, TypeError):
        pass
    return file_line(filename, fn.__code__.co_firstlineno)


def evaluated_signature(fn) -> inspect.Signature:
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception as e:  # a NameError in a string annotation, ...
        raise TraceError(f"{file_line(fn.__code__.co_filename, fn.__code__.co_firstlineno)}: cannot evaluate the "
                         f"annotations of {fn.__name__}: {e}") from e


def _call_recording_return_line(fn, args):
    """Call fn(*args); also return the line of the `return` that ended it (None if unknown)."""
    ret = {}
    code = fn.__code__

    def profile(frame, event, arg):
        if event == "return" and frame.f_code is code:
            ret["line"] = frame.f_lineno

    if sys.getprofile() is not None:  # someone is profiling: do not replace their hook
        return fn(*args), None
    sys.setprofile(profile)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(None)
    return result, ret.get("line")


def trace(fn, acc_dtype=DType.f32, name: str | None = None):
    """Trace `fn` into (GemmSpec, {"a": param, "b": param}, [param names in call order])."""
    try:
        acc_dtype = as_dtype(acc_dtype)
    except SpecError as e:
        raise TraceError(f"acc_dtype: {e}") from None
    tracer = Tracer(fn, acc_dtype)
    sig = evaluated_signature(fn)
    values = []
    for p in sig.parameters.values():
        where = _param_line(fn, p.name)
        tracer.param_lines[p.name] = where
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise trace_error(where, f"parameter {p.name}: *args, **kwargs and keyword-only parameters are not "
                              "supported")
        ann = p.annotation
        if isinstance(ann, TensorType):
            tracer.params[p.name] = ann
            values.append(Value(tracer, None, ann.shape, param=p.name, line=where))
        elif isinstance(ann, GroupIndexType):
            tracer.params[p.name] = ann
            length = ann.groups + 1 if isinstance(ann.groups, int) and ann.kind == "offsets" else ann.groups
            values.append(Value(tracer, None, (length,), param=p.name, line=where))
        elif ann is Scalar or ann is float:
            tracer.params[p.name] = "scalar"
            values.append(Value(tracer, None, (), param=p.name, line=where))
        else:
            what = "has no annotation" if ann is inspect.Parameter.empty else f"has annotation {ann!r}"
            raise trace_error(where, f"parameter {p.name} {what}: annotate it gemmc.Tensor[(dims...), dtype], "
                              "gemmc.Scalar, or a grouped GEMM's gemmc.GroupOffsets[E] / gemmc.GroupCounts[E]")
    # Scalars are epilogue inputs from the start (they can never be matmul operands).
    for v in values:
        if v._shape == () and tracer.params[v._param] == "scalar":
            v._ref = Ref.input(v._param)
            tracer.epilogue_uses[v._param] = [((), v._line)]

    try:
        result, ret_line = _call_recording_return_line(fn, values)
    except TraceError:
        raise
    except Exception as e:  # e.g. a TypeError inside the user's code: point at the user's line
        frames = [f for f in traceback.extract_tb(e.__traceback__) if not is_library_file(f.filename)]
        where = file_line(frames[-1].filename, frames[-1].lineno) if frames else "<unknown>"
        raise trace_error(where, f"{type(e).__name__} while tracing {fn.__name__}: {e}") from e
    ret_where = file_line(fn.__code__.co_filename, ret_line if ret_line is not None else fn.__code__.co_firstlineno)
    return spec_from_trace(tracer, fn, result, ret_where, name or fn.__name__)
