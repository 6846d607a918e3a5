"""The `gemmc` command: compile (IR after passes, schedules, errors) and opt (xdsl-opt over IR files)."""
import re
import subprocess
import sys

import pytest

from gemmc import GemmSpec, cli
from gemmc.passes import PIPELINE


def gemmc_cmd(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_compile_print_ir_after_all(capsys, shipped_only):
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
    kernel = ("--tile", "128x128x64", "--cluster", "1x1", "--mode", "cooperative", "--stages", "auto", "--raster", "m",
              "--swizzle", "1", "--no-swap-ab", "--split-k", "2")
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "64", "--n", "4096", "--k", "4096", *kernel, "--no-pdl")
    assert rc == 0
    assert out.startswith("// schedule: 128x128x64_c1x1_coop_sauto_rm_sw1_k2_nopdl (sm_90a)\n")
    assert ("kernel.tile_scheduler persistent true raster m swizzle 1 split_k 2 split_k_mode fixup "
            "max_active_clusters 132\n") in out
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "64", "--n", "4096", "--k", "4096", *kernel)
    assert rc == 0 and ("split_k_mode fixup pdl true pdl_early_ctas 82 pdl_full_ctas 118 pdl_prefetch_k_tiles 2 "
                        "max_active_clusters 132\n") in out


def test_compile_swap_ab_prints_the_swapped_schedule_and_ir(capsys, shipped_only):
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "16", "--n", "4096", "--k", "4096", "--tile", "64x16x128",
                           "--cluster", "1x1", "--mode", "pingpong", "--stages", "10", "--swap-ab")
    assert rc == 0
    assert out.startswith("// schedule: 64x16x128_c1x1_pp_s10_rm_sw1_k1_swap (sm_90a)\n")
    assert "swap_ab = true" in out and "st_global" in out
    # the kernel's A is the weights (b): both TMA loads may stream evict-first; the register store has no policy
    assert "kernel.copy b tma box 64x64 swizzle 128 l2 first_once\n" in out
    assert "kernel.copy a tma box 16x64 swizzle 128 l2 first_once\n" in out
    assert "kernel.copy out st_global box 1x1 swizzle 0 vector 2\n" in out
    rc, _, err = gemmc_cmd(capsys, "compile", "--m", "16", "--n", "4096", "--k", "4096", "--split-k", "8", "--swap-ab")
    assert rc != 0 and "swap_ab with split_k" in err and "at most 4" in err


# ---- schedule flags edit the --schedule pick ---------------------------------------------------

def test_schedule_flags_replace_fields_of_the_heuristic_pick(capsys):
    from gemmc.choose.heuristic import choose_schedule
    pick = choose_schedule(GemmSpec(m=16, n=4096, k=4096), "sm_90a")
    assert pick.short() == "64x8x128_c1x2_pp_s10_rm_sw1_k1_swap"     # README: the swapped decode pick at M = 16
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "16", "--n", "4096", "--k", "4096", "--schedule", "heuristic",
                           "--no-pdl")
    assert rc == 0
    assert out.splitlines()[:2] == ["// schedule: 64x8x128_c1x2_pp_s10_rm_sw1_k1_nopdl_swap (sm_90a)",
                                    f"// heuristic picked {pick.short()}; set by flags: pdl"]


def test_schedule_flags_replace_fields_of_the_auto_pick(capsys, shipped_only):
    from gemmc.choose.resolve import resolve_schedule
    spec = GemmSpec(m=16, n=4096, k=4096)
    pick, _ = resolve_schedule(spec, "auto", "sm_90a")
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "16", "--n", "4096", "--k", "4096", "--raster", "n")
    assert rc == 0 and pick.raster == "m"
    assert out.splitlines()[:2] == [f"// schedule: {pick.with_(raster='n').short()} (sm_90a)",
                                    f"// auto picked {pick.short()}; set by flags: raster"]
    # --swap-ab on a pick that is already swapped changes nothing; --no-swap-ab unswaps it
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "16", "--n", "4096", "--k", "4096", "--swap-ab")
    assert rc == 0 and out.startswith(f"// schedule: {pick.short()} (sm_90a)\n")
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "16", "--n", "4096", "--k", "4096", "--no-swap-ab",
                           "--tile", "64x64x128", "--stages", "auto")
    unswapped = pick.with_(swap_ab=False, tile=(64, 64, 128), stages="auto")
    assert "_swap" not in unswapped.short()
    assert rc == 0 and out.startswith(f"// schedule: {unswapped.short()} (sm_90a)\n")


def test_schedule_flags_with_a_symbolic_m_edit_the_heuristic_pick(capsys, shipped_only):
    from gemmc.choose.heuristic import choose_schedule
    pick = choose_schedule(GemmSpec(m="M", n=4096, k=4096), "sm_90a")
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "M", "--n", "4096", "--k", "4096", "--no-pdl")
    assert rc == 0
    assert out.splitlines()[:2] == [f"// schedule: {pick.with_(pdl=False).short()} (sm_90a)",
                                    f"// auto (the heuristic: M is symbolic) picked {pick.short()}; set by flags: pdl"]
    assert "per runtime M" not in out        # one explicit schedule: no per-M table


def test_a_field_the_flags_keep_can_break_the_edited_pick(capsys):
    # the heuristic's M = 16 pick rings 10 stages; a 128x128x64 tile takes 6 at most
    rc, out, err = gemmc_cmd(capsys, "compile", "--m", "16", "--n", "4096", "--k", "4096", "--schedule", "heuristic",
                             "--tile", "128x128x64", "--mode", "cooperative", "--no-swap-ab")
    assert rc == 1 and out == ""
    assert "shared memory: got 345088 B (10 stages x 32768 B + 16384 B epilogue)" in err and "stages<=6" in err
    assert ("(heuristic picked 64x8x128_c1x2_pp_s10_rm_sw1_k1_swap; set by flags: tile, mode, swap_ab; the other "
            "fields keep the pick's values: set them too)") in err


def test_compile_help_describes_the_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["compile", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "any of these gives an explicit schedule" not in text
    assert "target and schedule choice: --arch ARCH" in text
    assert ("schedule fields (each replaces that field of the --schedule pick; the others keep the pick's "
            "values)") in text
    assert "with a symbolic M, auto's pick is then the heuristic's for the symbolic shape" in text
    assert "every CTA takes an equal share" not in text
    assert ("whole waves of tiles run data-parallel, and the tiles of the last partial wave and one full wave are "
            "split into equal (tile, k-tile) shares per cluster") in text
    assert "--pdl, --no-pdl" in text and "--swap-ab, --no-swap-ab" in text


def test_unknown_dtype_lists_only_what_the_role_takes(capsys):
    rc, _, err = gemmc_cmd(capsys, "compile", "--m", "64", "--n", "64", "--k", "64", "--dtype", "i32")
    assert rc == 1 and err.strip() == "gemmc compile: error: unknown dtype 'i32'; use one of: bf16, f16, f8e4m3, f8e5m2"
    rc, _, err = gemmc_cmd(capsys, "compile", "--m", "64", "--n", "64", "--k", "64", "--out-dtype", "i32")
    assert rc == 1 and err.strip().endswith("use one of: bf16, f16, f32")


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
    rc, out, _ = gemmc_cmd(capsys, "compile", "--m", "512", "--n", "512", "--k", "512", "--tile", "128x128x64",
                           "--cluster", "1x2", "--mode", "cooperative", "--stages", "auto", "--print-ir-after", "input")
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


def test_opt_refuses_what_it_cannot_read_without_a_traceback(gemm_ir, tmp_path, capsys):
    rc, out, err = gemmc_cmd(capsys, "opt", str(tmp_path / "missing.mlir"), "-p", "verify-resources")
    assert rc == 1 and out == "" and "Traceback" not in err
    assert err.startswith(f"gemmc opt: error: cannot open {tmp_path / 'missing.mlir'}: No such file or directory")
    rc, _, err = gemmc_cmd(capsys, "opt", str(gemm_ir), "-p", "nosuch")
    assert rc == 1 and err.strip() == ("gemmc opt: error: Unrecognized passes: ['nosuch']; gemmc's passes are "
                                       f"{', '.join(PIPELINE)} (-p takes them comma-separated)")


def test_opt_refuses_hand_edited_ir(gemm_ir, tmp_path, capsys):
    mixed = tmp_path / "mixed.mlir"        # B edited to f16 while A stays bf16
    mixed.write_text(gemm_ir.read_text().replace("512 x 512 x bf16, nk", "512 x 512 x f16, nk"))
    rc, _, err = gemmc_cmd(capsys, "opt", str(mixed), "-p", ",".join(PIPELINE))
    assert rc == 1 and "gemm.matmul: A is bf16 but B is f16" in err and "Traceback" not in err
    rc, lowered, _ = gemmc_cmd(capsys, "opt", str(gemm_ir), "-p", ",".join(PIPELINE[:-1]))
    assert rc == 0 and "kernel.cluster 1x2\n" in lowered and "kernel.pipeline stages 6 " in lowered
    for old, new, want in (("kernel.cluster 1x2", "kernel.cluster 1x4", "cluster (kernel.cluster): got 1x4"),
                           ("kernel.pipeline stages 6 ", "kernel.pipeline stages 40 ",
                            "shared memory (kernel.pipeline stages): got 1328128 B (40 stages x 32768 B")):
        edited = tmp_path / "edited.mlir"
        edited.write_text(lowered.replace(old, new))
        rc, _, err = gemmc_cmd(capsys, "opt", str(edited), "-p", "verify-resources")
        assert rc == 1 and want in err, err


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
    assert rc == 0 and out.splitlines()[1] == (     # another class: no verdict, and the line says why
        "// auto: from heuristic (no tuning of this problem; the shipped table of the NVIDIA H200 holds plain bf16 "
        "A [M, K] @ B [N, K].T, unbatched, only)")


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
    from gemmc.choose.decision import Decision
    from gemmc.schedule import Schedule
    s = Schedule(tile=(64, 8, 128), mode="pingpong", stages=10, swap_ab=True)
    t = Schedule(tile=(128, 256, 64), cluster=(2, 1), mode="cooperative")
    table = [(2, Decision(s, "pretuned")), (4, Decision(s, "heuristic")), (8, Decision(s, "heuristic")),
             (16, Decision(t, "pretuned")), (32, Decision(t, "pretuned", use_cublas=True))]
    runs = [(r, d.source, d.use_cublas) for r, d in _bucket_runs(table)]
    assert runs == [("1..2", "pretuned", False), ("3..8", "heuristic", False), ("9..16", "pretuned", False),
                    ("17..", "pretuned", True)]
