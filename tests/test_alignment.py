"""The 16-byte rule (gemmc/alignment.py) and that it has one home: the predicate, the build's divisibility hints
and the call checks read it there."""
import re
from pathlib import Path

from gemmc import DType, GemmSpec
from gemmc.alignment import ALIGN_BYTES, alignment_elems
from gemmc.schedule import alignment_violations

ROOT = Path(__file__).resolve().parents[1] / "gemmc"


def test_elements_per_16_bytes():
    assert ALIGN_BYTES == 16
    assert [alignment_elems(d) for d in (DType.f8e4m3, DType.bf16, DType.f16, DType.f32)] == [16, 8, 8, 4]


def test_the_predicate_refuses_a_static_contiguous_dim_off_the_rule():
    assert not alignment_violations(GemmSpec(16, 4096, 4104))             # 4104 bf16 = 8208 bytes
    said = " ".join(map(str, alignment_violations(GemmSpec(16, 4096, 4100))))    # A's rows and B's
    assert "16-byte alignment of A's contiguous dim K" in said and "multiple of 8" in said
    assert alignment_violations(GemmSpec(16, 4100, 4096, out_dtype="f32")) == []     # 4100 f32 = 16400 bytes
    assert alignment_violations(GemmSpec(16, 4102, 4096, out_dtype="f32"))          # the output's rows


def test_no_other_module_computes_the_rule():
    """A second `16 // bytes` or `ALIGN = 16` would drift from this one (gemmc/backends/ is another's)."""
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "alignment.py" or rel.startswith("backends/"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b16\s*//|ALIGN\w*\s*=\s*16\b", line):
                found.append(f"gemmc/{rel}:{i}: {line.strip()}")
    assert not found, "the 16-byte rule computed outside gemmc/alignment.py:\n" + "\n".join(found)
