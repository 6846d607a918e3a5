"""A real model end to end: transformers' LlamaForCausalLM with Llama-3-8B layer shapes (random weights, bf16),
torch's nn.Linear against the same model with every Linear on gemmc (gemmc.nn.swap_linears), timed in one
process, interleaved.

Phases (--phases, all by default):
  decode   a StaticCache holding a prompt, one token per sequence per step, each step ONE CUDA graph per model
           and batch (greedy: the graph feeds its argmax back); tokens/s = batch / step time. --compile adds
           the same with the model's forward under torch.compile(fullgraph=True), captured the same way.
  prefill  the prompt through the model (last position's logits, as generation computes), eager: no graph, so
           the host's time per call shows; --compile adds the compiled forward (no graph either).
  mlp      a training step of one Llama MLP block: forward + backward + AdamW.

Correctness first: logits (gemmc vs torch on the same step) and gradients (per parameter) are checked against
stated bf16 tolerances; a failed check, or a case that raised, ends the run with exit status 1 (after the report
is written). --tiny runs a tiny config on the CPU (no graphs, no timing claims) so CI can test the plumbing.

    python bench/llama.py --quick               # 2 layers, fewer repeats: a first smoke run
    python bench/llama.py [--compile] [--fuse-mlp] [--layers 8] [--out report.json]
    python bench/llama.py --tiny                # CPU plumbing
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import inspect
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gemmc.bench.report import collect_environment, default_output_path, unused_path, write_json
from gemmc.bench.stats import summarize
from gemmc.bench.timing import CudaClock, paired_ratio, spin_up
from gemmc.reference import rel_frobenius

FORMAT = "gemmc-llama-bench/1"
PHASES = ("decode", "prefill", "mlp")

# Llama-3-8B's layer shapes (its config.json); --layers picks how many decoder layers.
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                 max_position_embeddings=8192)
# --tiny: the same structure (GQA, gated MLP), every dim 16-byte aligned so gemmc's op path is the one taken.
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=256, rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=256)

# bf16 tolerances (relative Frobenius difference, fp32). Two correct bf16 computations differ by accumulation
# order and rounding, which the layers compound: torch's own cached and cache-less forwards of the same tokens
# differ by about 2e-2 at the logits of 8 random Llama-3-8B layers, so the bound is 5e-2; a wrong kernel (a
# dropped K tile, a swapped layer) reads 1e-1 and up.
LOGITS_TOL = 5e-2
GRAD_TOL = 1e-2


# ---- transformers across versions ------------------------------------------------------------------------

@dataclass(frozen=True)
class HFApi:
    """How this transformers version takes a KV cache: the forward's keyword for it (`cache` from 5.2x,
    `past_key_values` before) and whether the forward takes `cache_position` (4.x) or the cache counts the
    tokens it has seen itself (5.x's StaticLayer.cumulative_length)."""
    version: str
    cache_kw: str
    cache_position: bool
    keep_kw: Optional[str]      # the forward's "compute logits for the last n positions only" keyword, if any

    @classmethod
    def of(cls, model) -> "HFApi":
        import transformers
        params = inspect.signature(model.forward).parameters
        keep = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        return cls(transformers.__version__, "cache" if "cache" in params else "past_key_values",
                   "cache_position" in params, keep)


def static_cache(config, batch: int, max_len: int, device, dtype):
    """transformers.StaticCache for `batch` sequences of up to `max_len` tokens. Its constructor changed across
    versions (4.44: (config, max_batch_size, max_cache_len, device, dtype); 4.56+: (config, max_cache_len),
    allocated lazily on the first update): pass what this version's signature names."""
    from transformers import StaticCache
    params = inspect.signature(StaticCache.__init__).parameters
    kwargs = {"config": config, "max_cache_len": max_len}
    for name, value in (("max_batch_size", batch), ("batch_size", batch), ("device", device), ("dtype", dtype)):
        if name in params:
            kwargs[name] = value
    return StaticCache(**kwargs)


def rewind_cache(cache, position: int) -> None:
    """Make a StaticCache count `position` tokens seen (5.x keeps the count in each layer; 4.x takes the position
    from the caller's cache_position, which the caller rewinds)."""
    for layer in getattr(cache, "layers", ()):
        seen = getattr(layer, "cumulative_length", None)
        if isinstance(seen, torch.Tensor):
            seen.fill_(position)
        elif isinstance(seen, int):
            layer.cumulative_length = position


# ---- the models --------------------------------------------------------------------------------------------

def llama_config(layers: int, tiny: bool):
    from transformers import LlamaConfig
    return LlamaConfig(**(TINY if tiny else LLAMA3_8B), num_hidden_layers=layers, tie_word_embeddings=False,
                       attn_implementation="sdpa")


def build_model(config, device, dtype, seed: int):
    """LlamaForCausalLM with transformers' own random init (normal, std config.initializer_range), built
    directly on `device` in `dtype`; nothing is downloaded."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def gemmc_copy(model, fuse_mlp: bool, allow_cpu: bool):
    """A deep copy of `model` with its Linear layers on gemmc: (copy, SwapReport)."""
    import gemmc.nn
    twin = copy.deepcopy(model)
    return twin, gemmc.nn.swap_linears(twin, fuse_mlp=fuse_mlp, allow_cpu=allow_cpu)


class MLPBlock(torch.nn.Module):
    """One Llama MLP (gate_proj, up_proj, down_proj, SiLU gating) as a child module, where swap_linears can
    replace it (it replaces submodules, not the model it is given)."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP
        self.mlp = LlamaMLP(config)

    def forward(self, x):
        return self.mlp(x)


def grads_by_key(block) -> dict:
    """{state_dict key: grad}: a GatedMLP's fused [gate; up] gradient split back into gate_proj's and up_proj's."""
    out = {}
    for name, p in block.named_parameters():
        if ".gate_up_proj." in name:
            gate, up = p.grad.chunk(2, dim=0)
            out[name.replace(".gate_up_proj.", ".gate_proj.")] = gate
            out[name.replace(".gate_up_proj.", ".up_proj.")] = up
        else:
            out[name] = p.grad
    return out


# ---- measuring ---------------------------------------------------------------------------------------------

class WallClock:
    """time_ms of a unit on the CPU (the --tiny run: plumbing, no timing claims)."""

    def time_ms(self, unit) -> float:
        t0 = time.perf_counter()
        unit()
        return 1000 * (time.perf_counter() - t0)


@dataclass
class Side:
    """One side's timed unit: `calls` calls (graph replays or eager calls) per unit; `reset` runs untimed before
    each unit (it rewinds a decode cache)."""
    unit: Callable[[], object]
    calls: int
    reset: Optional[Callable[[], None]] = None


def time_sides(sides: dict, clock, repeats: int, warmup: int) -> dict:
    """ms per call of each side: `warmup` untimed units each, then `repeats` timed ones, the order reversed
    every repeat so neither side always runs first (clock boost, L2 and power state are shared)."""
    names = list(sides)

    def one(name):
        side = sides[name]
        if side.reset is not None:
            side.reset()
        return clock.time_ms(side.unit) / side.calls

    for _ in range(warmup):
        for name in names:
            one(name)
    samples = {name: [] for name in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            samples[name].append(one(name))
    return samples


def timing_fields(samples: dict) -> dict:
    """Each side's per-call summary (ms) and samples; ratio = torch's median / gemmc's (> 1: gemmc faster), the
    paired ratio (median over repeats of the two timed back to back) and the spread (each side's IQR / median)."""
    t, g = summarize(samples["torch"]), summarize(samples["gemmc"])
    return {"torch_ms": t.as_dict(), "gemmc_ms": g.as_dict(), "torch_samples_ms": samples["torch"],
            "gemmc_samples_ms": samples["gemmc"], "ratio": t.median / g.median,
            "paired_ratio": paired_ratio(samples["torch"], samples["gemmc"]),
            "spread": {"torch": t.rel_iqr, "gemmc": g.rel_iqr}}


def calls_for(call_ms: float, unit_ms: float, most: int = 64) -> int:
    """Calls per timed unit: enough for a unit of `unit_ms`, at least 1."""
    return max(1, min(most, math.ceil(unit_ms / max(call_ms, 1e-3))))


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def capture_graph(step: Callable[[], torch.Tensor], reset: Callable[[], None]):
    """(graph, its output) of ONE call of `step`, warmed first on a side stream (libraries allocate workspaces
    lazily, which capture forbids); `reset` runs before the warm-up and before the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        reset()
        step()
    torch.cuda.current_stream().wait_stream(side)
    reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


@dataclass
class Check:
    what: str
    value: float
    limit: float

    @property
    def ok(self) -> bool:
        return math.isfinite(self.value) and self.value <= self.limit

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def rel_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in fp32 (inf where `out` is non-finite and `ref` is not)."""
    return rel_frobenius(out.float(), ref.float())


# ---- compile ----------------------------------------------------------------------------------------------

def graph_breaks() -> int:
    from torch._dynamo.utils import counters
    return sum(counters["graph_break"].values())


def raise_recompile_limit() -> None:
    """Each (model, batch) is its own compile of one function: lift dynamo's per-function cache limit."""
    cfg = torch._dynamo.config
    for name, value in (("cache_size_limit", 64), ("recompile_limit", 64), ("accumulated_cache_size_limit", 512),
                        ("accumulated_recompile_limit", 512)):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), value))


def compiled(fn, args):
    return torch.compile(fn, fullgraph=True, dynamic=args.compile_dynamic, backend=args.compile_backend)


def first_compiled_call(name: str, call: Callable[[], object], device) -> dict:
    """Run the first call of a compiled function (it compiles) and say how it went: {compile_s, graph_breaks,
    fullgraph}. With fullgraph=True a graph break raises: re-raised naming the model."""
    before, t0 = graph_breaks(), time.perf_counter()
    try:
        call()
        sync(device)
    except Exception as e:
        raise RuntimeError(f"torch.compile(fullgraph=True) of the {name} model failed (a graph break, or an op "
                           f"that does not trace): {type(e).__name__}: {e}") from e
    return {"compile_s": time.perf_counter() - t0, "graph_breaks": graph_breaks() - before, "fullgraph": True}


# ---- decode ------------------------------------------------------------------------------------------------

class Decoder:
    """One model decoding a batch: a StaticCache prefilled with the prompt, static input buffers (token,
    position_ids, cache_position) and a step that runs the model on them, feeds its greedy token back and
    advances the position, so a graph of one step replays as consecutive decode steps; `rewind` goes back
    to the first step after the prompt."""

    def __init__(self, model, api: HFApi, prompt: torch.Tensor, cache_len: int):
        self.model, self.api = model, api
        batch, self.start = prompt.shape
        device = prompt.device
        self.cache = static_cache(model.config, batch, cache_len, device, model.dtype)
        self.first = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.ids = self.first.clone()
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.cache_pos = torch.zeros(1, dtype=torch.long, device=device)
        positions = torch.arange(self.start, device=device)
        keep = {api.keep_kw: 1} if api.keep_kw else {}
        # the last position's logits, copied: a view would keep all [batch, prompt, vocab] of them alive
        self.prompt_logits = self.forward(prompt, positions.expand(batch, -1), positions, **keep)[:, -1:].clone()
        self.forward_fn = self.forward

    def forward(self, ids, pos, cache_pos, **extra):
        kwargs = {self.api.cache_kw: self.cache, "use_cache": True, **extra}
        if self.api.cache_position:
            kwargs["cache_position"] = cache_pos
        return self.model(input_ids=ids, position_ids=pos, **kwargs).logits

    def rewind(self) -> None:
        self.ids.copy_(self.first)
        self.pos.fill_(self.start)
        self.cache_pos.fill_(self.start)
        rewind_cache(self.cache, self.start)

    def step(self) -> torch.Tensor:
        logits = self.forward_fn(self.ids, self.pos, self.cache_pos)
        self.ids.copy_(logits[:, -1].argmax(-1, keepdim=True))
        self.pos.add_(1)
        self.cache_pos.add_(1)
        return logits


def decode_case(models: dict, api: HFApi, batch: int, args, clock, compile_: bool, device) -> dict:
    """Check, then time, one decode batch for both models (one graph per step; eager on the CPU)."""
    variant = ("compiled+" if compile_ else "") + ("graph" if args.graphs else "eager")
    rec = {"phase": "decode", "variant": variant, "batch": batch,
           "prompt": args.prompt, "cache_len": args.cache_len, "steps_per_unit": args.decode_steps}
    gen = torch.Generator(device="cpu").manual_seed(args.seed + batch)
    prompt = torch.randint(models["torch"].config.vocab_size, (batch, args.prompt), generator=gen).to(device)
    decoders = {name: Decoder(m, api, prompt, args.cache_len) for name, m in models.items()}
    first = decoders["torch"].prompt_logits[:, -1].argmax(-1, keepdim=True)
    for d in decoders.values():
        d.first.copy_(first)
    eager_logits = {}
    for name, d in decoders.items():
        d.rewind()
        eager_logits[name] = d.step().clone()
    if compile_:
        rec["compile"] = {}
        for name, d in decoders.items():
            d.forward_fn = compiled(d.forward, args)
            d.rewind()
            rec["compile"][name] = first_compiled_call(name, d.step, device)
    graphs, logits = {}, {}
    for name, d in decoders.items():
        if args.graphs:
            graphs[name], out = capture_graph(d.step, d.rewind)
            d.rewind()
            out.fill_(float("nan"))        # the replay alone must write every logit
            graphs[name].replay()
            logits[name] = out.clone()
        else:
            d.rewind()
            logits[name] = d.step().clone()
    checks = [Check(f"decode b{batch} {variant}: gemmc logits vs torch", rel_diff(logits["gemmc"], logits["torch"]),
                    args.logits_tol)]
    for name in decoders:   # the captured (or compiled) step computes what the eager step computed
        checks.append(Check(f"decode b{batch} {variant}: {name} step vs its eager step",
                            rel_diff(logits[name], eager_logits[name]), args.logits_tol))
    if not compile_:    # the cache plumbing: the first step computes what a cache-less forward of prompt + token does
        full = prefill_forward(models["torch"])(torch.cat([prompt, first], dim=1))
        checks.append(Check(f"decode b{batch}: torch's eager step vs a cache-less forward of prompt + token",
                            rel_diff(eager_logits["torch"][:, -1:], full), args.logits_tol))
    rec["logits_rel_diff"] = checks[0].value
    rec["greedy_agree"] = (logits["gemmc"][:, -1].argmax(-1) == logits["torch"][:, -1].argmax(-1)).float().mean().item()
    rec["checks"] = [c.as_dict() for c in checks]
    if not all(c.ok for c in checks):
        return rec
    if compile_ and args.graphs:
        spin_up()       # the compiles left the GPU idle: bring its clocks back up

    def unit_of(name):
        if args.graphs:
            g = graphs[name]
            return lambda: [g.replay() for _ in range(args.decode_steps)]
        d = decoders[name]
        return lambda: [d.step() for _ in range(args.decode_steps)]

    sides = {name: Side(unit_of(name), args.decode_steps, decoders[name].rewind) for name in decoders}
    rec.update(timing_fields(time_sides(sides, clock, args.repeats, args.warmup)))
    for name in decoders:
        rec[f"{name}_tokens_per_s"] = batch / (rec[f"{name}_ms"]["median"] / 1000)
    return rec


# ---- prefill -----------------------------------------------------------------------------------------------

def prefill_forward(model):
    """The prompt through the model, logits at the last position only (what generation needs)."""
    def forward(ids):
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        return model.lm_head(hidden[:, -1:])
    return forward


def prefill_case(models: dict, batch: int, length: int, args, clock, compile_: bool, device) -> dict:
    rec = {"phase": "prefill", "variant": "compiled" if compile_ else "eager", "batch": batch, "length": length,
           "tokens": batch * length}
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 7 * length + batch)
    ids = torch.randint(models["torch"].config.vocab_size, (batch, length), generator=gen).to(device)
    fns = {name: prefill_forward(m) for name, m in models.items()}
    eager_logits = {name: fn(ids) for name, fn in fns.items()}
    if compile_:
        rec["compile"] = {}
        for name in fns:
            fns[name] = compiled(fns[name], args)
            rec["compile"][name] = first_compiled_call(name, lambda: fns[name](ids), device)
    logits, call_ms = {}, {}
    for name, fn in fns.items():
        sync(device)
        t0 = time.perf_counter()
        logits[name] = fn(ids)
        sync(device)
        call_ms[name] = 1000 * (time.perf_counter() - t0)
    checks = [Check(f"prefill {batch}x{length} {rec['variant']}: gemmc logits vs torch",
                    rel_diff(logits["gemmc"], logits["torch"]), args.logits_tol)]
    if compile_:
        checks += [Check(f"prefill {batch}x{length} compiled: {name} vs its eager forward",
                         rel_diff(logits[name], eager_logits[name]), args.logits_tol) for name in fns]
    rec["logits_rel_diff"] = checks[0].value
    rec["checks"] = [c.as_dict() for c in checks]
    if not all(c.ok for c in checks):
        return rec
    if compile_ and args.graphs:
        spin_up()
    calls = calls_for(call_ms["torch"], args.unit_ms)
    rec["calls_per_unit"] = calls
    sides = {name: Side((lambda fn=fn: [fn(ids) for _ in range(calls)]), calls) for name, fn in fns.items()}
    rec.update(timing_fields(time_sides(sides, clock, args.repeats, args.warmup)))
    return rec


# ---- MLP training step ---------------------------------------------------------------------------------------

def mlp_case(config, args, clock, device, dtype) -> dict:
    """fwd + bwd + AdamW of one Llama MLP block over `args.mlp_tokens` tokens: torch's nn.Linear against
    gemmc.nn (swap_linears on a copy; the optimizer built after the swap, as gemmc.nn asks)."""
    import gemmc.nn
    tokens = args.mlp_tokens
    rec = {"phase": "mlp", "variant": "train", "tokens": tokens, "fuse_mlp": args.fuse_mlp}
    torch.manual_seed(args.seed)
    with torch.device(device):
        torch_block = MLPBlock(config).to(dtype)
    for p in torch_block.parameters():      # transformers' init of a Linear: normal(0, initializer_range)
        torch.nn.init.normal_(p, std=config.initializer_range)
    gemmc_block = copy.deepcopy(torch_block)
    report = gemmc.nn.swap_linears(gemmc_block, fuse_mlp=args.fuse_mlp, allow_cpu=args.tiny)
    rec["swap"] = {"swapped": report.swapped, "kept": report.kept, "fused_mlps": report.fused_mlps}
    if not args.tiny:
        rec["prepare"] = str(gemmc.nn.prepare(gemmc_block, batch_sizes=[tokens], training=True))
    blocks = {"torch": torch_block, "gemmc": gemmc_block}
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    x = torch.randn(tokens, config.hidden_size, generator=gen).to(device, dtype).requires_grad_(True)
    dy = (torch.randn(tokens, config.hidden_size, generator=gen) / math.sqrt(tokens)).to(device, dtype)

    outs, grads = {}, {}
    for name, block in blocks.items():      # the check: one forward + backward from identical weights
        x.grad = None
        outs[name] = block(x)
        outs[name].backward(dy)
        grads[name] = {**grads_by_key(block), "input": x.grad.clone()}
        block.zero_grad(set_to_none=True)
    checks = [Check("mlp train: gemmc output vs torch", rel_diff(outs["gemmc"].detach(), outs["torch"].detach()),
                    args.grad_tol)]
    rec["grad_rel_diff"] = {}
    for key, ref in grads["torch"].items():
        got = grads["gemmc"].get(key)
        value = math.inf if got is None else rel_diff(got, ref)
        rec["grad_rel_diff"][key] = value
        checks.append(Check(f"mlp train: gemmc grad of {key} vs torch", value, args.grad_tol))
    rec["checks"] = [c.as_dict() for c in checks]
    if not all(c.ok for c in checks):
        return rec

    opts = {name: torch.optim.AdamW(block.parameters(), lr=1e-5) for name, block in blocks.items()}

    def train_step(name):
        block, opt = blocks[name], opts[name]
        opt.zero_grad(set_to_none=True)
        x.grad = None
        block(x).backward(dy)
        opt.step()

    sync(device)
    t0 = time.perf_counter()
    train_step("torch")
    sync(device)
    calls = calls_for(1000 * (time.perf_counter() - t0), args.unit_ms, most=16)
    rec["calls_per_unit"] = calls
    sides = {name: Side((lambda name=name: [train_step(name) for _ in range(calls)]), calls) for name in blocks}
    rec.update(timing_fields(time_sides(sides, clock, args.repeats, args.warmup)))
    return rec


# ---- the run -------------------------------------------------------------------------------------------------

def routes(swap, ms) -> dict:
    """What each shared forward kernel runs at each row count (a gemmc schedule, or torch.matmul where `auto`
    measured cuBLAS faster), from gemmc's per-M decisions."""
    out = {}
    for key in swap.kernels:
        try:
            kernel, runs = swap.kernel(key), {}
            for m in ms:
                _, chosen = kernel.for_m(m)
                runs[m] = "torch.matmul" if chosen is None else chosen.schedule.short()
            out[str(key)] = runs
        except Exception as e:      # diagnostics only: never stop the run
            out[str(key)] = f"{type(e).__name__}: {e}"
    return out


def row_counts(args) -> list:
    """Every M (tokens per call) the gemmc model sees: decode steps, the prompts' prefill into the caches, the
    prefill cases, and their lm_head at the last position."""
    ms = set()
    if "decode" in args.phases:
        ms |= set(args.batches) | {b * args.prompt for b in args.batches}
    if "prefill" in args.phases:
        ms |= {b * n for b in args.prefill_batches for n in args.prefill_lens} | set(args.prefill_batches)
    return sorted(ms)


class Progress:
    """Progress lines on stderr, each with the seconds since the start; phase times for the report."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.phases: dict = {}

    def __call__(self, msg: str) -> None:
        print(f"[llama {time.perf_counter() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def phase(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds
        self(f"{name}: {seconds:.1f} s")


def run_case(fn, log, records: list, errors: list, label: str) -> None:
    """Run one case; a case that raises is recorded (with where it raised) and the run goes on."""
    log(label)
    try:
        rec = fn()
    except Exception as e:
        tb = traceback.format_exc(limit=-6)
        log(f"{label}: FAILED {type(e).__name__}: {e}")
        errors.append({"case": label, "error": f"{type(e).__name__}: {e}", "traceback": tb})
        return
    records.append(rec)
    bad = [c for c in rec.get("checks", []) if not c["ok"]]
    if bad:
        log(f"{label}: CHECK FAILED: " + "; ".join(f"{c['what']} = {c['value']:.3g} > {c['limit']:g}" for c in bad))
    elif "ratio" in rec:
        log(f"{label}: torch {rec['torch_ms']['median']:.3f} ms, gemmc {rec['gemmc_ms']['median']:.3f} ms, "
            f"{rec['ratio']:.3f}x")


def method_text(args) -> str:
    timing = ("CPU plumbing run (--tiny): wall-clock, eager, no graphs; the times are not claims" if args.tiny else
              "CUDA events on the current stream")
    return (f"{timing}. torch's model and gemmc's (a deep copy, gemmc.nn.swap_linears(fuse_mlp={args.fuse_mlp}), "
            f"gemmc.nn.prepare at every row count before any capture) have identical weights (transformers' random "
            f"init, seed {args.seed}). Per case, one timed unit per side, {args.warmup} warm-up + {args.repeats} "
            "timed, alternating which side goes first; per-call median, IQR and min/max; ratio = torch median / "
            "gemmc median (> 1: gemmc faster) and the paired ratio (median of per-repeat torch/gemmc). Decode: a "
            f"StaticCache of {args.cache_len} slots prefilled eagerly with a {args.prompt}-token random prompt; the "
            "step (model forward on static token/position buffers, greedy argmax fed back, position advanced) "
            f"captured in ONE CUDA graph per model and batch; a unit is {args.decode_steps} replays (consecutive "
            "decode steps), the cache rewound to the prompt before each unit (untimed); tokens/s = batch / step "
            "time. Prefill: model.model(ids) and lm_head at the last position, eager (no graph), a unit of "
            f"enough calls for ~{args.unit_ms:g} ms. MLP: transformers' LlamaMLP, fwd + bwd (input grad too) + "
            "AdamW(lr=1e-5), eager. Compiled (--compile): torch.compile(forward, fullgraph=True, "
            f"dynamic={args.compile_dynamic}, backend={args.compile_backend!r}, mode='default'), one compile per "
            "model and shape; decode steps then captured manually in one CUDA graph as above (not mode="
            "'reduce-overhead': the same capture for both models, and the StaticCache's tensors stay where the "
            "graph reads them); fullgraph=True means a compile that succeeded had no graph break. Checks before "
            f"timing: logits of gemmc vs torch on the same step (rel. Frobenius, fp32) <= {args.logits_tol:g}, each "
            f"captured/compiled step vs its eager step <= {args.logits_tol:g}, torch's first decode step vs a "
            "cache-less forward of prompt + token (the cache plumbing), the graph's logits NaN-filled before its "
            f"checked replay; MLP output, and gradients per parameter and the input's <= {args.grad_tol:g}.")


def print_table(report: dict) -> None:
    env, cfg = report["environment"], report["config"]
    gpu = (env.get("gpu") or {}).get("name", "CPU")
    print(f"# llama bench: {cfg['layers']} layers of {'a tiny config' if cfg['tiny'] else 'Llama-3-8B shapes'}, "
          f"bf16, fuse_mlp={cfg['fuse_mlp']} | {gpu} | torch {env['versions'].get('torch')} | transformers "
          f"{report['transformers']} | {report['swap_summary']}")
    if cfg["tiny"]:
        print("# CPU plumbing run (--tiny): no graphs, times are not claims")
    if report["swap"]["kept"]:
        print(f"# FAIL: Linear layers kept on torch's path: {report['swap']['kept']}")
    rows = [("phase", "case", "torch", "gemmc", "ratio", "spread", "check")]
    for r in report["results"]:
        case = {"decode": lambda: f"batch {r['batch']} {r['variant']}",
                "prefill": lambda: f"{r['batch']}x{r['length']} {r['variant']}",
                "mlp": lambda: f"{r['tokens']} tokens fwd+bwd+AdamW"}[r["phase"]]()
        bad = [c for c in r["checks"] if not c["ok"]]
        worst = max(r["checks"], key=lambda c: (not c["ok"], c["value"] / c["limit"] if c["limit"] > 0 else 0.0))
        check = f"{'FAIL' if bad else 'ok'} (worst {worst['value']:.1e} / {worst['limit']:g})"
        if "ratio" not in r:
            rows.append((r["phase"], case, "-", "-", "-", "-", check))
            continue
        if r["phase"] == "decode":
            t, g = f"{r['torch_tokens_per_s']:.0f} tok/s", f"{r['gemmc_tokens_per_s']:.0f} tok/s"
        else:
            t, g = f"{r['torch_ms']['median']:.3f} ms", f"{r['gemmc_ms']['median']:.3f} ms"
        spread = max(r["spread"].values())
        rows.append((r["phase"], case, t, g, f"{r['ratio']:.3f}x", f"±{50 * spread:.1f}%", check))
    for e in report["errors"]:
        rows.append(("error", e["case"], "-", "-", "-", "-", e["error"][:60]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    checks = report["checks"] + [c for r in report["results"] for c in r["checks"]]
    n_bad, n_all = sum(not c["ok"] for c in checks), len(checks)
    phases = ", ".join(f"{k} {v:.0f} s" for k, v in report["phase_seconds"].items())
    print(f"# checks: {n_all - n_bad} passed, {n_bad} failed; {len(report['errors'])} errors; "
          f"elapsed {report['elapsed_s']:.0f} s ({phases}); ratio = torch time / gemmc time (> 1: gemmc faster); "
          f"report: {report['path']}")


def output_path(args, gpu_name: Optional[str]) -> Path:
    if args.out:
        return Path(args.out)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "llama.json"
    if args.tiny:
        return Path(tempfile.gettempdir()) / "gemmc-llama-tiny.json"
    return unused_path(default_output_path("llama", gpu_name))


def int_list(text: str) -> list:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated positive integers, e.g. 1,16,64")
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated positive integers, e.g. 1,16,64")
    return values


def phase_list(text: str) -> list:
    phases = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if not phases or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: phases are a comma-separated subset of {','.join(PHASES)}")
    return phases


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, help="decoder layers (default 8; --quick and --tiny: 2)")
    ap.add_argument("--batches", type=int_list, help="decode batch sizes (default 1,16,64)")
    ap.add_argument("--prompt", type=int, help="prompt tokens prefilled into each decode cache (default 128)")
    ap.add_argument("--cache-len", type=int, help="StaticCache slots per sequence (default 256)")
    ap.add_argument("--decode-steps", type=int, help="decode graph replays per timed unit (default 32)")
    ap.add_argument("--prefill-lens", type=int_list, help="prefill lengths (default 256,2048)")
    ap.add_argument("--prefill-batches", type=int_list, help="prefill batch sizes (default 1)")
    ap.add_argument("--mlp-tokens", type=int, help="tokens of the MLP training step (default 4096)")
    ap.add_argument("--phases", type=phase_list, default=list(PHASES), help="subset of decode,prefill,mlp")
    ap.add_argument("--fuse-mlp", action="store_true", help="swap_linears(fuse_mlp=True): gate+up as one GEMM")
    ap.add_argument("--compile", action="store_true", help="also time decode and prefill under torch.compile")
    ap.add_argument("--compile-dynamic", action="store_true", help="torch.compile(dynamic=True) (default False)")
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    ap.add_argument("--repeats", type=int, help="timed units per side and case (default 10; --quick 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed units per side before them (default 1)")
    ap.add_argument("--unit-ms", type=float, default=20.0, help="eager units run about this long (default 20)")
    ap.add_argument("--logits-tol", type=float, default=LOGITS_TOL, help=f"default {LOGITS_TOL:g}")
    ap.add_argument("--grad-tol", type=float, default=GRAD_TOL, help=f"default {GRAD_TOL:g}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 layers, 5 repeats, 16 decode steps")
    ap.add_argument("--tiny", action="store_true", help="a tiny config on the CPU: plumbing only, no timing claims")
    ap.add_argument("--out", help="report path (default $OUT/llama.json, else bench/results/<date>-<gpu>-llama.json)")
    args = ap.parse_args(argv)
    small = args.quick or args.tiny
    defaults = dict(layers=2 if small else 8, batches=[1, 3] if args.tiny else [1, 16, 64],
                    prompt=8 if args.tiny else 128, cache_len=32 if args.tiny else 256,
                    decode_steps=4 if args.tiny else 16 if args.quick else 32,
                    prefill_lens=[16, 32] if args.tiny else [256, 2048], prefill_batches=[1],
                    mlp_tokens=32 if args.tiny else 4096, repeats=2 if args.tiny else 5 if args.quick else 10)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("layers", "prompt", "cache_len", "decode_steps", "mlp_tokens", "repeats"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.warmup < 0 or args.unit_ms <= 0:
        ap.error("--warmup must be >= 0 and --unit-ms > 0")
    if args.prompt + args.decode_steps + 1 > args.cache_len:
        ap.error(f"--cache-len {args.cache_len} cannot hold the prompt ({args.prompt}) and a unit of "
                 f"{args.decode_steps} decode steps: use --cache-len >= {args.prompt + args.decode_steps + 1}")
    args.graphs = not args.tiny
    return args


@dataclass
class Models:
    """The two models of a run (identical weights), what the swap did and what prepare built."""
    config: object
    api: HFApi
    models: dict
    swap: object
    prepared: str = "skipped: --tiny runs on the CPU (no graphs to capture)"
    routes: dict = field(default_factory=dict)

    @property
    def swap_summary(self) -> str:
        s = self.swap
        return (f"{len(s.swapped)} Linear on gemmc ({len(s.kernels)} kernels), {len(s.kept)} kept torch's, "
                f"{len(s.fused_mlps)} MLPs fused")


def build_models(args, device, dtype, log) -> Models:
    import gemmc.nn
    t0 = time.perf_counter()
    config = llama_config(args.layers, args.tiny)
    with torch.no_grad():
        torch_model = build_model(config, device, dtype, args.seed)
        gemmc_model, swap = gemmc_copy(torch_model, args.fuse_mlp, allow_cpu=args.tiny)
    built = Models(config, HFApi.of(torch_model), {"torch": torch_model, "gemmc": gemmc_model}, swap)
    log.phase("build", time.perf_counter() - t0)
    log(built.swap_summary)
    ms = row_counts(args)
    if not args.tiny and ms:
        t0 = time.perf_counter()
        built.prepared = str(gemmc.nn.prepare(gemmc_model, batch_sizes=ms))
        log.phase("prepare", time.perf_counter() - t0)
        log(built.prepared.splitlines()[0])
        built.routes = routes(swap, ms)
    return built


def run_phases(built: Models, args, clock, device, dtype, log) -> tuple[list, list]:
    """(records, errors) of every case of the chosen phases."""
    records, errors = [], []
    models, api = built.models, built.api
    variants = [False, True] if args.compile else [False]
    with torch.no_grad():
        if "decode" in args.phases:
            t0 = time.perf_counter()
            for compile_ in variants:
                for b in args.batches:
                    run_case(lambda: decode_case(models, api, b, args, clock, compile_, device), log, records,
                             errors, f"decode batch {b}{' compiled' if compile_ else ''}")
                    if args.graphs:
                        torch.cuda.empty_cache()
            log.phase("decode", time.perf_counter() - t0)
        if "prefill" in args.phases:
            t0 = time.perf_counter()
            for compile_ in variants:
                for b in args.prefill_batches:
                    for n in args.prefill_lens:
                        run_case(lambda: prefill_case(models, b, n, args, clock, compile_, device), log, records,
                                 errors, f"prefill {b}x{n}{' compiled' if compile_ else ''}")
            log.phase("prefill", time.perf_counter() - t0)
    if "mlp" in args.phases:
        t0 = time.perf_counter()
        run_case(lambda: mlp_case(built.config, args, clock, device, dtype), log, records, errors,
                 f"mlp train {args.mlp_tokens} tokens")
        log.phase("mlp", time.perf_counter() - t0)
    return records, errors


def make_report(built: Models, args, environment: dict, records: list, errors: list, log, path: Path) -> dict:
    import transformers
    swap, config = built.swap, built.config
    all_swapped = Check("Linear layers of the model kept on torch's path", len(swap.kept), 0)
    report = {
        "format": FORMAT, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": (environment.get("gpu") or {}).get("name", "cpu"), "transformers": transformers.__version__,
        "torch": torch.__version__, "hf_api": asdict(built.api), "environment": environment,
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "model": {k: getattr(config, k, None) for k in (*LLAMA3_8B, "num_hidden_layers", "rope_parameters")},
        "method": method_text(args), "swap_summary": built.swap_summary,
        "swap": {"swapped": swap.swapped, "kept": swap.kept, "fused_mlps": swap.fused_mlps,
                 "kernels": {str(k): len(v) for k, v in swap.kernels.items()}},
        "prepare": built.prepared, "routes": built.routes, "checks": [all_swapped.as_dict()], "results": records,
        "errors": errors, "phase_seconds": log.phases, "elapsed_s": time.perf_counter() - log.t0, "path": str(path)}
    report["ok"] = all_swapped.ok and not errors and all(c["ok"] for r in records for c in r["checks"])
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("bench/llama.py needs transformers: pip install 'gemmc[hf]' (or transformers>=4.44)", file=sys.stderr)
        return 2
    if not args.tiny and not torch.cuda.is_available():
        print("bench/llama.py: no CUDA device here; run with --tiny for the CPU plumbing run", file=sys.stderr)
        return 2
    log = Progress()
    device, dtype = ("cpu" if args.tiny else "cuda"), torch.bfloat16
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, device "
        f"{torch.cuda.get_device_name() if args.graphs else 'cpu'}; {args.layers} layers, phases {args.phases}")
    environment = collect_environment()
    built = build_models(args, device, dtype, log)
    if args.compile:
        raise_recompile_limit()
    if args.graphs:
        spin_up()
    clock = CudaClock() if args.graphs else WallClock()
    records, errors = run_phases(built, args, clock, device, dtype, log)

    path = output_path(args, (environment.get("gpu") or {}).get("name"))
    report = make_report(built, args, environment, records, errors, log, path)
    try:
        write_json(report, path)
    except OSError as e:
        path = Path(tempfile.gettempdir()) / "gemmc-llama.json"
        log(f"could not write the report ({e}); writing {path} instead")
        report["path"] = str(path)
        write_json(report, path)
    print_table(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
