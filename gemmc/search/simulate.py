"""Replay recorded measurements through the Strategy API on the CPU.

A dataset is a list of records (shape, dtypes, layouts, schedule, time or error, cuBLAS time).
Each recorded problem becomes a `SearchProblem` whose feasible set is the recorded schedules that
pass the validity predicate; evaluating a schedule looks its record up. Results are fractions of
the exhaustive best (best_time / found_time) after each number of measurements.

A record may carry the schedule's ncu profile ("profile": L2Profile's fields), and `attach_profiles` adds
those a tuning DB holds (`tune --profile l2`, `gemmc profile --record`): a replay under `--reward time+l2`
lets the strategies see them (gemmc.search.reward), while the fractions stay those of the recorded times.
Where no profile is recorded, time+l2 scores the time, and the replay is the time reward's.
"""
from __future__ import annotations

import gzip
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..choose.measurement import L2Profile
from ..errors import GemmcError
from ..schedule import Schedule, is_valid
from ..spec import GemmSpec
from .registry import make_strategy
from .strategy import Measurement, SearchProblem, best_so_far, run_search


PROGRESS_EVERY_S = 10.0     # a run through many problems says how far it is at least this often
_now = time.monotonic

DATASET_HINT = ("--data takes the .jsonl.gz sweeps `gemmc bench` records (bench/data/), or a file "
                "`gemmc-search synth FILE` writes")


class DatasetFileError(GemmcError, ValueError):
    """A --data file is not a dataset of recorded measurements (the message says what it is instead)."""


class SimulationError(GemmcError, ValueError):
    """The recorded problems cannot support a strategy's replay (e.g. nothing for rl to train on)."""


@dataclass
class RecordedProblem:
    """One problem of a dataset: its spec and what every recorded schedule did."""
    key: tuple
    spec: GemmSpec
    arch: str
    results: dict = field(default_factory=dict)   # Schedule -> Measurement
    cublas_us: Optional[float] = None
    profiles: dict = field(default_factory=dict)  # Schedule -> L2Profile (ncu), where recorded

    @property
    def best_us(self) -> float:
        """The exhaustive best: the fastest success among the schedules a strategy may propose. A record the
        validity predicate now rejects (an older gemmc's space) is out of every strategy's reach."""
        ok = [r.time_us for s, r in self.results.items() if r.ok and s.arch == self.arch and is_valid(s, self.spec)]
        return min(ok) if ok else math.inf

    def problem(self) -> SearchProblem:
        return SearchProblem.of(self.spec, self.arch, candidates=self.results.keys())

    def evaluate(self, schedules: list[Schedule]) -> list[Measurement]:
        out = []
        for s in schedules:
            m = self.results.get(s, Measurement(s, None, "not in the dataset"))
            out.append(replace(m, profile=self.profiles[s]) if s in self.profiles else m)
        return out


def _field(r, name, default=None):
    return r.get(name, default) if isinstance(r, dict) else getattr(r, name, default)


def _read_jsonl(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    header, records = {}, []
    with opener(path, "rt") as f:
        for line in f:
            if not line.strip():
                continue
            obj = json.loads(line)
            if not isinstance(obj, dict):
                records.append(obj)     # not a record: _check_records says so
            elif not header and not records and ("format" in obj or "header" in obj):
                header = obj.get("header", obj)
            elif "footer" in obj:
                header["footer"] = obj["footer"]
            else:
                records.append(obj)
    return header, records


def _load_one(path: Path) -> tuple[dict, list]:
    try:
        from ..bench.dataset import load_dataset
    except ImportError:
        load_dataset = None
    try:
        if load_dataset is not None:
            return load_dataset(path)
    except Exception:       # not the bench's exact format: read it as plain JSON lines below
        pass
    try:
        return _read_jsonl(path)
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as e:
        raise DatasetFileError(f"{path} is not a dataset of JSON lines ({type(e).__name__}: {e}); "
                               f"{DATASET_HINT}") from None


def _check_records(path: Path, header: dict, records: list) -> None:
    """Raise DatasetFileError, saying what `path` is instead, unless it holds measurement records."""
    if header.get("format") == "gemmc-tuning":
        raise DatasetFileError(f"{path} is a tuning-DB export (`gemmc-search export`), not a bench dataset: merge "
                               f"it into a DB with `gemmc-search import {path}`; {DATASET_HINT}")
    for i, r in enumerate(records):
        if not isinstance(r, dict) or "schedule" not in r or not ("shape" in r or all(d in r for d in "mnk")):
            raise DatasetFileError(f"{path}: record {i + 1} is not a measurement (a measurement has m, n, k and a "
                                   f"schedule); {DATASET_HINT}")


def load_records(path) -> tuple[dict, list]:
    """(header, records) of a dataset file, or of every dataset file in a folder (records of all
    files together: `group_problems` merges a shape recorded in several files into one problem,
    e.g. the split-K 1 sweep and the split-K > 1 sweep of the same shapes). The header is the first
    file's, with "files" listing every file read. A missing path raises FileNotFoundError, a file of
    another kind DatasetFileError."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith((".jsonl.gz", ".jsonl")))
        if not files:
            raise FileNotFoundError(f"no dataset file in {path}; expected a .jsonl.gz written by the bench")
    elif not path.exists():
        raise FileNotFoundError(f"dataset {path} does not exist; record one with the bench or write a synthetic one "
                                "with `gemmc-search synth FILE`")
    else:
        files = [path]
    header, records = {}, []
    for f in files:
        h, recs = _load_one(f)
        _check_records(f, h, recs)
        header = header or dict(h)
        records.extend(recs)
    header["files"] = [str(f) for f in files]
    return header, records


def group_problems(records: Sequence, header: Optional[dict] = None) -> list[RecordedProblem]:
    """Records grouped by problem (shape, dtypes, layouts, arch), sorted by shape; a problem recorded
    in several files holds the union of their schedules (a schedule recorded twice keeps its faster
    time). Fields a record lacks (dtype, out_dtype, layouts) come from the dataset header, else
    bf16 / "mk" / "nk". Results are judged as fractions of the best time, so the per-file cuBLAS
    times never enter them."""
    hd = header or {}
    probs: dict[tuple, RecordedProblem] = {}
    for i, r in enumerate(records):
        try:
            _add_record(probs, r, hd)
        except (ValueError, TypeError, KeyError) as e:    # a field of the wrong kind: name the record
            why = " ".join(str(e).split())
            raise DatasetFileError(f"record {i + 1} does not read as a measurement: {why}; {DATASET_HINT}") from None
    return [p for _, p in sorted(probs.items()) if math.isfinite(p.best_us)]


def _add_record(probs: dict, r, hd: dict) -> None:
    """One record into its problem of `probs` (see `group_problems`)."""
    shape = _field(r, "shape")
    m, n, k = shape if shape is not None else (_field(r, "m"), _field(r, "n"), _field(r, "k"))
    dtype = str(_field(r, "dtype", None) or hd.get("dtype") or "bf16")
    out = str(_field(r, "out_dtype", None) or hd.get("out_dtype") or dtype)
    al = _field(r, "a_layout", None) or hd.get("a_layout") or "mk"
    bl = _field(r, "b_layout", None) or hd.get("b_layout") or "nk"
    sd = _field(r, "schedule")
    sched = sd if isinstance(sd, Schedule) else Schedule.from_dict(json.loads(sd) if isinstance(sd, str) else sd)
    key = (int(m), int(n), int(k), dtype, out, al, bl, sched.arch)
    p = probs.get(key)
    if p is None:
        spec = GemmSpec(int(m), int(n), int(k), dtype=dtype, out_dtype=out, a_layout=al, b_layout=bl)
        p = probs[key] = RecordedProblem(key, spec, sched.arch)
    # the short-pass time: every schedule has one; the bench re-measures only its top few per shape
    # (per file) by another method (about 3% faster in the median), which would skew the comparison
    t = _field(r, "time_us_short", None) or _field(r, "time_us")
    err, cub = _field(r, "error"), _field(r, "cublas_us")
    if cub is not None:   # files of one shape measure cuBLAS apart: keep one reference per problem
        p.cublas_us = float(cub) if p.cublas_us is None else min(p.cublas_us, float(cub))
    meas = Measurement(sched, float(t) if t is not None and not err else None, err or (None if t else "no time"),
                       cublas_us=p.cublas_us)
    old = p.results.get(sched)
    if old is None or (meas.ok and (not old.ok or meas.time_us < old.time_us)):
        p.results[sched] = meas
    prof = _field(r, "profile")
    if isinstance(prof, dict):
        p.profiles[sched] = L2Profile.from_dict(prof)


def attach_profiles(problems: Sequence[RecordedProblem], db, gpu_name: Optional[str] = None) -> int:
    """Add the profiles a tuning DB (a TuningDBReader) holds for the recorded problems' schedules (a record's own
    profile wins); returns how many schedules gained one."""
    from ..choose.tuning_db_schema import problem_key
    added = 0
    for p in problems:
        for s, prof in db.profiles(problem_key(p.spec, p.arch), gpu_name).items():
            if s is not None and s in p.results and s not in p.profiles:
                p.profiles[s] = prof
                added += 1
    return added


def profiled_share(problems: Sequence[RecordedProblem]) -> tuple[int, int]:
    """(recorded schedules with a profile, recorded schedules), over every problem."""
    return (sum(len(set(p.profiles) & set(p.results)) for p in problems),
            sum(len(p.results) for p in problems))


def fractions(best_us: float, results: Sequence[Measurement], budgets: Sequence[int]) -> dict[int, float]:
    run = best_so_far(results)
    out = {}
    for b in budgets:
        found = run[min(b, len(run)) - 1] if run else math.inf
        out[b] = best_us / found if math.isfinite(found) else 0.0
    return out


def split_folds(problems: Sequence[RecordedProblem], n_folds: int, seed: int = 0) -> list[list[int]]:
    """Problem indices in up to `n_folds` groups, shuffled by `seed`. Grouped by (n, k) when there
    are enough weight shapes, so a held-out fold holds weight shapes the policy never saw at any M;
    else by problem."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(problems):
        groups.setdefault((p.spec.n, p.spec.k), []).append(i)
    if len(groups) < max(2, n_folds):
        groups = {(i,): [i] for i in range(len(problems))}
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    n_folds = max(2, min(n_folds, len(keys)))
    folds: list[list[int]] = [[] for _ in range(n_folds)]
    for j, key in enumerate(keys):
        folds[j % n_folds].extend(groups[key])
    return [sorted(f) for f in folds if f]


def simulate(problems: Sequence[RecordedProblem], strategies: Sequence[str], budgets: Sequence[int], seeds: int,
             batch: int = 1, rl_folds: int = 4, rl_epochs: int = 60, split_seed: int = 0,
             progress: Optional[Callable[[str], None]] = None, heuristic: bool = True, reward=None) -> dict:
    """{strategy: {budget: {"median_fraction", "score_vs_random"}}}; budget 1 is the first proposal.

    Fraction per (problem, seed) = best feasible time (`RecordedProblem.best_us`) / best found within
    the budget; per problem the mean over seeds; reported: the median over problems. score_vs_random =
    (f - r) / (1 - r) of those medians, r being random's (run as the baseline even when not asked for,
    and then not reported); 0.0 where random already reaches the optimum. Deterministic strategies (exhaustive; bayes
    when the heuristic seeds it) run once. `rl` runs once per fold, on the problems of a fold it was
    not trained on, so every problem is evaluated zero-shot by a policy that never saw it.
    `heuristic=False` starts `bayes` from a random space-filling design instead of the heuristic's
    ranking (whose constants may have been fitted to the very data being replayed). `reward`
    (gemmc.search.reward.Reward; None: the time) is what the strategies observe. `progress(line)` hears
    when each strategy starts, each rl fold's training, each seed or fold done, and, within a run, how far
    it is at least every PROGRESS_EVERY_S seconds."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # tiny models: extra threads only contend (and CI has 2 cores)
    try:
        return _simulate(problems, strategies, budgets, seeds, batch, rl_folds, rl_epochs, split_seed, progress,
                         heuristic, reward)
    finally:
        torch.set_num_threads(threads)


def _simulate(problems, strategies, budgets, seeds, batch, rl_folds, rl_epochs, split_seed, progress,
              heuristic, reward) -> dict:
    budgets = sorted(set(int(b) for b in budgets) | {1})
    if budgets[0] < 1 or seeds < 1:
        raise SimulationError(f"simulate needs budgets and seeds of at least 1; got budgets {budgets}, seeds {seeds}")
    top = max(budgets)
    # once per problem: the feasible set (the predicate over every record) and the best within it
    searches = [p.problem() for p in problems]
    bests = [p.best_us for p in problems]
    for p, best in zip(problems, bests):
        if not math.isfinite(best):
            raise SimulationError(f"{p.spec.m}x{p.spec.n}x{p.spec.k}: no feasible schedule of this problem has a "
                                  f"successful measurement, so there is no best to compare with")
    per: dict[str, dict[int, dict[int, list[float]]]] = {}
    folds = split_folds(problems, rl_folds, split_seed) if "rl" in strategies else []
    if "rl" in strategies and len(folds) < 2:
        raise SimulationError("rl needs at least two recorded problems (it is trained on some, evaluated on others)")
    policies: dict[int, object] = {}
    kw = {"bayes": {} if heuristic else {"use_heuristic": False}}
    say = progress or (lambda msg: None)
    # random runs even when not asked for: it is every strategy's score_vs_random baseline
    for name in [*strategies, *(["random"] if "random" not in strategies else [])]:
        acc = per.setdefault(name, {b: {} for b in budgets})
        if name == "rl":
            runs = range(len(folds))          # deterministic given its policy: each fold once
            say(f"rl: {len(folds)} folds over {len(problems)} problems (trained on the others, scored on each)")
        else:
            deterministic = make_strategy(name, **kw.get(name, {})).deterministic
            runs = range(1) if deterministic else range(seeds)
            say(f"{name}: " + ("1 run (deterministic)" if deterministic else f"{seeds} seeds")
                + f" over {len(problems)} problems")
        for seed in runs:
            if name == "rl":
                fi = seed
                run_name = f"rl fold {fi + 1}/{len(folds)}"
                if fi not in policies:
                    from .rl import train_policy_on_problems
                    train = [problems[i] for i in range(len(problems)) if i not in set(folds[fi])]
                    say(f"{run_name}: training on {len(train)} problems ({rl_epochs} epochs)")
                    try:
                        policies[fi] = train_policy_on_problems(train, epochs=rl_epochs, seed=split_seed + fi)
                    except ValueError as e:   # e.g. every training problem recorded a single schedule
                        raise SimulationError(f"rl cannot train on the problems outside fold {fi + 1} of "
                                              f"{len(folds)}: {e}; record more schedules per problem, or leave rl "
                                              f"out (--strategy exhaustive,random,bayes)") from None
                strat = make_strategy("rl", seed=seed, policy=policies[fi])
                idxs = folds[fi]
            else:
                run_name = f"{name} seed {seed + 1}/{len(runs)}"
                strat = make_strategy(name, seed=seed, **kw.get(name, {}))
                idxs = range(len(problems))
            last = _now()
            for j, i in enumerate(idxs):
                res = run_search(strat, searches[i], problems[i].evaluate, budget=top, batch=batch, reward=reward)
                for b, f in fractions(bests[i], res, budgets).items():
                    acc[b].setdefault(i, []).append(f)
                if progress and j + 1 < len(idxs) and _now() - last >= PROGRESS_EVERY_S:
                    last = _now()
                    say(f"{run_name}: {j + 1}/{len(idxs)} problems")
            say(f"{run_name} done")
    medians: dict = {}
    for name, acc in per.items():
        medians[name] = {}
        for b in budgets:
            perprob = [statistics.fmean(v) for v in acc[b].values()]
            medians[name][b] = statistics.median(perprob) if perprob else 0.0
    out: dict = {}
    for name in strategies:
        out[name] = {}
        for b in budgets:
            f, r = medians[name][b], medians["random"][b]
            score = 0.0 if r >= 1.0 else (f - r) / (1.0 - r)
            out[name][str(b)] = {"median_fraction": f, "score_vs_random": score}
    return out
