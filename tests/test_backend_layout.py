"""The backends' shape, read from gemmc's source: the SM90 kernel is CuTe DSL modules, not text spliced and
rewritten, and modules stay small enough to read."""
from __future__ import annotations

from pathlib import Path

GEMMC = Path(__file__).resolve().parent.parent / "gemmc"
MAX_LINES = 700
# over the limit before issue 33 and not split yet: this list may only shrink
STILL_TOO_LONG: set = set()


def test_no_textual_rewrite_of_emitted_code():
    for path in GEMMC.rglob("*.py"):
        text = path.read_text()
        for name in ("resolve_mode", "_MODE_EXPRS"):
            assert name not in text, f"{path.relative_to(GEMMC)} has {name}: the kernel branches with const_expr"


def test_modules_stay_under_the_line_limit():
    long = {str(p.relative_to(GEMMC)): n for p in GEMMC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= STILL_TOO_LONG, f"over {MAX_LINES} lines: {long}; split them by job"


def test_the_sm90_kernel_is_modules_by_role():
    from gemmc.backends.sm90 import kernel
    here = {p.stem for p in (GEMMC / "backends" / "sm90" / "kernel").glob("*.py")} - {"__init__"}
    assert here == set(kernel.MODULES)
    emit = (GEMMC / "backends" / "sm90" / "emit.py").read_text()
    assert "@cute.kernel" not in emit and "Template(" not in emit    # it writes facts and the epilogue only
