"""The `gemmc` command: compile (IR after passes, schedules, errors) and opt (xdsl-opt over IR files)."""
import re
import subprocess
import sys

import pytest

from gemmc import cli
from gemmc.passes import PIPELINE


def gemmc_cmd(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_compile_print_ir_after_all(capsys):
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "4096", "--n", "4096", "--k", "4096", "--dtype", "bf16",
                           "--arch", "sm_90a", "--tile", "128x128x64", "--cluster", "2x1", "--mode", "pingpong",
                           "--print-ir-after-all")
    assert rc == 0
    assert out.startswith("// schedule: 128x128x64_c2x1_pp_sauto_rm_sw1_k1 (sm_90a)\n")
    banners = [line for line in out.splitlines() if line.startswith("// -----// IR")]
    assert banners == ["// -----// IR input (gemm level) //----- //"] + \
        [f"// -----// IR after {p} //----- //" for p in PIPELINE]
    assert "gemm.matmul @gemm(%a, %b) acc f32 -> !gemmc.tensor<4096 x 4096 x bf16, mn>" in out
    assert "kernel.mma wgmma inst 64x128x16 atoms 1x1x1" in out
    assert "kernel.copy b tma box 64x64 swizzle 128 multicast 2 along m" in out


def test_compile_print_ir_after_one_pass_symbolic_and_sm80(capsys):
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "M", "--n", "4096", "--k", "4096", "--arch", "sm_80",
                           "--tile", "128x128x32", "--print-ir-after", "tma-cluster-layout")
    assert rc == 0
    assert out.count("// -----// IR") == 1
    assert "!gemmc.tensor<M x 4096 x bf16, mk>" in out
    assert "kernel.copy a cp_async box 128x32 swizzle 64" in out
    assert "kernel.pipeline" not in out


def test_compile_heuristic_prints_the_final_ir(capsys):
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "8192", "--n", "8192", "--k", "8192", "--schedule", "heuristic",
                           "--a-layout", "km", "--b-layout", "kn", "--out-dtype", "f32")
    assert rc == 0
    assert "// -----// IR" not in out
    assert "kernel.tile_scheduler" in out and "!gemmc.tensor<8192 x 8192 x f32, mn>" in out


def test_compile_no_pdl_launches_plain(capsys):
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "64", "--n", "4096", "--k", "4096", "--split-k", "2", "--no-pdl")
    assert rc == 0
    assert out.startswith("// schedule: 128x128x64_c1x1_coop_sauto_rm_sw1_k2_nopdl (sm_90a)\n")
    assert "kernel.tile_scheduler persistent true raster m swizzle 1 split_k 2 split_k_mode fixup\n" in out
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "64", "--n", "4096", "--k", "4096", "--split-k", "2")
    assert rc == 0 and "split_k_mode fixup pdl true pdl_early_ctas 82 pdl_full_ctas 118 pdl_prefetch_k_tiles 2\n" in out


def test_compile_swap_ab_prints_the_swapped_schedule_and_ir(capsys):
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "16", "--n", "4096", "--k", "4096", "--tile", "64x16x128",
                           "--mode", "pingpong", "--stages", "10", "--swap-ab")
    assert rc == 0
    assert out.startswith("// schedule: 64x16x128_c1x1_pp_s10_rm_sw1_k1_swap (sm_90a)\n")
    assert "swap_ab = true" in out and "st_global" in out
    # the kernel's A is the weights (b): both TMA loads may stream evict-first; the register store has no policy
    assert "kernel.copy b tma box 64x64 swizzle 128 evict_first true\n" in out
    assert "kernel.copy a tma box 16x64 swizzle 128 evict_first true\n" in out
    assert "kernel.copy c st_global box 1x1 swizzle 0 vector 2\n" in out
    rc, _, err = gemmc_cmd(capsys, "compile", "--m", "16", "--n", "4096", "--k", "4096", "--split-k", "8", "--swap-ab")
    assert rc != 0 and "swap_ab with split_k" in err and "at most 4" in err


def test_compile_emit_source(capsys):
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "4096", "--n", "4096", "--k", "4096", "--emit", "source")
    assert rc == 0 and "import cutlass" in out


def test_compile_invalid_schedule_names_the_limit(capsys):
    rc, out, err = gemmc_cmd(capsys, "compile", "--m", "4096", "--n", "4096", "--k", "4096",
                             "--tile", "128x256x64", "--mode", "pingpong")
    assert rc == 1 and out == ""
    assert "gemmc compile: error: invalid schedule" in err and "registers" in err and "mode='cooperative'" in err


def test_compile_unknown_pass(capsys):
    rc, _, err = gemmc_cmd(capsys, "compile", "--print-ir-after", "fuse-everything")
    assert rc == 1 and "no such pass" in err


def test_compile_bad_tile_syntax(capsys):
    with pytest.raises(SystemExit):
        cli.main(["compile", "--tile", "128x128"])
    assert "expected 3 sizes" in capsys.readouterr().err


@pytest.fixture
def gemm_ir(tmp_path, capsys):
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "512", "--n", "512", "--k", "512", "--cluster", "1x2",
                           "--print-ir-after", "input")
    path = tmp_path / "gemm.mlir"
    path.write_text(out.split("//----- //\n", 1)[1])
    return path


def test_opt_runs_named_passes(gemm_ir, capsys):
    rc, out, _ = gemmc_cmd(capsys, "opt", str(gemm_ir), "-p", "assign-warpgroup-roles,tma-cluster-layout")
    assert rc == 0
    assert "kernel.copy a tma box 64x64 swizzle 128 multicast 2 along n" in out
    assert "kernel.pipeline" not in out
    rc, again, _ = gemmc_cmd(capsys, "opt", "-p", ",".join(PIPELINE), str(gemm_ir))   # flags first works too
    assert rc == 0 and "kernel.pipeline stages" in again


def test_opt_help_names_the_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["opt", "-h"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert out.startswith("usage: gemmc opt ") and "gemmc opt: run gemmc passes over IR" in out


def test_opt_reports_pass_errors(gemm_ir, tmp_path, capsys):
    rc, _, err = gemmc_cmd(capsys, "opt", str(gemm_ir), "-p", "pipeline-staging")
    assert rc == 1 and "run assign-warpgroup-roles first" in err
    bad = tmp_path / "bad.mlir"
    bad.write_text(gemm_ir.read_text().replace("cluster = 1x2", "cluster = 8x4"))
    rc, _, err = gemmc_cmd(capsys, "opt", str(bad), "-p", "verify-resources")
    assert rc == 1 and "cluster size: got 32; at most 16 CTAs per cluster" in err


def test_subcommand_registry(monkeypatch):
    import types
    fake = types.ModuleType("fake_sub")

    def register(sub):
        sub.add_parser("hello").set_defaults(func=lambda args: 7)
    fake.register = register
    monkeypatch.setitem(sys.modules, "fake_sub", fake)
    monkeypatch.setitem(cli.SUBCOMMANDS, "hello", "fake_sub")
    monkeypatch.setitem(cli.SUBCOMMANDS, "broken", "no.such.module")
    assert cli.main(["hello"]) == 7


def test_python_dash_m_gemmc():
    proc = subprocess.run([sys.executable, "-m", "gemmc", "compile", "--m", "256", "--n", "256", "--k", "256",
                           "--tile", "128x128x64"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "kernel.gemm @gemm" in proc.stdout


def test_compile_auto_says_which_step_chose_and_when_cublas_runs(capsys, shipped_only):
    lost = next(e for e in shipped_only.entries.values() if e.cublas_faster)
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", str(lost.m), "--n", str(lost.n), "--k", str(lost.k))
    assert rc == 0
    assert out.splitlines()[0] == f"// schedule: {lost.schedule.short()} (sm_90a)"
    assert out.splitlines()[1].startswith("// auto: from pretuned (")
    assert out.splitlines()[1].endswith("; calls run torch.matmul")
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "4096", "--n", "4096", "--k", "4104")    # not in the table
    assert rc == 0 and out.splitlines()[1] == ("// auto: from heuristic (cuBLAS won at one or more of the 5 nearest "
                                               "shapes measured on NVIDIA H200 (the heuristic's picks)); calls run "
                                               "torch.matmul")
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "4096", "--n", "4096", "--k", "4104", "--out-dtype", "f32")
    assert rc == 0 and out.splitlines()[1] == "// auto: from heuristic"          # another class: no verdict


def test_compile_auto_with_symbolic_m_prints_the_choice_per_m(capsys, shipped_only):
    from conftest import mixed_weights
    n, k, won_m, lost_m = mixed_weights(shipped_only)
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "M", "--n", str(n), "--k", str(k))
    assert rc == 0
    lines = [ln for ln in out.splitlines() if ln.startswith("//   M ")]
    assert lines[0].startswith("//   M 1..") and lines[-1].endswith("[heuristic]") and re.match(r"//   M \d+\.\.: ", lines[-1])
    ranges = {}
    for ln in lines[:-1]:                     # "//   M lo..hi: choice [source]", consecutive buckets merged
        lo, hi, choice = re.match(r"//   M (\d+)\.\.(\d+): (.*)$", ln).groups()
        ranges[(int(lo), int(hi))] = choice
    at = lambda m: next(c for (lo, hi), c in ranges.items() if lo <= m <= hi)    # noqa: E731
    # the measured winner at the small M, a gemmc kernel; at the larger M, cuBLAS won
    assert at(won_m) == shipped_only.entries[(won_m, n, k)].schedule.short() + " [pretuned]"
    assert at(lost_m) == "torch.matmul [pretuned]"
    assert sorted(ranges)[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(sorted(ranges), sorted(ranges)[1:]))


def test_per_m_runs_merge_only_buckets_with_the_same_choice_and_source():
    from gemmc.cli import _bucket_runs
    from gemmc.dispatch import Decision
    from gemmc.schedule import Schedule
    s = Schedule(tile=(64, 8, 128), mode="pingpong", stages=10, swap_ab=True)
    t = Schedule(tile=(128, 256, 64), cluster=(2, 1), mode="cooperative")
    table = [(2, Decision(s, "pretuned")), (4, Decision(s, "heuristic")), (8, Decision(s, "heuristic")),
             (16, Decision(t, "pretuned")), (32, Decision(t, "pretuned", use_cublas=True))]
    runs = [(r, d.source, d.use_cublas) for r, d in _bucket_runs(table)]
    assert runs == [("1..2", "pretuned", False), ("3..8", "heuristic", False), ("9..16", "pretuned", False),
                    ("17..", "pretuned", True)]
