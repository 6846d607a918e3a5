"""What the SM80 and SM90 emit tests share: specs with epilogue inputs and the kernel params their
storage shapes call for, and the PTX of a CPU compile."""
from hypothesis import strategies as st

from gemmc.build import compile_with_ptx
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref

LAYOUTS = [("mk", "nk"), ("km", "nk"), ("mk", "kn"), ("km", "kn")]


@st.composite
def specs_with_inputs(draw):
    """Any A/B layout, batched or not, bf16 or f16, and up to three epilogue inputs of any kind
    (alternating bf16 and f32 storage), each added on by the epilogue."""
    a_layout, b_layout = draw(st.sampled_from(LAYOUTS))
    batched = draw(st.booleans())
    dtype = draw(st.sampled_from(["bf16", "f16"]))
    kinds = draw(st.lists(st.sampled_from(["row", "col", "full", "scalar"]), max_size=3))
    inputs = tuple(EpilogueInput(f"x{i}", kind, "f32" if i % 2 else "bf16") for i, kind in enumerate(kinds))
    ops = tuple(EpilogueOp("add", (Ref.acc() if i == 0 else Ref.node(i - 1), Ref.input(x.name)))
                for i, x in enumerate(inputs))
    return GemmSpec(dtype=dtype, a_layout=a_layout, b_layout=b_layout, batch="L" if batched else None,
                    inputs=inputs, epilogue=ops)


def storage_shapes(spec: GemmSpec) -> list:
    """(name, shape) of every kernel param but the split-K workspace, in order: A and B as stored
    (M/N-major swaps the dims), the output, then the epilogue inputs (a scalar has no shape)."""
    lead = ("L",) if spec.batch else ()
    want = [("a", lead + (("M", "K") if spec.a_layout == "mk" else ("K", "M"))),
            ("b", lead + (("N", "K") if spec.b_layout == "nk" else ("K", "N"))),
            ("out", lead + ("M", "N"))]
    want += [(x.name, () if x.kind == "scalar" else lead + {"row": ("N",), "col": ("M",), "full": ("M", "N")}[x.kind])
             for x in spec.inputs]
    return want


def compiled_ptx(emitted) -> str:
    """The PTX of `emitted`, compiled on this machine (the DSL needs no GPU to compile)."""
    return compile_with_ptx(emitted)[1]
