"""Hand-written gemm-level IR: what the verifier must refuse because the problem read back from it
(`spec_of`) would differ from the text."""
import pytest
from xdsl.utils.exceptions import VerifyException

from gemmc.ir import parse_module, print_module
from gemmc.ir.build import spec_from_module, spec_to_module


def batched_with_full_input(full_type: str) -> str:
    return f'''builtin.module {{
  %a = gemm.arg "a" : !gemmc.tensor<L x M x K x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<L x N x K x bf16, nk>
  %r = gemm.arg "r" : {full_type}
  %out = gemm.matmul @g(%a, %b) inputs(%r) acc f32 -> !gemmc.tensor<L x M x N x bf16, mn> epilogue {{
  ^bb0(%acc: f32, %r_1: f32):
    %0 = gemm.add %acc, %r_1
    gemm.yield %0
  }}
}}
'''


@pytest.mark.parametrize("full_type,dims", [
    ("!gemmc.tensor<M x N x f32, full>", r"\('M', 'N'\)"),
    ("!gemmc.tensor<L2 x M x N x f32, full>", r"\('L2', 'M', 'N'\)"),
])
def test_a_full_input_has_the_outputs_batch(full_type, dims):
    # both were accepted, and read back as a full input of dims L x M x N: the text said otherwise
    with pytest.raises(VerifyException, match=r"gemm.matmul: full input r must have dims \('L', 'M', 'N'\), "
                                              f"got {dims}"):
        parse_module(batched_with_full_input(full_type))


def test_a_batched_full_input_round_trips_through_the_spec():
    text = batched_with_full_input("!gemmc.tensor<L x M x N x f32, full>")
    assert print_module(spec_to_module(spec_from_module(parse_module(text)))) == text


def test_an_unbatched_problem_takes_no_batched_full_input():
    text = (batched_with_full_input("!gemmc.tensor<L x M x N x f32, full>")
            .replace("L x M x K", "M x K").replace("L x N x K", "N x K").replace("L x M x N x bf16", "M x N x bf16"))
    with pytest.raises(VerifyException, match=r"full input r must have dims \('M', 'N'\), got \('L', 'M', 'N'\)"):
        parse_module(text)
