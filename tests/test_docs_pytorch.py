"""Every ```python block of docs/pytorch.md runs, in order, in one namespace (later blocks use earlier names),
as a reader would paste them. Without a GPU the layers keep torch's path, as the page says. torch.compile runs
with backend="aot_eager": the same dynamo trace (fullgraph, dynamic) and fake-kernel pass, without inductor's
C++ build, which costs most of a minute on CI's two cores."""
import functools
import re
import warnings
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "pytorch.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), re.M | re.S)


def test_the_page_has_its_examples():
    text = PAGE.read_text()
    assert len(BLOCKS) >= 6
    for name in ("swap_linears", "from_linear", "prepare", "torch.compile", "fuse_mlp=True", "allow_cpu=True",
                 "batch * seq_len", "in that kernel's epilogue", "GATED_UNFUSED_MAX_M"):
        assert name in text, name


def test_every_python_block_runs(monkeypatch):
    pytest.importorskip("transformers")
    import torch
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    namespace = {"__name__": "docs_pytorch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # without a GPU the page's models warn that they stay torch's
        for i, block in enumerate(BLOCKS):
            try:
                exec(compile(block, f"{PAGE.name}: python block {i + 1}", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"docs/pytorch.md python block {i + 1} failed:\n{block}") from exc
    assert namespace["fast"].weight is namespace["lin"].weight
    assert namespace["out"].shape == (64, 256)
