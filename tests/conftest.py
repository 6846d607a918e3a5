import os
import re

import pytest
from hypothesis import settings

# CI has two cores and no GPU: keep hypothesis quick and deterministic there.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("quick", max_examples=10, deadline=None, derandomize=True)     # -m quick (below)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("GEMMC_HYPOTHESIS", "dev"))


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


HAS_GPU = _has_gpu()


# The quick subset, `scripts/dev test -m quick` (under 2 minutes on 2 cores; `scripts/dev test` runs all): every
# test is quick except those marked `slow` or `gpu`, those of the modules below, and the tests named below.
# A new module is quick by default: list it here when its tests build kernels, run scripts or examples, or
# replay real data (over a few seconds in all); one heavy test of a quick module goes in SLOW_TESTS.
SLOW_MODULES = frozenset({
    "test_bench.py", "test_build.py", "test_build_audit.py", "test_cache_robustness.py", "test_cache_dir.py",
    "test_call_path.py", "test_cta_trace_script.py", "test_docs.py", "test_docs_pytorch.py", "test_examples.py",
    "test_fp8_gpu_script.py", "test_fp8_kernel.py", "test_gpu_floor_script.py", "test_gpu_grouped_script.py",
    "test_grouped_fp8_kernel.py", "test_grouped_fp8_torch_op.py", "test_grouped_torch_op.py", "test_l2_scripts.py", "test_l2_search.py", "test_llama_bench.py",
    "test_nn_swap_hf.py", "test_power_clock_script.py",
    "test_pretuned.py", "test_search_builder.py", "test_search_cli.py", "test_search_cli_errors.py",
    "test_search_gpu_policy.py", "test_search_robustness.py", "test_search_simulate_real.py",
    "test_search_strategies.py", "test_search_strategies_protocol.py", "test_torch_ops.py",
    "test_torch_ops_autograd.py", "test_wave_footprint_script.py",
})
SLOW_TESTS = frozenset({     # "module::test" (every parametrization of it)
    "test_auto_unaligned.py::test_a_call_no_kernel_takes_runs_torch_matmul_under_auto",
    "test_auto_unaligned.py::test_explicit_schedules_and_epilogues_keep_the_kernels_refusal",
    "test_cli.py::test_compile_unknown_pass",
    "test_cli.py::test_python_dash_m_gemmc",
    "test_compiler.py::test_compile_is_deterministic_and_fast_for_random_problems",
    "test_grouped_kernel.py::test_ptx_walks_the_groups_on_the_device_and_stores_from_registers",
    "test_fp8_reference.py::test_the_bound_leaves_room_over_a_simulated_kernel",
    "test_fp8_reference.py::test_the_bound_passes_a_simulated_fp8_kernel_and_fails_a_wrong_one",
    "test_heuristic.py::test_decode_fills_the_machine",
    "test_heuristic.py::test_decode_takes_the_measured_swap_rule",
    "test_heuristic.py::test_heuristic_pick_is_valid_for_any_shape",
    "test_heuristic.py::test_picks_reach_the_measured_best_on_the_h200_sweeps",
    "test_heuristic.py::test_the_batch_rule_stays_out_of_its_range",
    "test_heuristic.py::test_wave_balancing_n_tiles_are_picked_only_up_to_m_256",
    "test_ir.py::test_every_enumerated_schedule_lowers_and_round_trips",
    "test_m_buckets.py::test_an_empty_a_takes_the_default_path",
    "test_m_buckets.py::test_an_ir_only_compile_refuses_calls_even_where_auto_would_run_cublas",
    "test_m_buckets.py::test_any_m_routes_to_its_bucket_decision",
    "test_m_buckets.py::test_calls_route_by_m",
    "test_m_buckets.py::test_calls_with_named_operands_route_by_m",
    "test_nn.py::test_torch_compile_fullgraph_dynamic_traces_the_layer",
    "test_passes_edited_ir.py::test_editing_the_schedule_and_rerunning_is_lowering_the_new_schedule",
    "test_runtime.py::test_runtime_modules_do_not_import_cutlass",
    "test_runtime.py::test_unloadable_so_goes_to_the_load_error_hook",
    "test_schedule.py::test_every_enumerated_schedule_is_valid_and_fits",
    "test_search_db.py::test_export_import_round_trip_with_policy",
    "test_search_dispatch.py::test_an_unreadable_db_is_skipped_with_one_warning_naming_it",
    "test_search_dispatch.py::test_decisions_are_always_valid_and_fallback_only_on_exact_plain",
    # PTX builds: one kernel per arch stays quick (sm80's test_ptx_tn_bf16_sm80, sm90's NaN-propagation check)
    "test_sm80_emit.py::test_epilogue_input_named_like_an_emitted_local_is_not_shadowed",
    "test_sm80_emit.py::test_ptx_nn_f16_batched_epilogue_splitk_for_hopper",
    "test_sm80_emit.py::test_scale_named_s_reaches_the_compiled_kernel",
    "test_sm90_emit.py::test_inputs_named_like_kernel_locals_compile",
    "test_sm90_emit.py::test_ptx_has_the_hopper_instructions_the_plan_asks_for",
    "test_sm90_emit.py::test_sm90_kernels_compile_without_deprecated_cutlass_apis",
    "test_swap_ab.py::test_ptx_loads_with_tma_and_stores_from_registers",
})


def _is_quick(item) -> bool:
    module, _, name = item.nodeid.partition("::")
    module = module.rsplit("/", 1)[-1]
    return not (item.get_closest_marker("slow") or item.get_closest_marker("gpu") or module in SLOW_MODULES
                or f"{module}::{name.split('[', 1)[0]}" in SLOW_TESTS)


def _quick_run(config) -> bool:
    """-m quick (or "quick and ..."): only quick tests can be selected."""
    return re.fullmatch(r"\s*quick(\s+and\s.*)?", config.getoption("markexpr", "") or "") is not None


def pytest_configure(config):
    # the quick subset also tries fewer hypothesis examples where a test does not set its own count
    if _quick_run(config):
        settings.load_profile("quick")


def pytest_ignore_collect(collection_path, config):
    # under -m quick the slow modules are not even imported (their imports alone take seconds)
    if _quick_run(config) and collection_path.name in SLOW_MODULES:
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_quick(item):
            item.add_marker(pytest.mark.quick)
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run with -m gpu on a GPU host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Tests never touch the user's ~/.cache/gemmc: each session gets its own cache dir."""
    if "GEMMC_TEST_CACHE_DIR" not in os.environ:
        os.environ["GEMMC_TEST_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "gemmc-cache")
    monkeypatch.setenv("GEMMC_CACHE_DIR", os.environ["GEMMC_TEST_CACHE_DIR"])


@pytest.fixture
def shipped_only(monkeypatch, tmp_path):
    """No tuning DB, no GPU visible (an ahead-of-time build): `auto` reads the shipped sm_90a table,
    then the heuristic. Returns that table."""
    from gemmc.choose.pretuned import table_for
    monkeypatch.setenv("GEMMC_TUNING_DB", str(tmp_path / "none.sqlite"))
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    return table_for("sm_90a")


def mixed_weights(table):
    """(n, k, won_m, lost_m) of the first (N, K) in `table` whose M = 16 or 64 entry runs a gemmc kernel and
    whose M = 128 or 256 entry runs torch.matmul (cuBLAS measured faster): the tests of per-M routing
    use it, and a re-tuned table moves which shape that is."""
    for n, k in sorted({(n, k) for _, n, k in table.entries}):
        won = [m for m in (64, 16) if (m, n, k) in table.entries and not table.entries[(m, n, k)].cublas_faster]
        lost = [m for m in (256, 128) if (m, n, k) in table.entries and table.entries[(m, n, k)].cublas_faster]
        if won and lost:
            return n, k, won[0], lost[0]
    raise AssertionError("the shipped table has no (N, K) with a kernel at small M and cuBLAS at M 128-256")


def as_gemmc_version(monkeypatch, version: str) -> None:
    """Run the tuning DB as gemmc `version` would: its writer stamps rows with it (gemmc.search.db) and its
    verdict judges staleness against it (gemmc.choose.tuning_db_verdict), as after an upgrade to it."""
    for module in ("gemmc.search.db", "gemmc.choose.tuning_db_verdict"):
        monkeypatch.setattr(f"{module}.__version__", version)


def not_a_tuning_db(tmp_path):
    """{kind: path} of files a tuning-DB path could point at by mistake: unreadable bytes, an empty file, a
    foreign sqlite DB (with tables of gemmc's names but not its columns) and a folder."""
    import sqlite3
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_text("not a database\n" * 100)
    zero = tmp_path / "zero.sqlite"
    zero.write_bytes(b"")
    foreign = tmp_path / "foreign.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE measurements (x INTEGER)")
    conn.execute("CREATE TABLE policies (y INTEGER)")
    conn.commit()
    conn.close()
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"corrupt": corrupt, "zero": zero, "foreign": foreign, "folder": folder}


@pytest.fixture
def fp32_precision_tf32():
    """torch's newer precision API set to TF32 for the test (skipped where torch has no such API), restored
    after. Returns torch.backends.cuda.matmul."""
    import torch
    cuda = torch.backends.cuda.matmul
    if not hasattr(cuda, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision API")
    before = cuda.fp32_precision
    cuda.fp32_precision = "tf32"
    yield cuda
    cuda.fp32_precision = before


@pytest.fixture
def count_compiles(monkeypatch):
    """The entries compiled during the test (gemmc.build.compile_with_ptx calls)."""
    import gemmc.build as gb
    calls = []
    real = gb.compile_with_ptx

    def counting(emitted, *args, **kwargs):
        calls.append(emitted.entry)
        return real(emitted, *args, **kwargs)

    monkeypatch.setattr(gb, "compile_with_ptx", counting)
    return calls
