"""scripts/compare_ptx.py: the old emitter loads from git, and PTX is compared up to names, labels and
register numbers (no compile here: the script itself compiles)."""
import pytest

from script_support import load_script

compare = load_script("compare_ptx")

PTX = """
.visible .entry kernel_cutlass_gemm_A_0(
	.param .u64 kernel_cutlass_gemm_A_0_param_0
)
{
	.reg .b32 	%r<12>;
	mov.u32 	%r3, %tid.x;   // a comment
$L__BB0_2:
	@%p1 bra 	$L__BB0_2;
	shl.b32 	%r4, %r3, 2;
}
"""


def test_normalised_ptx_ignores_names_labels_and_registers():
    other = (PTX.replace("kernel_cutlass_gemm_A_0", "kernel_gemm_B_7").replace("%r3", "%r9").replace("%r4", "%r1")
             .replace("$L__BB0_2", "$L__BB1_5"))
    assert compare.normalise(PTX) == compare.normalise(other)
    assert compare.normalise(PTX) != compare.normalise(PTX.replace("2;", "3;"))


def test_opcodes_count_instructions_by_mnemonic():
    counts = compare.opcodes(compare.normalise(PTX))
    assert counts == {"mov.u32": 1, "bra": 1, "shl.b32": 1}


def test_the_old_emitter_is_the_text_spliced_one():
    pytest.importorskip("xdsl")
    old = compare.old_emitter()
    assert hasattr(old, "resolve_mode") and callable(old.emit)
