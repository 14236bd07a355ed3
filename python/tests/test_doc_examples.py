"""Every Python example of README.md and docs/*.md (```python blocks) checked, so that a stale
key, argument or name in the documentation fails CI (issue 27).

- An unmarked block runs on the CPU (exec, with the repository's `kernels/` and `models/`
  reachable from the working directory) against a real `kernelize serve` with the bundled
  certificates: the hub addresses the docs use (http://127.0.0.1:8080, http://hub:8080) are
  that hub's; `model` is the shipped `models/tiny-llama` in bf16 (for blocks that use a model
  without making one).
- A block right after `<!-- doctest: needs-gpu -->` (needs CUDA) or
  `<!-- doctest: skip (reason) -->` is compiled, and every `kernelize.` name it uses must exist
  and every keyword it passes to a `kernelize.` callable must be one that callable takes.
- Every base64 string shaped like an ed25519 public key anywhere in these files is a key of
  kernels/certificates/trusted-keys.txt.
- `pip install ./python` (the README's one command) builds and installs a client that imports.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, _start, _stop

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARK = re.compile(r"^<!--\s*doctest:\s*(?P<kind>needs-gpu|skip)\s*(?:\((?P<why>.+)\))?\s*-->$")
HUB_URLS = ("http://127.0.0.1:8080", "http://hub:8080")
KEY_SHAPE = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{43}=(?![A-Za-z0-9+/=])")


@dataclass
class Block:
    path: Path
    line: int          # of the opening fence, 1-based
    source: str
    mark: str | None   # None (run), "needs-gpu", "skip"
    why: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            prev = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            indent = len(lines[i]) - len(lines[i].lstrip())
            i += 1
            body = []
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i][indent:])
                i += 1
            assert i < len(lines), f"{path}:{start + 1}: a ```python block that never ends"
            m = MARK.match(prev)
            if prev.startswith("<!--") and "doctest" in prev:
                assert m, f"{path}:{start}: unreadable doctest marker {prev!r}"
            if m and m["kind"] == "skip":
                assert m["why"], f"{path}:{start}: `doctest: skip` needs a reason in parentheses"
            blocks.append(Block(path, start + 1, "\n".join(body) + "\n",
                                m["kind"] if m else None, m["why"] if m else None))
        i += 1
    return blocks


BLOCKS = [b for p in DOCS for b in python_blocks(p)]
RUN = [b for b in BLOCKS if b.mark is None]
STATIC = [b for b in BLOCKS if b.mark is not None]


def test_the_docs_have_examples_and_some_run():
    # guards the extraction itself: the README's quick start and the certificate example run
    assert len(BLOCKS) >= 10, [b.id for b in BLOCKS]
    assert any(b.path.name == "README.md" for b in RUN)
    assert any("trusted-keys.txt" in b.source for b in RUN)


# --- keys -------------------------------------------------------------------------------------

def trusted_keys() -> list[str]:
    text = (REPO / "kernels/certificates/trusted-keys.txt").read_text(encoding="utf-8")
    return [l.strip() for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]


def test_every_key_in_the_docs_is_a_trusted_key_of_the_repository():
    keys = trusted_keys()
    assert keys and all(KEY_SHAPE.fullmatch(k) for k in keys), keys
    stale = [f"{p.relative_to(REPO)}:{n}: {k}"
             for p in DOCS for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             for k in KEY_SHAPE.findall(line) if k not in keys]
    assert not stale, ("keys in the docs that kernels/certificates/trusted-keys.txt does not hold "
                       f"(stale? read the file instead of copying a key): {stale}")


def test_the_key_check_finds_a_stale_key():
    line = 'keys = ["3unz4moQ0f2ACv8LjowfQcsNcIHySHEYUcZlbjUpE5o="]  # a key re-recorded since'
    assert KEY_SHAPE.findall(line) == ["3unz4moQ0f2ACv8LjowfQcsNcIHySHEYUcZlbjUpE5o="]
    assert KEY_SHAPE.findall("sha256:" + "ab" * 32) == []


# --- blocks that cannot run on the CPU: compiled, kernelize names and keywords checked ----------

def _resolve(chain: list[str]):
    """kernelize.<a>.<b>...: the object, importing submodules on the way."""
    import kernelize
    obj, name = kernelize, "kernelize"
    for attr in chain:
        name = f"{name}.{attr}"
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif inspect.ismodule(obj):
            try:
                obj = importlib.import_module(name)
            except ImportError:
                raise AssertionError(f"{name} does not exist") from None
        else:
            raise AssertionError(f"{name} does not exist")
    return obj


def _chain(node: ast.AST) -> list[str] | None:
    """["kernelize", "exact", "backend"] for kernelize.exact.backend, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "kernelize":
        return ["kernelize", *reversed(parts)]
    return None


def api_problems(src: str, where: str) -> list[str]:
    tree = ast.parse(src, where)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""])
            for mod in mods:
                if mod == "kernelize" or mod.startswith("kernelize."):
                    try:
                        m = importlib.import_module(mod)
                    except ImportError as e:
                        problems.append(f"import {mod}: {e}")
                        continue
                    if isinstance(node, ast.ImportFrom):
                        problems += [f"from {mod} import {a.name}: no such name"
                                     for a in node.names if not hasattr(m, a.name)]
        chain = _chain(node) if isinstance(node, ast.Attribute) else None
        if chain:
            try:
                _resolve(chain[1:])
            except AssertionError as e:
                problems.append(str(e))
        if isinstance(node, ast.Call) and (chain := _chain(node.func)):
            try:
                fn = _resolve(chain[1:])
                sig = inspect.signature(fn)
            except (AssertionError, TypeError, ValueError):
                continue
            params = sig.parameters
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            problems += [f"{'.'.join(chain)}() takes no keyword {kw.arg!r} "
                         f"(it takes {', '.join(params)})"
                         for kw in node.keywords if kw.arg is not None and kw.arg not in params]
    return problems


@pytest.mark.parametrize("block", STATIC, ids=lambda b: b.id)
def test_examples_that_need_a_gpu_compile_and_use_the_clients_names(block):
    code = compile(block.source, block.id, "exec")
    assert code is not None
    assert api_problems(block.source, block.id) == []


def test_the_name_check_finds_a_stale_name_and_keyword():
    src = ("import kernelize\nkernelize.kernelize(m, hub=u, trusted_key=k)\n"
           "kernelize.kernelise(m)\nkernelize.exact.backend\n")
    problems = api_problems(src, "t")
    assert any("takes no keyword 'trusted_key'" in p for p in problems), problems
    assert any("kernelize.kernelise does not exist" in p for p in problems), problems
    assert not any("exact" in p for p in problems), problems


# --- blocks run on the CPU against a real hub -------------------------------------------------

@pytest.fixture(scope="module")
def docs_hub(tmp_path_factory):
    h = _start(tmp_path_factory.mktemp("docs-hub"), bundled_certificates=True)
    yield h
    _stop(h)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory where the docs' relative paths (kernels/..., models/...) resolve and
    whatever an example writes (a lock, a saved model) lands in a temporary folder."""
    for name in ("kernels", "models"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_block(block: Block, hub_url: str) -> dict:
    import torch
    import transformers
    src = block.source
    for url in HUB_URLS:
        src = src.replace(url, hub_url)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(REPO / "models/tiny-llama"))
    ns = {"__name__": "__doc_example__", "model": model.to(torch.bfloat16).eval(), "URL": hub_url}
    exec(compile(src, block.id, "exec"), ns)
    return ns


@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_examples_run_on_the_cpu_against_a_real_hub(block, docs_hub, workdir, capsys):
    pytest.importorskip("transformers")
    ns = run_block(block, docs_hub.url)
    assert api_problems(block.source, block.id) == []
    out = capsys.readouterr().out
    report = ns.get("report")
    if report is not None and not __import__("torch").cuda.is_available():
        # without CUDA the client says so, and keeps every layer as it is
        assert "not swapped: no CUDA" in out, out[-2000:]


def test_the_readme_quick_start_kernelizes_the_shipped_model(docs_hub, workdir, capsys):
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    quick = [b for b in RUN if b.path.name == "README.md"]
    assert quick, "the README has no runnable Python quick start"
    ns = run_block(quick[0], docs_hub.url)
    report, model = ns["report"], ns["model"]
    # every RMSNorm (4 layers x 2 + the final one) and every MLP of tiny-llama in bf16 on sm_90
    assert len(report.replaced) >= 9 and not report.kept, str(report)
    if not torch.cuda.is_available():
        assert all(e.status == "would replace" for e in report.replaced)
        assert kernelize_swapped(model) == 0
        # the line the README quotes is the one printed
        quoted = re.search(r'\("(kernelize: [^"|]+?) \|', quick[0].source)
        assert quoted, "the quick start quotes the report's first line"
        assert quoted.group(1) in capsys.readouterr().out


def kernelize_swapped(model) -> int:
    import kernelize
    return len(kernelize.launch_counts(model))


def test_the_certificate_example_takes_the_bundled_kernels_with_the_repositorys_key(docs_hub, workdir):
    pytest.importorskip("transformers")
    pytest.importorskip("cryptography")
    block = next(b for b in RUN if "trusted-keys.txt" in b.source)
    ns = run_block(block, docs_hub.url)
    report = ns["report"]
    assert report.replaced and not report.kept, str(report)
    assert all(e.kernel.evidence.get("certificate") for e in report.replaced)
    assert (workdir / "kernelize.lock.json").exists()


# --- the one command that installs the client ---------------------------------------------------

def test_pip_install_python_gives_a_client_that_imports(tmp_path):
    """`pip install ./python` as the README says, from a copy of python/ (a setuptools build
    writes build/ beside the sources), without dependencies or network (torch is this venv's):
    the installed package imports from outside the repository, with its launcher source."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "python", src, ignore=shutil.ignore_patterns(
        ".venv", "tests", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--no-index", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, "-c",
                        "import kernelize, pathlib; from kernelize import core, sources; "
                        "p = pathlib.Path(kernelize.__file__).parent; "
                        "print(p, (p / '_launcher.c').exists(), callable(kernelize.kernelize))"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    where, launcher, ok = r.stdout.split()
    assert Path(where).is_relative_to(target) and launcher == "True" and ok == "True", r.stdout
