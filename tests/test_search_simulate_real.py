"""`gemmc-search simulate` on the recorded H200 sweeps under bench/data/ (CPU only).

The small CI version of issue 6's simulation: a few shapes, few seeds, real measurements."""
from pathlib import Path

import pytest
import torch

import gemmc
from gemmc.bench.dataset import write_dataset
from gemmc.search.simulate import group_problems, load_records, simulate
from gemmc.search.strategy import SearchProblem

DATA = Path(__file__).resolve().parents[1] / "bench" / "data"
torch.set_num_threads(1)


def test_folder_merges_files_of_one_shape(tmp_path):
    """A shape recorded in two files (split-K 1 and split-K > 1 sweeps) is one problem with the union
    of the schedules; the cuBLAS times differ per file and do not matter; short-pass times are used."""
    spec = gemmc.GemmSpec(64, 4096, 4096)
    cands = SearchProblem.of(spec).candidates
    one = [s for s in cands if s.split_k == 1][:3]
    many = [s for s in cands if s.split_k > 1][:3]
    rec = lambda s, t, cub, **kw: {"m": 64, "n": 4096, "k": 4096, "schedule": s.to_dict(), "time_us": t,
                                   "error": None, "cublas_us": cub, **kw}
    write_dataset(tmp_path / "a-sweep.jsonl.gz", {"dtype": "bf16"},
                  [rec(one[0], 12.0, 10.0, refined=True, time_us_short=9.0), rec(one[1], 10.0, 10.0),
                   rec(one[2], 11.0, 10.0), {**rec(one[0], 99.0, 10.0), "m": 128}])
    write_dataset(tmp_path / "b-sweep-splitk.jsonl.gz", {"dtype": "bf16"},
                  [rec(s, 20.0 + i, 10.4) for i, s in enumerate(many)])
    (tmp_path / "notes.txt").write_text("not a dataset")
    header, records = load_records(tmp_path)
    assert len(header["files"]) == 2 and len(records) == 7
    probs = group_problems(records, header)
    assert [p.spec.m for p in probs] == [64, 128]
    p = probs[0]
    assert set(p.results) == set(one) | set(many)
    assert p.problem().candidates and set(p.problem().candidates) == set(one) | set(many)
    assert p.best_us == 9.0                       # the refined record's short time, not its 12.0
    assert p.cublas_us == 10.0


@pytest.fixture(scope="module")
def real():
    header, records = load_records(DATA)
    return group_problems(records, header)


def test_real_data_loads_as_the_full_space(real):
    assert len(real) == 100
    sizes = sorted(len(p.results) for p in real)
    assert sizes.count(144) == 52                 # M > 256: split-K 1 only
    assert sizes[-1] == 864                       # 144 split-K 1 + 720 split-K 2..8 (session-3 re-recording)
    small = [p for p in real if p.spec.m <= 256]
    assert len(small) == 48 and all(len({s.split_k for s in p.results}) > 1 for p in small)


def test_small_real_simulation(real):
    """bayes and rl beat random at budgets 8 and 16 on real H200 measurements; rl is zero-shot on
    weight shapes it was not trained on. Sized for CI (< 60 s on 2 cores)."""
    # a mix of decode (split-K space) and large shapes, several weight shapes for rl's folds
    pick = {(16, 4096, 14336), (64, 28672, 4096), (128, 8192, 8192), (256, 4096, 2048), (1, 57344, 8192),
            (1024, 6144, 4096), (4096, 4096, 14336), (16384, 128, 512), (8192, 8192, 4096),
            (2048, 16384, 8192), (512, 4096, 4096), (12288, 1024, 16384)}
    probs = [p for p in real if (p.spec.m, p.spec.n, p.spec.k) in pick]
    assert len(probs) == len(pick)
    res = simulate(probs, ["random", "bayes", "rl"], [8, 16], seeds=2, rl_folds=3, rl_epochs=30)
    print(res)
    frac = lambda s, b: res[s][str(b)]["median_fraction"]
    for name in ("bayes", "rl"):
        for b in (8, 16):
            assert frac(name, b) > frac("random", b) + 0.03, (name, b)
            assert res[name][str(b)]["score_vs_random"] > 0.5, (name, b)
    assert frac("bayes", 16) >= 0.97
    assert frac("rl", 1) >= 0.90                    # zero-shot: the first proposal of a policy not trained on it
    assert frac("rl", 8) >= 0.97
    assert res["random"]["8"]["score_vs_random"] == 0.0


def test_cli_reads_the_data_folder(capsys):
    import json

    from gemmc.search.cli import main
    assert main(["simulate", "--data", str(DATA), "--strategy", "random,exhaustive,bayes", "--budget", "4",
                 "--seeds", "1", "--max-shapes", "2", "--no-heuristic", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res) == {"random", "exhaustive", "bayes"} and set(res["bayes"]) == {"1", "4"}
    assert all(0.0 < c["median_fraction"] <= 1.0 for row in res.values() for c in row.values())
