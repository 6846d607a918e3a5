"""The examples in README.md and docs/*.md work as written.

- Every ```python block runs, each as a script of its own (a fresh namespace), from a scratch folder that
  has the checkout's bench/ and examples/, with a fresh GEMMC_CACHE_DIR and no tuning DB. A block whose
  first line is `# needs a GPU` is a GPU test (skipped without one).
- Every `gemmc ...` / `gemmc-search ...` command in a ```console or ```bash block parses with the real
  command-line parser (the subcommand and every flag exist, each value is of the right kind); those a CPU
  runs (`gemmc compile`, `opt`, `build`, `bench --show`; `gemmc-search report`, `export`, `import`,
  `train-policy`, on a small tuning DB made for the block) run for real, in the page's order, and must
  succeed. What needs a GPU (`gemmc bench`, `gemmc-search tune`) only parses; `gemmc-search simulate` runs
  in tests/test_frictions.py (the documented commands, timed).
- README.md stays at most 8 KB, and every relative link of every page leads to a file of the checkout.

docs/pytorch.md has its own test (tests/test_docs_pytorch.py).
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md"] + sorted(p for p in DOCS.glob("*.md") if p.name != "pytorch.md")
README_MAX_BYTES = 8 * 1024
NEEDS_GPU = "# needs a GPU"
SHELL_LANGS = ("console", "bash", "sh", "shell")
PROGRAMS = {"gemmc": "gemmc", "gemmc-search": "gemmc.search"}     # command -> the module `python -m` runs
SHELL_OPERATORS = {">", ">>", "<", "|", "||", "&", "&&", ";", "2>", "2>&1"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int           # the page's line number of the block's first line
    lang: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [Block(page, text.count("\n", 0, m.start(2)) + 1, m.group(1), m.group(2)) for m in FENCE.finditer(text)]


BLOCKS = [b for page in PAGES for b in fenced_blocks(page)]
PYTHON_BLOCKS = [b for b in BLOCKS if b.lang == "python"]


@dataclass(frozen=True)
class Command:
    block: Block
    line: int           # the page's line number
    shell: str          # the line as a shell runs it (prompt removed, continuations joined)
    env: tuple          # (VAR, value) assignments before the command
    argv: tuple         # the gemmc/gemmc-search argv, up to the first shell operator
    rest: tuple         # what follows it: a shell operator and its words

    @property
    def program(self) -> str:
        return self.argv[0]


def _words(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def commands(block: Block) -> list[Command]:
    """The gemmc / gemmc-search commands of a shell block (`$ ` prompts and `VAR=value` prefixes allowed)."""
    out, pending, start = [], "", 0
    for i, raw in enumerate(block.text.splitlines()):
        line = raw.strip()
        if not pending:
            start = block.line + i
            if line.startswith("$ "):
                line = line[2:]
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        words, env = _words(line), []
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            env.append(tuple(words.pop(0).split("=", 1)))
        if not words or words[0] not in PROGRAMS:
            continue
        cut = next((j for j, w in enumerate(words) if w in SHELL_OPERATORS), len(words))
        out.append(Command(block, start, line, tuple(env), tuple(words[:cut]), tuple(words[cut:])))
    return out


COMMANDS = [c for b in BLOCKS if b.lang in SHELL_LANGS for c in commands(b)]


def _subcommand(argv) -> str | None:
    return next((a for a in argv[1:] if not a.startswith("-")), None)


DB_COMMANDS = ("report", "export", "import", "train-policy")     # gemmc-search's, on the tuning DB


def runs_for_real(cmd: Command) -> bool:
    """Runs on a CPU: compiling to IR or source, running passes over a file, building kernels into a cache,
    printing a recorded bench report, reading and moving a tuning DB. (Simulating takes seconds even on a
    sample: tests/test_frictions.py runs the documented simulate commands.)"""
    sub = _subcommand(cmd.argv)
    if cmd.program == "gemmc-search":
        return sub in DB_COMMANDS
    return sub in ("compile", "opt", "build") or "--show" in cmd.argv or sub is None


# ---- README size and links -------------------------------------------------------------------------------

def test_readme_is_at_most_8_kb():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/ (at most {README_MAX_BYTES})"


def test_the_readmes_two_commands_are_the_ones_ci_runs():
    """The README's commands are `scripts/dev example` (examples/main.py: tests/test_examples.py runs it) and
    `scripts/dev test`, which is what .ci/run runs, with its quick form `-m quick` (tests/conftest.py)."""
    block = next(b for b in fenced_blocks(ROOT / "README.md") if b.lang == "bash")
    readme = [line.split("#")[0].split() for line in block.text.splitlines() if line.split("#")[0].strip()]
    assert readme == [["scripts/dev", "example"], ["scripts/dev", "test"], ["scripts/dev", "test", "-m", "quick"]]
    ci = [line.split() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith("#")]
    assert ci == [["exec", "bash", "scripts/dev", "test"]], ci


def test_docs_pages_exist_and_the_index_lists_each():
    index = (DOCS / "index.md").read_text()
    for name in ("dsl", "schedules", "auto", "cache", "search", "benchmarking", "pytorch"):
        assert f"({name}.md)" in index, f"docs/index.md does not link docs/{name}.md"
    for page in DOCS.glob("*.md"):
        if page.name != "index.md":
            assert f"({page.name})" in index, f"docs/index.md does not link {page.name}"


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_lead_to_files_of_the_checkout(page):
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists() or ROOT not in (path, *path.parents):
            bad.append(target)
    assert not bad, f"{page.name}: links to nothing in the checkout: {bad}"


def test_every_page_has_examples_and_the_extraction_finds_them():
    for page in PAGES:
        if page.name != "index.md":
            assert any(b.page == page for b in PYTHON_BLOCKS) or any(c.block.page == page for c in COMMANDS), \
                f"{page.name} has no example the doc test runs"
    # the fence parser must see every block: a ``` left unbalanced would swallow the rest of a page
    for page in PAGES:
        assert page.read_text().count("\n```") % 2 == 0, f"{page.name}: an unclosed code fence"


# ---- python blocks ---------------------------------------------------------------------------------------

def _scratch_folder(tmp_path: Path) -> Path:
    """A working folder with the checkout's data (bench/, examples/), as the docs' commands assume."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("bench", "examples"):
        (work / name).symlink_to(ROOT / name, target_is_directory=True)
    return work


def _doc_env(tmp_path: Path) -> dict:
    """A fresh kernel cache and no tuning DB (a developer's own tuning must not change what the blocks see)."""
    return {"GEMMC_CACHE_DIR": str(tmp_path / "cache"), "GEMMC_TUNING_DB": str(tmp_path / "no-tuning.sqlite")}


def _python_param(block: Block):
    marks = [pytest.mark.gpu] if block.text.lstrip().startswith(NEEDS_GPU) else []
    return pytest.param(block, id=block.id, marks=marks)


@pytest.mark.parametrize("block", [_python_param(b) for b in PYTHON_BLOCKS])
def test_python_block_runs(block, tmp_path, monkeypatch):
    work = _scratch_folder(tmp_path)
    # padded so a traceback's line numbers are the page's
    script = tmp_path / f"{block.page.name}.py"
    script.write_text("\n" * (block.line - 1) + block.text)
    saved = dict(os.environ)
    for var in ("GEMMC_GPU", "GEMMC_PRETUNED", "GEMMC_VALIDATE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in _doc_env(tmp_path).items():
        monkeypatch.setenv(var, value)
    monkeypatch.chdir(work)
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:        # a block may set environment variables itself
        os.environ.clear()
        os.environ.update(saved)


# ---- command blocks --------------------------------------------------------------------------------------

def _parse(argv: tuple) -> None:
    """Parse argv with the command's own parser; raises AssertionError saying what it refused."""
    program, args = argv[0], list(argv[1:])
    if program == "gemmc":
        from gemmc import cli
        if "opt" in args and all(a.startswith("-") for a in args[:args.index("opt")]):
            opt_args = args[args.index("opt") + 1:]
            cli.GemmcOptMain(description="gemmc opt", args=opt_args)    # xdsl-opt's parser and pass list
            return
        parser = cli.make_parser()
    else:
        from gemmc.search import cli as search_cli
        parser = getattr(search_cli, "make_parser", None) or search_cli._parser
        parser = parser()
    parser.parse_args(args)


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: f"{c.block.page.relative_to(ROOT)}:{c.line}")
def test_command_parses(cmd, capsys):
    try:
        _parse(cmd.argv)
    except SystemExit as e:
        if e.code not in (0, None):         # --help and --version exit 0
            pytest.fail(f"{' '.join(cmd.argv)}: refused by its parser: {capsys.readouterr().err.strip()}")
    except Exception as e:
        pytest.fail(f"{' '.join(cmd.argv)}: refused by its parser: {type(e).__name__}: {e}")


RUN_BLOCKS = sorted({c.block for c in COMMANDS if runs_for_real(c)}, key=lambda b: (str(b.page), b.line))


def _main(program: str):
    if program == "gemmc":
        from gemmc.cli import main
    else:
        from gemmc.search.cli import main
    return main


def _tuned_db(path: Path) -> None:
    """A small tuning DB at `path`: three measured schedules of one problem on the H200, each with its
    paired cuBLAS time (enough for report, export, import and train-policy)."""
    import gemmc
    from gemmc.search.db import TuningDB
    from gemmc.search.strategy import Measurement, SearchProblem
    spec = gemmc.GemmSpec(128, 4096, 4096)
    candidates = SearchProblem.of(spec).candidates
    db = TuningDB(path)
    for i, t in enumerate([30.0, 25.0, 27.0]):
        db.record(spec, "sm_90a", Measurement(candidates[i], t, None, 28.0), "NVIDIA H200", "bayes")
    db.close()


@pytest.fixture(scope="module")
def doc_caches(tmp_path_factory):
    """{a --cache-dir the docs name outside the checkout: the test's folder standing for it}, one for the
    module, so the README and cache.md, which fill the same folder, build its kernels once."""
    root, seen = tmp_path_factory.mktemp("doc-cache-dirs"), {}

    def folder(named: str) -> str:
        return seen.setdefault(named, str(root / f"cache-{len(seen)}"))
    return folder


def _argv_here(cmd: Command, doc_caches) -> list:
    """The command's arguments, an absolute --cache-dir (/tmp/gemmc-cache) replaced by a test folder."""
    args = list(cmd.argv[1:])
    for i, a in enumerate(args[:-1]):
        if a == "--cache-dir" and os.path.isabs(args[i + 1]):
            args[i + 1] = doc_caches(args[i + 1])
    return args


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda b: b.id)
def test_cheap_commands_run(block, tmp_path, monkeypatch, doc_caches):
    """In this process (a python start-up per command would cost more than the commands), in the block's
    order, so a command may read the file an earlier one wrote (`> gemm.mlir`, `export FILE`)."""
    work = _scratch_folder(tmp_path)
    for var in ("GEMMC_GPU", "GEMMC_PRETUNED"):
        monkeypatch.delenv(var, raising=False)
    for var, value in _doc_env(tmp_path).items():
        monkeypatch.setenv(var, value)
    if any(c.program == "gemmc-search" and _subcommand(c.argv) in DB_COMMANDS for c in commands(block)):
        _tuned_db(Path(os.environ["GEMMC_TUNING_DB"]))
    monkeypatch.chdir(work)
    for cmd in commands(block):
        if not runs_for_real(cmd):
            continue
        where = f"{cmd.block.page.name}:{cmd.line}: {cmd.shell}"
        assert not cmd.rest or (len(cmd.rest) == 2 and cmd.rest[0] == ">"), \
            f"{where}: only `> FILE` may follow a command run here"
        out, err = io.StringIO(), io.StringIO()
        with monkeypatch.context() as env:
            for var, value in cmd.env:
                env.setenv(var, value)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = _main(cmd.program)(_argv_here(cmd, doc_caches))
                except SystemExit as e:
                    rc = e.code
        assert rc in (0, None), f"{where}\nexit {rc}\n{out.getvalue()[-2000:]}\n{err.getvalue()[-3000:]}"
        assert out.getvalue().strip(), f"{where}: printed nothing"
        if cmd.rest:
            (work / cmd.rest[-1]).write_text(out.getvalue())
