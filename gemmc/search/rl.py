"""`rl`: a torch policy over the factored schedule choices, conditioned on the problem's shape.

The policy scores a (shape, schedule) pair from the shape features, the one-hot factored choices
(tile M/N/K, cluster, mode, raster, swizzle, split-K, swap_ab) and what they imply for the shape (waves,
padding, k-loop length). pi(schedule | shape) is the softmax of the scores over the feasible set
only, so infeasible choices have probability zero (the mask is the predicate's enumeration).

Training across shapes uses a listwise ranking objective: the cross-entropy between pi and the
softmax of reward / T, reward = log(cuBLAS time / kernel time); failed schedules get the shape's
worst reward minus a margin. On a new shape the first proposal is the policy's argmax (zero-shot);
after each observation a copy is fine-tuned on that shape's measurements (anchored to the trained
weights) and the best-scoring unmeasured schedules are proposed next.
The network and its stored form are `gemmc.choose.schedule_policy.SchedulePolicy` (`auto` loads it); this module
trains it and searches with it.

A policy trained from the tuning DB learns from one GPU's rows (`train_policy_from_db(gpu_name=...)`: the
GPU being tuned on, or the one `gemmc-search train-policy --gpu` names) and records it in `gpu_name`; the DB
keeps one policy per GPU (retraining for one GPU leaves the others' alone), and `TuningDB.policy_for` gives a
target GPU its own policy, else the one of unknown GPU, else none. `schedule="auto"` and the rl strategy
(`gemmc-search tune --strategy rl`, or `RLStrategy()` reading the default DB for the target GPU) start from it.
"""
from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..schedule import Schedule
from ..spec import GemmSpec
from ..choose.features import describes
from ..choose.schedule_policy import SchedulePolicy
from ..choose.tuning_db_schema import class_scaling
from .strategy import BaseStrategy, Measurement, SearchProblem


TEMPERATURE = 0.05      # reward scale of the ranking target: 5% slower = e^-1 the weight
ERROR_MARGIN = 0.5      # a failed schedule ranks this far below the shape's slowest


@dataclass
class ShapeExamples:
    """Training data of one problem: schedules and their rewards (measured on `gpu_name`, when known)."""
    spec: GemmSpec
    schedules: list[Schedule]
    rewards: list[float]
    gpu_name: Optional[str] = None


def rewards_from(measurements: Sequence[Measurement], cublas_us: Optional[float] = None) -> list[float]:
    """log(cuBLAS / time) per measurement (log(best / time) without a cuBLAS time); errors last."""
    ok = [m.time_us for m in measurements if m.ok]
    if not ok:
        return []
    ref = cublas_us or min(ok)
    r = [math.log(ref / m.time_us) if m.ok else None for m in measurements]
    worst = min(x for x in r if x is not None)
    return [x if x is not None else worst - ERROR_MARGIN for x in r]


def _listwise_loss(scores: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    target = torch.softmax(rewards / TEMPERATURE, 0)
    return -(target * torch.log_softmax(scores, 0)).sum()


def train_policy(examples: Sequence[ShapeExamples], epochs: int = 60, seed: int = 0, lr: float = 2e-3,
                 policy: Optional[SchedulePolicy] = None) -> SchedulePolicy:
    """Fit the policy across shapes (each step: one shape's listwise loss)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    pol = policy or SchedulePolicy()
    data = [(pol.encode(e.spec, e.schedules), torch.tensor(e.rewards, dtype=torch.float32))
            for e in examples if len(e.schedules) > 1]
    if not data:
        raise ValueError("no shape with at least two measured schedules to train the policy on")
    if policy is None:
        allx = torch.cat([x for x, _ in data])
        pol.mean.copy_(allx.mean(0))
        pol.std.copy_(allx.std(0).clamp_min(1e-3))
    opt = torch.optim.Adam(pol.parameters(), lr=lr, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * len(data))
    pol.train()
    for _ in range(epochs):
        order = list(range(len(data)))
        rng.shuffle(order)
        for i in order:
            x, r = data[i]
            loss = _listwise_loss(pol(x), r)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    pol.eval()
    pol.trained_shapes = len(data)
    return pol


def train_policy_on_problems(problems, epochs: int = 60, seed: int = 0) -> SchedulePolicy:
    """Train on `simulate.RecordedProblem`s (or anything with .spec, .results, .cublas_us). As in
    `examples_from_db`, schedules the features do not describe (stream-K, 192-row tiles) are left out: the
    policy would read them as their static twins."""
    ex = []
    for p in problems:
        ms = [m for m in p.results.values() if describes(m.schedule)]
        ex.append(ShapeExamples(p.spec, [m.schedule for m in ms], rewards_from(ms, p.cublas_us)))
    return train_policy(ex, epochs=epochs, seed=seed)


class RLStrategy(BaseStrategy):
    name = "rl"

    def __init__(self, seed: int = 0, policy: Optional[SchedulePolicy] = None, finetune_steps: int = 25,
                 finetune_lr: float = 1e-3, anchor: float = 1e-2):
        super().__init__(seed)
        gpu = None
        if policy is None:      # the default DB's policy for the target GPU (GEMMC_GPU, else the visible one)
            from ..choose.gpu import target_gpu
            from ..choose.tuning_db_schema import default_path
            from .db import TuningDB
            path, gpu = default_path(), target_gpu()
            if path.is_file():      # read-only: looking for a policy must not create a DB
                with TuningDB(path, create=False) as db:
                    policy = db.policy_for(gpu)
        if policy is None:
            of = f" for {gpu} (or of unknown GPU)" if gpu is not None else ""
            raise ValueError(f"the rl strategy needs a trained policy{of}: tune some shapes with another strategy, "
                             f"then `gemmc-search train-policy` (or pass policy=)")
        self.base = policy
        self.finetune_steps = finetune_steps
        self.finetune_lr = finetune_lr
        self.anchor = anchor

    def start(self, problem: SearchProblem) -> None:
        super().start(problem)
        self._x = self.base.encode(problem.spec, problem.candidates)
        self._index = {s: i for i, s in enumerate(problem.candidates)}
        self._scores = self.base.scores(problem.spec, problem.candidates)
        self._fitted_on = 0

    def _finetune(self) -> None:
        seen = [h for h in self.history if h.schedule in self._index]
        if len(seen) < 2 or not any(h.ok for h in seen) or len(seen) == self._fitted_on:
            return
        pol = copy.deepcopy(self.base)     # full-batch Adam from fixed weights: nothing random to seed
        ref = [p.detach().clone() for p in pol.parameters()]
        x = self._x[[self._index[h.schedule] for h in seen]]
        r = torch.tensor(rewards_from(seen), dtype=torch.float32)
        opt = torch.optim.Adam(pol.parameters(), lr=self.finetune_lr)
        for _ in range(self.finetune_steps):
            loss = _listwise_loss(pol(x), r)
            loss = loss + self.anchor * sum(((p - q) ** 2).sum() for p, q in zip(pol.parameters(), ref))
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            self._scores = pol(self._x)
        self._fitted_on = len(seen)

    def propose(self, n: int):
        if not self._count(n):
            return []
        self._finetune()
        rest = [i for i, s in enumerate(self.problem.candidates) if s not in self.proposed]
        if not rest:
            return []
        order = sorted(rest, key=lambda i: -float(self._scores[i]))
        return self._take([self.problem.candidates[i] for i in order[:n]])


def policy_spec(f: dict) -> Optional[GemmSpec]:
    """The problem of a tuning-DB key (its fields) as the policy's features describe it: its dims, dtypes and
    layouts, and an fp8 problem's scaling (named in its epilogue class, e.g. 'scaled_row_f8e5m2:...'); None for
    a grouped GEMM's key, whose dims are a bucket of rows per group, which the features do not describe."""
    cls = f["epilogue_class"]
    if cls.startswith("grouped_"):
        return None
    fp8 = {}
    scaling = class_scaling(cls)
    if scaling is not None:
        fp8 = {"scaling": scaling[0], "b_dtype": scaling[1] or f["dtype"]}
    return GemmSpec(f["m"], f["n"], f["k"], dtype=f["dtype"], out_dtype=f["out_dtype"], acc_dtype=f["acc_dtype"],
                    a_layout=f["a_layout"], b_layout=f["b_layout"], **fp8)


def examples_from_db(db, gpu_name: Optional[str] = None) -> list[ShapeExamples]:
    """Every stored problem (plain or not) as training data: with `gpu_name`, only the rows measured on that
    GPU; else every GPU's, each GPU's rows of a problem one example (a verdict holds on the GPU it was
    measured on). A schedule's reward is the log of its paired speedup (cuBLAS / gemmc, each row timed in one run: the
    geometric mean over its rows, or the median row from three on, as the DB's verdict), so a clock that drifted between schedules does not rank them; problems
    without cuBLAS times use log(best time / time). Schedules that only failed rank last. Schedules the
    features do not describe (features.describes: stream-K, 192-row tiles) are left out."""
    import json as _json

    from ..choose.tuning_db_verdict import rank_by_verdict, schedule_figures
    by_problem: dict[tuple, list[dict]] = {}
    for r in db.rows():
        if gpu_name is None or r["gpu_name"] == gpu_name:
            by_problem.setdefault((r["problem"], r["gpu_name"]), []).append(r)
    out = []
    for (key, gpu), rows in by_problem.items():
        spec = policy_spec(_json.loads(key))
        if spec is None:
            continue
        figs = [x for x in schedule_figures(rows) if describes(x.schedule)]
        ranked = rank_by_verdict(figs)       # the DB verdict's rule: paired schedules, else all by time
        if not ranked:
            continue
        best = min(x.time_us for x in ranked)
        schedules = [x.schedule for x in ranked]
        rw = [math.log(x.speedup) if x.speedup is not None else math.log(best / x.time_us) for x in ranked]
        failed = {s for s in (Schedule.from_dict(_json.loads(r["schedule"])) for r in rows)
                  if describes(s)} - {x.schedule for x in figs}
        worst = min(rw)
        schedules += sorted(failed, key=lambda s: s.short())
        rw += [worst - ERROR_MARGIN] * len(failed)
        if len(rw) > 1:
            out.append(ShapeExamples(spec, schedules, rw, gpu))
    return out


def trained_for(examples: Sequence[ShapeExamples], gpu_name: Optional[str] = None) -> Optional[str]:
    """The GPU a policy trained on `examples` is for: `gpu_name` when given (the examples are its rows),
    else the one GPU all the examples were measured on; None (unknown) for several or unknown GPUs."""
    if gpu_name is not None:
        return gpu_name
    gpus = {e.gpu_name for e in examples}
    return gpus.pop() if len(gpus) == 1 else None


def train_policy_from_db(db, epochs: int = 60, seed: int = 0, save: bool = True,
                         gpu_name: Optional[str] = None) -> SchedulePolicy:
    """Train on the DB's rows of `gpu_name` (None: every GPU's) and, with `save`, store the policy with the
    GPU it was trained for (`trained_for`), replacing that GPU's policy only (the DB keeps one per GPU).
    ValueError when no problem has two or more measured schedules."""
    examples = examples_from_db(db, gpu_name)
    pol = train_policy(examples, epochs=epochs, seed=seed)
    pol.gpu_name = trained_for(examples, gpu_name)
    if save:
        db.save_policy(pol)
    return pol
