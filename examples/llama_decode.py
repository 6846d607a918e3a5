"""Llama decoding on gemmc: every nn.Linear of a transformers LlamaForCausalLM swapped for gemmc.nn, the kernels
built before capture, each decode step ONE CUDA graph, greedy tokens compared with torch's.

    python examples/llama_decode.py                  # Llama-3-8B layer shapes, 2 layers, random weights
    python examples/llama_decode.py --model NAME     # a model already on this disk (nothing is downloaded)

Without a GPU it runs a tiny config on the CPU, eagerly (gemmc's op runs its torch reference there).
"""
import argparse
import copy
import inspect
import time

import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, StaticCache

import gemmc.nn

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, vocab_size=128256, rope_theta=500000.0)
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=256, rope_theta=500000.0)


def load_model(name, layers, cuda):
    """The user's model from the local cache, else a random Llama (seeded), bf16, on the device."""
    device, shapes = ("cuda", LLAMA3_8B) if cuda else ("cpu", TINY)
    if name:
        dtype_kw = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
        try:
            model = AutoModelForCausalLM.from_pretrained(name, local_files_only=True, **{dtype_kw: torch.bfloat16})
            return model.to(device).eval()
        except OSError as e:
            print(f"# {name} is not on this disk ({e.__class__.__name__}): using random weights instead")
    config = LlamaConfig(**shapes, num_hidden_layers=layers, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    return model.eval()


class Decoder:
    """Greedy decoding on static buffers with a StaticCache: step() feeds the last token back, advances the
    position and returns the logits, so a CUDA graph of one step replays as the next one."""

    def __init__(self, model, prompt, max_len):
        self.model, (batch, n) = model, prompt.shape
        params = inspect.signature(StaticCache.__init__).parameters    # its arguments changed across versions
        extra = {"max_batch_size": batch, "device": prompt.device, "dtype": model.dtype}
        self.cache = StaticCache(config=model.config, max_cache_len=max_len,
                                 **{k: v for k, v in extra.items() if k in params})
        forward = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in forward else "past_key_values"
        self.takes_cache_position = "cache_position" in forward         # transformers 4.x
        self.pos = torch.arange(n, device=prompt.device)
        logits = self.forward(prompt, self.pos.expand(batch, -1), self.pos)     # the prompt: prefill
        self.prompt_logits, self.token = logits[:, -1].float(), logits[:, -1:].argmax(-1)
        self.pos = torch.full((batch, 1), n, device=prompt.device)
        self.cache_pos = torch.tensor([n], device=prompt.device)

    def forward(self, ids, pos, cache_pos):
        kwargs = {self.cache_kw: self.cache, "use_cache": True}
        if self.takes_cache_position:
            kwargs["cache_position"] = cache_pos
        return self.model(input_ids=ids, position_ids=pos, **kwargs).logits

    def step(self):
        logits = self.forward(self.token, self.pos, self.cache_pos)
        self.token.copy_(logits[:, -1:].argmax(-1))
        self.pos.add_(1)
        self.cache_pos.add_(1)
        return logits


def generate(model, prompt, new_tokens, graph):
    """(the greedy tokens [batch, new_tokens], the prompt's last logits, seconds per token)."""
    d = Decoder(model, prompt, prompt.shape[1] + new_tokens + 2)
    step = d.step
    if graph:
        side = torch.cuda.Stream()      # warm up off the capture stream (libraries allocate lazily)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            d.step()
        torch.cuda.current_stream().wait_stream(side)
        d, g = Decoder(model, prompt, prompt.shape[1] + new_tokens + 2), torch.cuda.CUDAGraph()   # start over
        with torch.cuda.graph(g):       # capture ONE step; each replay is the next one
            d.step()
        step = g.replay
    tokens, t0 = [], time.perf_counter()
    for _ in range(new_tokens):
        tokens.append(d.token.clone())
        step()
    if graph:
        torch.cuda.synchronize()
    return torch.cat(tokens, dim=1), d.prompt_logits, (time.perf_counter() - t0) / new_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a model name or path already on disk (local_files_only)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the random model (default 2)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    print(f"# transformers {transformers.__version__}, torch {torch.__version__}, "
          + (torch.cuda.get_device_name() if cuda else "no GPU here: a tiny config on the CPU, eager, no graphs"))

    with torch.no_grad():
        model = load_model(args.model, args.layers, cuda)
        fast = copy.deepcopy(model)
        report = gemmc.nn.swap_linears(fast, allow_cpu=not cuda)    # allow_cpu: run gemmc's op on CPU tensors
        print(f"# {report}".splitlines()[0])
        b, n = args.batch, args.prompt_len
        if cuda:        # build every kernel these row counts run (decode: b rows; the prompt: b * n) now
            print("# " + str(gemmc.nn.prepare(fast, batch_sizes=[b, b * n])).splitlines()[0])
        prompt = torch.randint(model.config.vocab_size, (b, n), generator=torch.Generator().manual_seed(0))
        prompt = prompt.to(model.device)
        ours, ours_logits, ours_s = generate(fast, prompt, args.new_tokens, graph=cuda)
        ref, ref_logits, ref_s = generate(model, prompt, args.new_tokens, graph=cuda)

    rel = ((ours_logits - ref_logits).norm() / ref_logits.norm()).item()
    same = (ours == ref).all(dim=0).long().cumprod(0).sum().item()
    print(f"# the prompt's last logits: gemmc vs torch relative difference {rel:.2e} (bf16: expect < 2e-2)")
    print(f"# greedy tokens: gemmc and torch agree on the first {same} of {args.new_tokens} steps (random weights "
          "have near ties, so they may part later)")
    print(f"# sequence 0, torch: {ref[0].tolist()}\n# sequence 0, gemmc: {ours[0].tolist()}")
    if cuda:
        print(f"# per step (batch {b}): torch {1e3 * ref_s:.3f} ms, gemmc {1e3 * ours_s:.3f} ms "
              "(one run, not a benchmark: see bench/llama.py)")
    return 0 if rel < 2e-2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
