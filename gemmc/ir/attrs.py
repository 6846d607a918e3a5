"""The `gemmc` dialect: the attributes both IR levels share.

  !gemmc.tensor<M x K x bf16, mk>     an operand: dims (static ints or symbolic names), dtype, layout
  #gemmc.schedule<tile = 128x128x64, cluster = 2x1, stages = auto, mode = cooperative,
                  raster = m, swizzle = 1, split_k = 1, arch = sm_90a>
                                      (`, pdl = false` follows arch when PDL is off)
"""
from __future__ import annotations

import re
from typing import Union

from xdsl.dialects.builtin import ArrayAttr, BoolAttr, IntAttr, StringAttr
from xdsl.ir import Dialect, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from ..schedule import L2_FIELDS, Schedule
from ..types import ARCHS, DType

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DTYPES = tuple(d.value for d in DType)

# layout -> rank without the batch dim. A: mk|km, B: nk|kn, the output: mn,
# epilogue inputs: how they broadcast over the M x N accumulator; a grouped GEMM's group operand, dims (E,):
# offsets (E + 1 int32 row offsets: contiguous groups) or counts (E int32 row counts: masked groups).
LAYOUT_RANK = {"mk": 2, "km": 2, "nk": 2, "kn": 2, "mn": 2, "full": 2, "row": 1, "col": 1, "scalar": 0,
               "offsets": 1, "counts": 1}

DimValue = Union[int, str]


# ---- small print/parse helpers shared by the gemmc dialects -----------------------------------

def dim_attr(d: DimValue) -> IntAttr | StringAttr:
    return IntAttr(d) if isinstance(d, int) else StringAttr(d)


def dim_value(a: IntAttr | StringAttr) -> DimValue:
    return a.data


def ints_attr(values) -> ArrayAttr:
    return ArrayAttr([IntAttr(int(v)) for v in values])


def ints_value(a: ArrayAttr) -> tuple[int, ...]:
    return tuple(x.data for x in a.data)


def print_shape(printer: Printer, values) -> None:
    """128x64x16: the MLIR shape syntax (parsed back by `parse_shape`)."""
    printer.print_string("x".join(str(int(v)) for v in values))


def parse_shape(parser: AttrParser) -> tuple[int, ...]:
    dims = parser.parse_dimension_list()
    if not dims:
        parser.raise_error("expected a shape such as 128x64")
    return tuple(dims)


def print_word(printer: Printer, word: str) -> None:
    printer.print_identifier_or_string_literal(word)


def parse_word(parser: AttrParser, what: str = "") -> str:
    return parser.parse_identifier_or_str_literal(f" for {what}" if what else "")


# ---- !gemmc.tensor -------------------------------------------------------------------------

@irdl_attr_definition
class TensorType(ParametrizedAttribute, TypeAttribute):
    """A GEMM operand: dims (ints or symbolic names, batch first), element type and layout."""
    name = "gemmc.tensor"

    shape: ArrayAttr[IntAttr | StringAttr]
    dtype: StringAttr
    layout: StringAttr

    @staticmethod
    def make(dims, dtype, layout: str) -> "TensorType":
        return TensorType(ArrayAttr([dim_attr(d) for d in dims]), StringAttr(str(dtype)), StringAttr(layout))

    @property
    def dims(self) -> tuple[DimValue, ...]:
        return tuple(dim_value(d) for d in self.shape.data)

    @property
    def element(self) -> DType:
        return DType(self.dtype.data)

    @property
    def batch(self) -> DimValue | None:
        """The leading L dim, if the tensor has one."""
        extra = len(self.dims) - LAYOUT_RANK.get(self.layout.data, 0)
        return self.dims[0] if extra == 1 else None

    def verify(self) -> None:   # xDSL runs an attribute's `verify` when it is built or parsed
        layout = self.layout.data
        if layout not in LAYOUT_RANK:
            raise VerifyException(f"!gemmc.tensor: unknown layout {layout!r}; use one of {sorted(LAYOUT_RANK)}")
        if self.dtype.data not in _DTYPES:
            raise VerifyException(f"!gemmc.tensor: unknown dtype {self.dtype.data!r}; use one of {_DTYPES}")
        rank = LAYOUT_RANK[layout]
        batchable = layout not in ("row", "col", "scalar", "offsets", "counts")
        if not (len(self.dims) == rank or (batchable and len(self.dims) == rank + 1)):
            raise VerifyException(f"!gemmc.tensor: layout {layout} needs {rank} dims"
                                  + (" (+1 batch dim)" if batchable else "") + f", got {len(self.dims)}")
        for d in self.dims:
            if isinstance(d, int) and d <= 0:
                raise VerifyException(f"!gemmc.tensor: dim {d} must be positive")
            if isinstance(d, str) and not _IDENT.match(d):
                raise VerifyException(f"!gemmc.tensor: dim name {d!r} must be an identifier")

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            for d in self.dims:
                if isinstance(d, int):
                    printer.print_string(str(d))
                elif d == "x" or d in _DTYPES:   # would read as a delimiter or the dtype: quote it
                    printer.print_string_literal(d)
                else:
                    printer.print_string(d)
                printer.print_string(" x ")
            printer.print_string(f"{self.dtype.data}, {self.layout.data}")

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        # M x 4096 x bf16, mk   (dims separated by ` x `, the last item is the dtype)
        with parser.in_angle_brackets():
            items: list[DimValue] = []
            while True:
                value = parser.parse_optional_integer(allow_boolean=False, allow_negative=False)
                if value is None:
                    value = parser.parse_optional_str_literal()
                    quoted = value is not None
                    if value is None:
                        value = parser.parse_identifier("in !gemmc.tensor dims")
                    items.append(("q:" + value) if quoted else value)
                else:
                    items.append(value)
                if parser.parse_optional_keyword("x") is None:
                    break
            parser.parse_punctuation(",")
            layout = parser.parse_identifier("(the layout) in !gemmc.tensor")
        *dims, dtype = items
        if not isinstance(dtype, str) or dtype.startswith("q:"):
            parser.raise_error("!gemmc.tensor: expected the element type after the dims")
        dims = [d[2:] if isinstance(d, str) and d.startswith("q:") else d for d in dims]
        return (ArrayAttr([dim_attr(d) for d in dims]), StringAttr(dtype), StringAttr(layout))


SCHEDULE_FIELDS = ("tile", "cluster", "stages", "mode", "raster", "swizzle", "split_k", "arch")


# ---- #gemmc.schedule -----------------------------------------------------------------------

@irdl_attr_definition
class ScheduleAttr(ParametrizedAttribute):
    """A `gemmc.Schedule`, attached to the matmul once chosen. Whether it is *legal* is decided by
    gemmc.schedule.check_schedule (run by `verify-resources`), not here: this only checks form."""
    name = "gemmc.schedule"

    tile: ArrayAttr[IntAttr]
    cluster: ArrayAttr[IntAttr]
    stages: StringAttr          # "auto" or a number
    mode: StringAttr
    raster: StringAttr
    swizzle: IntAttr
    split_k: IntAttr
    arch: StringAttr
    pdl: BoolAttr               # printed only when false, like Schedule.short()'s "_nopdl"
    swap_ab: BoolAttr           # printed only when true, like Schedule.short()'s "_swap"
    stream_k: BoolAttr          # printed only when true, like Schedule.short()'s "_streamk"
    l2_a: StringAttr            # the L2 fields, printed only when not "auto": an eviction priority...
    l2_b: StringAttr
    l2_out: StringAttr
    l2_prefetch: StringAttr     # ...and "auto" or a number of k-tiles

    @staticmethod
    def from_schedule(s: Schedule) -> "ScheduleAttr":
        return ScheduleAttr(ints_attr(s.tile), ints_attr(s.cluster), StringAttr(str(s.stages)),
                            StringAttr(s.mode), StringAttr(s.raster), IntAttr(int(s.swizzle)),
                            IntAttr(int(s.split_k)), StringAttr(s.arch), BoolAttr.from_bool(bool(s.pdl)),
                            BoolAttr.from_bool(bool(s.swap_ab)), BoolAttr.from_bool(bool(s.stream_k)),
                            *(StringAttr(str(getattr(s, f))) for f in L2_FIELDS))

    def to_schedule(self) -> Schedule:
        stages = self.stages.data
        return Schedule(tile=ints_value(self.tile), cluster=ints_value(self.cluster),
                        stages=stages if stages == "auto" else int(stages), mode=self.mode.data,
                        raster=self.raster.data, swizzle=self.swizzle.data, split_k=self.split_k.data,
                        arch=self.arch.data, pdl=bool(self.pdl.value.data),
                        swap_ab=bool(self.swap_ab.value.data), stream_k=bool(self.stream_k.value.data),
                        **{f: getattr(self, f).data for f in L2_FIELDS})

    def verify(self) -> None:
        if len(self.tile.data) != 3:
            raise VerifyException(f"#gemmc.schedule: tile needs 3 sizes (M, N, K), got {len(self.tile.data)}")
        if len(self.cluster.data) != 2:
            raise VerifyException(f"#gemmc.schedule: cluster needs 2 sizes (M, N), got {len(self.cluster.data)}")
        if self.stages.data != "auto" and not self.stages.data.isdigit():
            raise VerifyException(f"#gemmc.schedule: stages {self.stages.data!r} must be a number or 'auto'")
        if self.arch.data not in ARCHS:
            raise VerifyException(f"#gemmc.schedule: arch {self.arch.data!r}; use one of {ARCHS}")
        if self.l2_prefetch.data != "auto" and not self.l2_prefetch.data.isdigit():
            raise VerifyException(f"#gemmc.schedule: l2_prefetch {self.l2_prefetch.data!r} must be a number of "
                                  "k-tiles or 'auto'")

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            for i, f in enumerate(SCHEDULE_FIELDS):
                if i:
                    printer.print_string(", ")
                printer.print_string(f"{f} = ")
                value = getattr(self, f)
                if f in ("tile", "cluster"):
                    print_shape(printer, ints_value(value))
                elif isinstance(value, IntAttr) or (f == "stages" and value.data.isdigit()):
                    printer.print_string(str(value.data))
                else:
                    print_word(printer, value.data)
            if not self.pdl.value.data:
                printer.print_string(", pdl = false")
            if self.swap_ab.value.data:
                printer.print_string(", swap_ab = true")
            if self.stream_k.value.data:
                printer.print_string(", stream_k = true")
            for f in L2_FIELDS:
                word = getattr(self, f).data
                if word != "auto":
                    printer.print_string(f", {f} = ")
                    if word.isdigit():
                        printer.print_string(word)
                    else:
                        print_word(printer, word)

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        values = {}
        with parser.in_angle_brackets():
            for i, f in enumerate(SCHEDULE_FIELDS):
                if i:
                    parser.parse_punctuation(",")
                parser.parse_keyword(f)
                parser.parse_punctuation("=")
                if f in ("tile", "cluster"):
                    values[f] = ints_attr(parse_shape(parser))
                elif f in ("swizzle", "split_k"):
                    values[f] = IntAttr(parser.parse_integer(allow_boolean=False))
                elif f == "stages":
                    n = parser.parse_optional_integer(allow_boolean=False)
                    values[f] = StringAttr(str(n) if n is not None else parse_word(parser, f))
                else:
                    values[f] = StringAttr(parse_word(parser, f))
            # absent: their defaults (pdl on, not swapped, no stream-K, the L2 rules)
            flags = {"pdl": True, "swap_ab": False, "stream_k": False}
            l2 = {f: "auto" for f in L2_FIELDS}
            named = ", ".join([*flags, *l2])
            while parser.parse_optional_punctuation(","):
                key = parser.parse_identifier(named)
                if key not in flags and key not in l2:
                    parser.raise_error(f"#gemmc.schedule: unknown field {key!r}; expected one of {named}")
                parser.parse_punctuation("=")
                if key in flags:
                    flags[key] = parser.parse_boolean()
                else:
                    n = parser.parse_optional_integer(allow_boolean=False)
                    l2[key] = str(n) if n is not None else parse_word(parser, key)
        return (*(values[f] for f in SCHEDULE_FIELDS), BoolAttr.from_bool(flags["pdl"]),
                BoolAttr.from_bool(flags["swap_ab"]), BoolAttr.from_bool(flags["stream_k"]),
                *(StringAttr(l2[f]) for f in L2_FIELDS))


Gemmc = Dialect("gemmc", [], [TensorType, ScheduleAttr])
