"""The `kernel` dialect: how the GEMM runs. One op per fact of gemmc/ir/plan.py, each written by one pass.

  %out = kernel.gemm @gemm(%a, %b) acc f32 -> !gemmc.tensor<M x N x bf16, mn>
         arch sm_90a tile 128x128x64 mode cooperative threads 384 schedule #gemmc.schedule<...> {
    kernel.warpgroup producer index 0 regs 40 warps 4              // assign-warpgroup-roles
    kernel.warpgroup consumer index 1 regs 232 warps 4
    kernel.warpgroup consumer index 2 regs 232 warps 4
    kernel.mma wgmma inst 64x128x16 atoms 2x1x1
    (kernel.scaling block promote 128 accumulators 2               // fp8 GEMMs only)
    kernel.cluster 2x1                                              // tma-cluster-layout
    kernel.copy a tma box 128x64 swizzle 128 l2 first_once
    kernel.copy b tma box 64x64 swizzle 128 multicast 2 along m l2 first_once
    kernel.copy out tma_store box 128x32 swizzle 64
    kernel.pipeline stages 6 barriers [full, empty] epi_stages 2 epi_tile 128x32 smem 214016   // pipeline-staging
    kernel.tile_scheduler persistent true raster m swizzle 1 split_k 1 split_k_mode none pdl true pdl_early_ctas 82 pdl_full_ctas 118 pdl_prefetch_k_tiles 2 max_active_clusters 66
    kernel.epilogue store tma {
    ^bb0(%acc: f32):
      gemm.yield %acc
    }
  }

A grouped GEMM's kernel also has `kernel.group contiguous groups E order m walk warp_scan descriptors shared`
(map-groups), and stores from registers (`kernel.copy out st_global`, `kernel.epilogue store direct`).

Every fact op prints as `kernel.<op> <positional values> (<keyword> <value>)*`, from its FIELDS table,
which also declares its properties; a field left out of the text holds its default (a_from smem,
multicast 1, ...). A schedule's L2 fields show on the copies (l2_a = last: `kernel.copy a ... l2 last`) and
the tile scheduler (l2_prefetch = 8: `pdl_prefetch_k_tiles 8 pdl_prefetch_of b pdl_prefetch_banded false`).
"""
from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import ArrayAttr, BoolAttr, IntAttr, IntegerAttr, StringAttr
from xdsl.ir import Attribute, Block, Dialect, Region, SSAValue
from xdsl.irdl import (IRDLOperation, irdl_op_definition, lazy_traits_def, opt_prop_def, prop_def, region_def,
                       traits_def)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, NoTerminator
from xdsl.utils.exceptions import VerifyException

from ..schedule import SM80_COMPILE_ARCHS
from ..spec import SCALE_BLOCK, SCALINGS
from ..types import ARCHS
from .attrs import (ScheduleAttr, TensorType, ints_attr, ints_value, parse_shape, parse_word, print_shape,
                    print_word)
from .gemm import GemmSignature, arg_name

_REQUIRED = object()


def _to_attr(kind: str, value) -> Attribute:
    if kind == "int":
        return IntAttr(int(value))
    if kind == "word":
        return StringAttr(str(value))
    if kind == "shape":
        return ints_attr(value)
    if kind == "words":
        return ArrayAttr([StringAttr(str(v)) for v in value])
    if kind == "bool":
        return BoolAttr.from_bool(bool(value))
    if kind == "dim":       # a problem dim: static (an int) or symbolic (a name)
        return IntAttr(value) if isinstance(value, int) else StringAttr(str(value))
    raise AssertionError(kind)


# the attribute that holds a value of each field kind
_KIND_ATTRS = {"int": IntAttr, "word": StringAttr, "shape": ArrayAttr, "words": ArrayAttr, "bool": IntegerAttr,
               "dim": (IntAttr, StringAttr)}


def _from_attr(kind: str, attr: Attribute):
    if kind in ("int", "word", "dim"):
        return attr.data
    if kind == "shape":
        return ints_value(attr)
    if kind == "words":
        return tuple(a.data for a in attr.data)
    if kind == "bool":
        return bool(attr.value.data)
    raise AssertionError(kind)


def _in_kernel():
    return lazy_traits_def(lambda: (HasParent(KernelGemmOp),))


class FactOp(IRDLOperation):
    """A kernel fact: properties listed in FIELDS as (name, keyword or None if positional, kind, default).
    Fields with a default are left out of the text when they hold it."""
    FIELDS: ClassVar[tuple] = ()
    traits = _in_kernel()

    def __init_subclass__(cls, **kwargs):
        # FIELDS is the one description of a fact: its properties are declared from it, before
        # @irdl_op_definition reads the class
        super().__init_subclass__(**kwargs)
        for name, _kw, kind, _default in cls.__dict__.get("FIELDS", ()):
            attrs = _KIND_ATTRS[kind]
            setattr(cls, name, prop_def(attrs[0] | attrs[1] if isinstance(attrs, tuple) else attrs))

    @classmethod
    def make(cls, **values):
        props = {}
        for name, _kw, kind, default in cls.FIELDS:
            value = values.pop(name, default)
            if value is _REQUIRED:
                raise TypeError(f"{cls.name}: missing {name}")
            props[name] = _to_attr(kind, value)
        if values:
            raise TypeError(f"{cls.name}: unknown fields {sorted(values)}")
        return cls.create(properties=props)

    def get(self, name: str):
        for field, _kw, kind, _default in self.FIELDS:
            if field == name:
                return _from_attr(kind, self.properties[name])
        raise KeyError(name)

    def values(self) -> dict:
        return {f: self.get(f) for f, *_ in self.FIELDS}

    def verify_(self) -> None:
        for name, _kw, kind, _default in self.FIELDS:
            if not isinstance(self.properties.get(name), _KIND_ATTRS[kind]):
                raise VerifyException(f"{self.name}: missing or malformed {name}")
        self.check()

    def check(self) -> None:
        """Op-specific rules; raise VerifyException naming the field and the allowed values."""

    def fail_unless(self, ok: bool, message: str) -> None:
        if not ok:
            raise VerifyException(f"{self.name}: {message}")

    def print(self, printer: Printer) -> None:
        for name, kw, kind, default in self.FIELDS:
            value = self.get(name)
            if default is not _REQUIRED and value == default:
                continue
            printer.print_string(" ")
            if kw is not None:
                printer.print_string(kw + " ")
            if kind == "int" or (kind == "dim" and isinstance(value, int)):
                printer.print_string(str(value))
            elif kind in ("word", "dim"):
                print_word(printer, value)
            elif kind == "shape":
                print_shape(printer, value)
            elif kind == "bool":
                printer.print_string("true" if value else "false")
            else:
                with printer.in_square_brackets():
                    printer.print_list(value, lambda w: print_word(printer, w))

    @classmethod
    def parse(cls, parser: Parser):
        values = {}
        for name, kw, kind, default in cls.FIELDS:
            if kw is not None:
                if default is not _REQUIRED:
                    if parser.parse_optional_keyword(kw) is None:
                        continue
                else:
                    parser.parse_keyword(kw)
            if kind == "int":
                values[name] = parser.parse_integer(allow_boolean=False)
            elif kind == "dim":
                value = parser.parse_optional_integer(allow_boolean=False, allow_negative=False)
                values[name] = value if value is not None else parse_word(parser, name)
            elif kind == "word":
                values[name] = parse_word(parser, name)
            elif kind == "shape":
                values[name] = parse_shape(parser)
            elif kind == "bool":
                values[name] = parser.parse_boolean()
            else:
                values[name] = parser.parse_comma_separated_list(parser.Delimiter.SQUARE,
                                                                 lambda: parse_word(parser, name))
        return cls.make(**values)


@irdl_op_definition
class WarpGroupOp(FactOp):
    """A warpgroup (4 warps) and its job. SM80 has no producer: all warps are `uniform`."""
    name = "kernel.warpgroup"
    FIELDS: ClassVar[tuple] = (("role", None, "word", _REQUIRED), ("index", "index", "int", _REQUIRED),
              ("regs", "regs", "int", _REQUIRED), ("warps", "warps", "int", _REQUIRED))
    ROLES: ClassVar[tuple] = ("producer", "consumer", "epilogue", "uniform")

    def check(self) -> None:
        v = self.values()
        self.fail_unless(v["role"] in self.ROLES, f"role {v['role']!r}; use one of {self.ROLES}")
        self.fail_unless(v["index"] >= 0, f"index {v['index']} must be >= 0")
        self.fail_unless(1 <= v["warps"] <= 4, f"warps {v['warps']}: a warpgroup has 1 to 4 warps")
        # setmaxnreg takes 24..256 in steps of 8; 0 leaves the choice to the compiler
        self.fail_unless(v["regs"] == 0 or (24 <= v["regs"] <= 256 and v["regs"] % 8 == 0),
                         f"regs {v['regs']}: use 0 (compiler's choice) or a multiple of 8 from 24 to 256")


@irdl_op_definition
class MmaOp(FactOp):
    """The tensor-core instruction, its shape (M x N x K) and how atoms tile the CTA tile."""
    name = "kernel.mma"
    FIELDS: ClassVar[tuple] = (("kind", None, "word", _REQUIRED), ("inst", "inst", "shape", _REQUIRED),
              ("atoms", "atoms", "shape", _REQUIRED), ("a_source", "a_from", "word", "smem"))

    def check(self) -> None:
        v = self.values()
        self.fail_unless(len(v["inst"]) == 3 and len(v["atoms"]) == 3, "inst and atoms are M x N x K shapes")
        m, n, k = v["inst"]
        if v["kind"] == "wgmma":
            self.fail_unless(m == 64 and n % 8 == 0 and 8 <= n <= 256 and k in (16, 32),
                             f"wgmma inst {m}x{n}x{k}: M is 64, N a multiple of 8 up to 256, K 16 (32 for fp8)")
        elif v["kind"] == "mma.sync":
            self.fail_unless((m, n, k) in ((16, 8, 16), (16, 8, 8)), f"mma.sync inst {m}x{n}x{k}: use 16x8x16")
        else:
            self.fail_unless(False, f"kind {v['kind']!r}; use wgmma or mma.sync")
        self.fail_unless(v["a_source"] in ("smem", "rmem"), f"a_from {v['a_source']!r}; use smem or rmem")
        self.fail_unless(min(v["atoms"]) >= 1, "atoms must be positive")


@irdl_op_definition
class ScalingOp(FactOp):
    """How an fp8 GEMM applies its scales: `promote` is the K extent after which the consumers add the fp8
    WGMMA accumulator into an f32 sum (multiplied by the block's scales under block scaling), holding
    `accumulators` accumulators; 0: the WGMMA accumulator holds the whole K sum, scaled in the epilogue."""
    name = "kernel.scaling"
    FIELDS: ClassVar[tuple] = (("mode", None, "word", _REQUIRED), ("promote", "promote", "int", 0),
                               ("accumulators", "accumulators", "int", 1))

    def check(self) -> None:
        v = self.values()
        self.fail_unless(v["mode"] in SCALINGS, f"mode {v['mode']!r}; use one of {SCALINGS}")
        self.fail_unless(v["promote"] >= 0 and v["promote"] % 32 == 0,
                         f"promote {v['promote']}: a multiple of the fp8 MMA's K of 32, or 0 (never)")
        self.fail_unless(v["accumulators"] == (2 if v["promote"] else 1),
                         f"accumulators {v['accumulators']}: promotion holds 2 (the WGMMA's and the f32 sum), "
                         "else 1")
        self.fail_unless(v["mode"] != "block" or v["promote"] == SCALE_BLOCK,
                         f"block scaling promotes every {SCALE_BLOCK} elements of K (once per scale block): "
                         f"promote {SCALE_BLOCK}")


@irdl_op_definition
class ClusterOp(FactOp):
    """CTAs per cluster (M x N)."""
    name = "kernel.cluster"
    FIELDS: ClassVar[tuple] = (("shape", None, "shape", _REQUIRED),)

    def check(self) -> None:
        shape = self.get("shape")
        self.fail_unless(len(shape) == 2 and min(shape) >= 1, f"shape {shape} must be M x N, positive")


@irdl_op_definition
class CopyOp(FactOp):
    """How one operand moves between global and shared memory (or registers). `l2`: the L2 eviction priority
    of a TMA copy's cache hint: first, normal or last on every copy; first_once (A and B loads) evict-first in
    the calls whose grid loads each of the operand's tiles once, else the default; absent: no hint chosen."""
    name = "kernel.copy"
    FIELDS: ClassVar[tuple] = (("operand", None, "word", _REQUIRED), ("kind", None, "word", _REQUIRED),
              ("box", "box", "shape", _REQUIRED), ("swizzle_bytes", "swizzle", "int", _REQUIRED),
              ("multicast", "multicast", "int", 1), ("multicast_along", "along", "word", ""),
              ("vector_bytes", "vector", "int", 16), ("l2_policy", "l2", "word", ""))
    KINDS: ClassVar[tuple] = ("tma", "tma_store", "cp_async", "ldg", "st_global")
    L2_POLICIES: ClassVar[tuple] = ("", "first_once", "first", "normal", "last")

    def check(self) -> None:
        v = self.values()
        self.fail_unless(v["kind"] in self.KINDS, f"kind {v['kind']!r}; use one of {self.KINDS}")
        self.fail_unless(len(v["box"]) == 2 and min(v["box"]) >= 1, f"box {v['box']} must be rows x cols, positive")
        self.fail_unless(v["swizzle_bytes"] in (0, 32, 64, 128), f"swizzle {v['swizzle_bytes']}; use 0, 32, 64 or 128")
        self.fail_unless(v["multicast"] >= 1, f"multicast {v['multicast']} must be >= 1")
        self.fail_unless((v["multicast"] > 1) == (v["multicast_along"] in ("m", "n")),
                         "a multicast copy says along m or n; a plain copy says neither")
        self.fail_unless(v["vector_bytes"] in (2, 4, 8, 16), f"vector {v['vector_bytes']}; use 2, 4, 8 or 16 bytes")
        self.fail_unless(v["l2_policy"] in self.L2_POLICIES,
                         f"l2 {v['l2_policy']!r}; use one of {self.L2_POLICIES[1:]} (or leave it out: no hint)")
        self.fail_unless(not v["l2_policy"] or v["kind"] in ("tma", "tma_store"),
                         f"l2 is a TMA copy's cache hint; a {v['kind']} copy has none")
        self.fail_unless(v["l2_policy"] != "first_once" or v["kind"] == "tma",
                         "l2 first_once is a TMA load's rule (per call, from the grid); a store takes first, normal "
                         "or last")


@irdl_op_definition
class PipelineOp(FactOp):
    """The A/B shared-memory ring, its barriers, and the epilogue's staging buffers. SM80 kernels also carry
    ring_smem (the bytes the kernel allocates: each operand's ring at a 1024-byte boundary, no barrier
    reserve) and compile_arch (the target they are built for, whose per-CTA shared memory the ring must
    fit); both are absent (0, "") on sm_90a."""
    name = "kernel.pipeline"
    FIELDS: ClassVar[tuple] = (("stages", "stages", "int", _REQUIRED), ("barriers", "barriers", "words", _REQUIRED),
              ("epi_stages", "epi_stages", "int", _REQUIRED), ("epi_tile", "epi_tile", "shape", _REQUIRED),
              ("smem_bytes", "smem", "int", _REQUIRED), ("ring_smem_bytes", "ring_smem", "int", 0),
              ("compile_arch", "compile_arch", "word", ""))

    def check(self) -> None:
        v = self.values()
        self.fail_unless(v["stages"] >= 1, f"stages {v['stages']} must be >= 1")
        self.fail_unless(len(v["barriers"]) >= 1, "name at least one barrier kind")
        self.fail_unless(v["epi_stages"] >= 0, f"epi_stages {v['epi_stages']} must be >= 0")
        self.fail_unless(len(v["epi_tile"]) == 2 and min(v["epi_tile"]) >= 1, "epi_tile is rows x cols, positive")
        self.fail_unless(v["smem_bytes"] >= 0, "smem must be >= 0")
        self.fail_unless(v["ring_smem_bytes"] >= 0 and v["ring_smem_bytes"] % 1024 == 0,
                         f"ring_smem {v['ring_smem_bytes']}: a whole number of 1024-byte blocks (each operand's ring "
                         "starts at a 1024-byte boundary), >= 0")
        self.fail_unless(v["compile_arch"] in ("",) + SM80_COMPILE_ARCHS,
                         f"compile_arch {v['compile_arch']!r}; use one of {SM80_COMPILE_ARCHS} (SM80 kernels)")


@irdl_op_definition
class TileSchedulerOp(FactOp):
    """Which CTA computes which output tile: persistence, raster order, swizzle, split-K; and whether
    the kernels launch as programmatic dependents (pdl: griddepcontrol, sm_90a only; absent = plain).
    split_k_mode says who sums the split-K partials (in split order): serial = a second, reduce kernel;
    fixup = the GEMM kernel, the last split of each tile to finish (sm_90a); stream = stream-K (split_k 1):
    each cluster takes an equal share of all k-iterations, and the last CTA of a split tile sums its partials.
    Under pdl, the kernel prefetches pdl_prefetch_k_tiles k-tiles of its first tile into L2 before it waits:
    of both operands (pdl_prefetch_of ab) or of b only (the weights), and only in grids of the PDL bands
    (pdl_prefetch_banded true) or in every grid."""
    name = "kernel.tile_scheduler"
    FIELDS: ClassVar[tuple] = (("persistent", "persistent", "bool", _REQUIRED), ("raster", "raster", "word", _REQUIRED),
              ("swizzle", "swizzle", "int", _REQUIRED), ("split_k", "split_k", "int", _REQUIRED),
              ("split_k_mode", "split_k_mode", "word", _REQUIRED), ("pdl", "pdl", "bool", False),
              ("pdl_early_ctas", "pdl_early_ctas", "int", 0), ("pdl_full_ctas", "pdl_full_ctas", "int", 0),
              ("pdl_prefetch_k_tiles", "pdl_prefetch_k_tiles", "int", 0),
              ("pdl_prefetch_of", "pdl_prefetch_of", "word", "ab"),
              ("pdl_prefetch_banded", "pdl_prefetch_banded", "bool", True),
              ("max_active_clusters", "max_active_clusters", "int", 0))

    def check(self) -> None:
        v = self.values()
        self.fail_unless(v["raster"] in ("m", "n"), f"raster {v['raster']!r}; use m or n")
        self.fail_unless(v["swizzle"] >= 1 and v["split_k"] >= 1, "swizzle and split_k are >= 1")
        self.fail_unless(v["split_k_mode"] in ("none", "serial", "fixup", "stream"),
                         f"split_k_mode {v['split_k_mode']!r}")
        self.fail_unless((v["split_k"] > 1) == (v["split_k_mode"] not in ("none", "stream")),
                         "split_k_mode is none or stream exactly when split_k is 1")
        self.fail_unless(v["pdl_early_ctas"] >= 0 and (v["pdl"] or v["pdl_early_ctas"] == 0),
                         "pdl_early_ctas is >= 0, and 0 without pdl")
        self.fail_unless(v["pdl_full_ctas"] == 0 or (v["pdl"] and v["pdl_full_ctas"] > v["pdl_early_ctas"]),
                         "pdl_full_ctas is 0 (none), or above pdl_early_ctas under pdl")
        self.fail_unless(v["pdl_prefetch_k_tiles"] >= 0 and (v["pdl"] or v["pdl_prefetch_k_tiles"] == 0),
                         "pdl_prefetch_k_tiles is >= 0, and 0 without pdl")
        self.fail_unless(v["pdl_prefetch_of"] in ("ab", "b"),
                         f"pdl_prefetch_of {v['pdl_prefetch_of']!r}; use ab (both operands) or b (the weights)")
        self.fail_unless((v["max_active_clusters"] >= 1) == bool(v["persistent"]) and v["max_active_clusters"] >= 0,
                         "max_active_clusters (the persistent grid's cap: clusters resident at once) is >= 1 exactly "
                         "when persistent is true; run pipeline-staging to set it")


@irdl_op_definition
class GroupOp(FactOp):
    """A grouped GEMM (map-groups): its layout and group count E; the order of one group's tiles (M or N
    fastest); how a CTA finds the group of its next work unit (walk: warp_scan, a cursor over the groups
    that only moves forward, 32 groups a step, one per lane, with a warp prefix sum of their tile counts);
    and the TMA descriptors (shared: one per operand, a group's first row or index in its coordinates)."""
    name = "kernel.group"
    FIELDS: ClassVar[tuple] = (("layout", None, "word", _REQUIRED), ("groups", "groups", "dim", _REQUIRED),
              ("order", "order", "word", _REQUIRED), ("group_walk", "walk", "word", _REQUIRED),
              ("descriptors", "descriptors", "word", _REQUIRED))
    LAYOUTS: ClassVar[tuple] = ("contiguous", "masked")
    WALKS: ClassVar[tuple] = ("warp_scan",)
    DESCRIPTORS: ClassVar[tuple] = ("shared",)

    def check(self) -> None:
        v = self.values()
        self.fail_unless(v["layout"] in self.LAYOUTS, f"layout {v['layout']!r}; use one of {self.LAYOUTS}")
        self.fail_unless(not isinstance(v["groups"], int) or v["groups"] >= 1, f"groups {v['groups']} must be >= 1")
        self.fail_unless(v["order"] in ("m", "n"), f"order {v['order']!r}; use m or n")
        self.fail_unless(v["group_walk"] in self.WALKS, f"walk {v['group_walk']!r}; use one of {self.WALKS}")
        self.fail_unless(v["descriptors"] in self.DESCRIPTORS, f"descriptors {v['descriptors']!r}: the kernel "
                         f"is built for {self.DESCRIPTORS} (per-group tensormap updates are not)")


@irdl_op_definition
class EpilogueOp(IRDLOperation):
    """The epilogue's elementwise ops (moved from gemm.matmul) and the store path (tma | direct),
    which tma-cluster-layout decides."""
    name = "kernel.epilogue"
    store = opt_prop_def(StringAttr)
    body = region_def("single_block")
    traits = _in_kernel()

    def __init__(self, body: Region, store: str | None = None):
        super().__init__(regions=[body], properties={"store": StringAttr(store)} if store else {})

    def verify_(self) -> None:
        if self.store is not None and self.store.data not in ("tma", "direct"):
            raise VerifyException(f"kernel.epilogue: store {self.store.data!r}; use tma or direct")

    def print(self, printer: Printer) -> None:
        if self.store is not None:
            printer.print_string(f" store {self.store.data}")
        printer.print_string(" ")
        printer.print_region(self.body)

    @classmethod
    def parse(cls, parser: Parser) -> "EpilogueOp":
        store = parse_word(parser, "store") if parser.parse_optional_keyword("store") else None
        return cls(parser.parse_region(), store)


SINGLETONS = (MmaOp, ScalingOp, ClusterOp, PipelineOp, TileSchedulerOp, GroupOp, EpilogueOp)


@irdl_op_definition
class KernelGemmOp(GemmSignature):
    """One CTA-level GEMM kernel: the problem (operands), the tile, and a body of kernel facts."""
    name = "kernel.gemm"
    arch = prop_def(StringAttr)
    tile = prop_def(ArrayAttr)
    mode = prop_def(StringAttr)
    threads = prop_def(IntAttr)
    schedule = prop_def(ScheduleAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    MODES: ClassVar[tuple] = ("cooperative", "pingpong", "multistage")

    def __init__(self, name: str, a: SSAValue, b: SSAValue, inputs, out_type: TensorType, acc_dtype: str,
                 arch: str, tile, mode: str, threads: int, schedule: ScheduleAttr, body: Region | None = None,
                 gate: str | None = None, groups: SSAValue | None = None, scaled: tuple | None = None):
        props = {**self.header_props(arch, tile, mode, threads), "schedule": schedule}
        super().__init__(name, a, b, inputs, out_type, acc_dtype, body or Region(Block()), props, gate, groups,
                         scaled)

    @staticmethod
    def header_props(arch: str, tile, mode: str, threads: int) -> dict:
        return {"arch": StringAttr(arch), "tile": ints_attr(tile), "mode": StringAttr(mode),
                "threads": IntAttr(threads)}

    def set_header(self, arch: str, tile, mode: str, threads: int) -> None:
        """Rewrite arch, tile, mode and threads (assign-warpgroup-roles derives them from the schedule)."""
        self.properties.update(self.header_props(arch, tile, mode, threads))

    @property
    def header(self) -> dict:
        return {"arch": self.arch.data, "tile": ints_value(self.tile), "mode": self.mode.data,
                "threads": self.threads.data}

    # -- facts --------------------------------------------------------------------------
    def ops_of(self, cls) -> list:
        return [op for op in self.body.block.ops if isinstance(op, cls)]

    def fact(self, cls):
        found = self.ops_of(cls)
        return found[0] if found else None

    @property
    def epilogue_op(self) -> EpilogueOp:
        return self.fact(EpilogueOp)

    @property
    def epilogue_region(self) -> Region:
        return self.epilogue_op.body

    def add_fact(self, op) -> None:
        """Insert before kernel.epilogue, so facts read in pass order and the epilogue comes last."""
        ep = self.epilogue_op
        if ep is None:
            self.body.block.add_op(op)
        else:
            self.body.block.insert_op_before(op, ep)

    def drop_facts(self, *classes) -> None:
        """Passes replace their own facts, so running a pass twice is harmless."""
        for op in [op for op in self.body.block.ops if isinstance(op, classes)]:
            op.detach()
            op.erase()

    def verify_(self) -> None:
        if self.arch.data not in ARCHS:
            raise VerifyException(f"kernel.gemm: arch {self.arch.data!r}; use one of {ARCHS}")
        if self.mode.data not in self.MODES:
            raise VerifyException(f"kernel.gemm: mode {self.mode.data!r}; use one of {self.MODES}")
        if len(self.tile.data) != 3:
            raise VerifyException("kernel.gemm: tile is M x N x K")
        for cls in SINGLETONS:
            if len(self.ops_of(cls)) > 1:
                raise VerifyException(f"kernel.gemm: more than one {cls.name}")
        if self.epilogue_op is None:
            raise VerifyException("kernel.gemm: the body needs a kernel.epilogue")
        self.signature_verify("kernel.gemm")
        wgs = self.ops_of(WarpGroupOp)
        if wgs:
            indices = [w.get("index") for w in wgs]
            if sorted(indices) != list(range(len(wgs))):
                raise VerifyException(f"kernel.gemm: warpgroup indices {indices} must be 0..{len(wgs) - 1}")
            threads = 32 * sum(w.get("warps") for w in wgs)
            if threads != self.threads.data:
                raise VerifyException(f"kernel.gemm: threads {self.threads.data} but the warpgroups have {threads}")
        pipe = self.fact(PipelineOp)
        if pipe is not None and self.arch.data != "sm_80" and (pipe.get("compile_arch") or pipe.get("ring_smem_bytes")):
            raise VerifyException(f"kernel.pipeline: compile_arch and ring_smem are SM80 facts, but the kernel is "
                                  f"{self.arch.data}: drop them")
        group = self.fact(GroupOp)
        if group is not None and group.get("layout") != self.group_layout:
            raise VerifyException(f"kernel.group: layout {group.get('layout')}, but the kernel "
                                  + (f"is {self.group_layout}" if self.group_layout else "is not grouped")
                                  + ": rerun map-groups")
        sched = self.fact(TileSchedulerOp)
        if sched is not None and sched.get("pdl") and self.arch.data != "sm_90a":
            raise VerifyException(f"kernel.tile_scheduler: pdl true needs sm_90a (griddepcontrol), but the kernel "
                                  f"is {self.arch.data}: drop `pdl true` (sm_80 kernels launch plain)")
        self._verify_fp8_facts()
        names = {"a", "b", "out"} | {arg_name(x) for x in (*self.scales, *self.inputs)}
        if self.groups is not None:
            names.add(arg_name(self.groups))
        seen = set()
        for copy in self.ops_of(CopyOp):
            operand = copy.get("operand")
            if operand not in names:
                raise VerifyException(f"kernel.copy: unknown operand {operand!r}; use one of {sorted(names)}")
            if operand in seen:
                raise VerifyException(f"kernel.copy: two copies of operand {operand!r}; keep one")
            seen.add(operand)

    def _verify_fp8_facts(self) -> None:
        """The MMA's K is 32 for fp8 operands (16 otherwise); an fp8 kernel's kernel.scaling names its mode."""
        fp8 = self.scaling is not None
        mma, scaling = self.fact(MmaOp), self.fact(ScalingOp)
        if mma is not None and mma.get("kind") == "wgmma" and mma.get("inst")[2] != (32 if fp8 else 16):
            raise VerifyException(f"kernel.mma: inst K {mma.get('inst')[2]}, but the operands are "
                                  f"{self.a.type.dtype.data}: wgmma takes K {32 if fp8 else 16} for them")
        if scaling is not None and (not fp8 or scaling.get("mode") != self.scaling.data):
            raise VerifyException(f"kernel.scaling {scaling.get('mode')}, but the kernel's scaling is "
                                  f"{self.scaling.data if fp8 else 'none (not fp8)'}: rerun assign-warpgroup-roles")

    def print_header(self, printer: Printer) -> None:
        printer.print_string(f"\narch {self.arch.data} tile ")
        print_shape(printer, ints_value(self.tile))
        printer.print_string(f" mode {self.mode.data} threads {self.threads.data}\nschedule ")
        printer.print_attribute(self.schedule)

    @classmethod
    def parse(cls, parser: Parser) -> "KernelGemmOp":
        signature, options = cls.parse_signature(parser)
        parser.parse_keyword("arch")
        arch = parse_word(parser, "arch")
        parser.parse_keyword("tile")
        tile = parse_shape(parser)
        parser.parse_keyword("mode")
        mode = parse_word(parser, "mode")
        parser.parse_keyword("threads")
        threads = parser.parse_integer(allow_boolean=False)
        parser.parse_keyword("schedule")
        schedule = parser.parse_attribute()
        return cls(*signature, arch, tile, mode, threads, schedule, parser.parse_region(), **options)


Kernel = Dialect("kernel", [KernelGemmOp, WarpGroupOp, MmaOp, ScalingOp, ClusterOp, CopyOp, PipelineOp,
                            TileSchedulerOp, GroupOp, EpilogueOp], [])
