"""Every Python block in README.md and docs/ runs as written (and the
README's Quick start commands are what `.ci/run` runs).

The docs are what users copy from, so each ```python block runs in a fresh
process on a CPU-only install, from a temporary directory, with nothing but
the block itself (a block that wants several replicas splits the CPU into
logical devices in its own code, as a user must). An HTML comment right
before a fence says how else to run it:

- `<!-- doc-test: continues -->`: appended to the page's previous block and
  run with it, in one process (the page reads as one session).
- `<!-- doc-test: skip (reason) -->`: not run; reported as a skip with the
  reason (it needs a GPU, or several machines).
- `<!-- doc-test: launch --num-ps 1 --num-workers 2 [--mode between-graph] -->`:
  the block is a training script, run by
  `python -m keras_psdist launch ... -- python block.py` on a local cluster.
- `slow` before `launch` (`<!-- doc-test: slow launch ... -->`) keeps a
  block out of the default run (`-m "not slow"`).

The fresh process is a fork of the test zygote (`cluster_jobs/zygote.py`),
which imported TensorFlow, Keras and keras_psdist in this same environment
and started nothing of TensorFlow's runtime: the block's process is as a
fresh interpreter's after those imports, without their 6 CPU-seconds per
block (`KERAS_PSDIST_TEST_ZYGOTE_FORKS=0` runs each in a new interpreter).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest
import zygote  # tests/cluster_jobs, see conftest.py

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# Seconds a block (or a launched block's whole cluster) may take.
RUN_TIMEOUT_S = 120
LAUNCH_TIMEOUT_S = 180

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
_SKIP = re.compile(r"^skip\s*\((.+)\)$")


@dataclasses.dataclass
class Block:
    """A runnable group: one block and the blocks that continue it."""

    page: str
    line: int
    code: str
    kind: str = "run"  # "run", "skip" or "launch"
    reason: str = ""  # skip: why
    launch_args: tuple[str, ...] = ()
    slow: bool = False

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def parse_page(text: str, page: str) -> list[Block]:
    """The page's Python blocks, grouped by their `doc-test` directives.

    Raises:
        ValueError: for an unknown directive, a `continues` with no block
            before it, or a fence that is never closed.
    """
    lines = text.split("\n")
    groups: list[Block] = []
    directive = None
    i = 0
    while i < len(lines):
        line = lines[i]
        match = _DIRECTIVE.match(line)
        if match:
            directive = (match.group(1), i + 1)
            i += 1
            continue
        fence = _FENCE.match(line)
        if not fence:
            if line.strip():
                directive = None  # a directive belongs to the very next fence
            i += 1
            continue
        indent, marker, language = fence.groups()
        start = i + 1
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(marker):
            body.append(lines[i][len(indent) :] if lines[i].strip() else "")
            i += 1
        if i == len(lines):
            raise ValueError(f"{page}:{start}: a code fence is never closed")
        i += 1
        if language not in ("python", "py"):
            if directive is not None:
                raise ValueError(
                    f"{page}:{directive[1]}: a doc-test directive before a "
                    f"{language or 'plain'} block; only Python blocks run"
                )
            continue
        code = "\n".join(body) + "\n"
        text_, where = directive if directive else ("", start)
        directive = None
        if text_ == "continues":
            if not groups:
                raise ValueError(f"{page}:{where}: `continues` with no block before it")
            groups[-1].code += "\n" + code
            continue
        groups.append(_block(page, start, code, text_, where))
    return groups


def _block(page: str, line: int, code: str, directive: str, where: int) -> Block:
    block = Block(page, line, code)
    words = directive.split()
    if words[:1] == ["slow"]:
        block.slow = True
        words = words[1:]
        directive = " ".join(words)
    if not words:
        if block.slow:
            raise ValueError(f"{page}:{where}: `slow` is only for launch blocks")
        return block
    skip = _SKIP.match(directive)
    if skip:
        block.kind, block.reason = "skip", skip.group(1).strip()
    elif words[0] == "launch" and len(words) > 1:
        block.kind, block.launch_args = "launch", tuple(words[1:])
    else:
        raise ValueError(
            f"{page}:{where}: unknown doc-test directive {directive!r}. Expected "
            "`continues`, `skip (reason)`, `launch ARGS` or `slow launch ARGS`."
        )
    if block.slow and block.kind != "launch":
        raise ValueError(f"{page}:{where}: `slow` is only for launch blocks")
    return block


def _collect() -> list[Block]:
    blocks = []
    for path in PAGES:
        blocks += parse_page(path.read_text(), str(path.relative_to(ROOT)))
    return blocks


BLOCKS = _collect()


def _param(block: Block):
    if block.kind == "launch":
        marks = [pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60), pytest.mark.multiprocess]
    else:
        marks = [pytest.mark.timeout(RUN_TIMEOUT_S + 60)]
    if block.slow:
        marks.append(pytest.mark.slow)
    if block.kind == "skip":
        marks.append(pytest.mark.skip(reason=f"{block.id}: {block.reason}"))
    return pytest.param(block, id=block.id, marks=marks)


def _environment() -> dict[str, str]:
    """This environment for a user's fresh process: no cluster of ours, the
    checkout importable from any directory."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "TF_CONFIG" and not k.startswith("KERAS_PSDIST_")
    }
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH")) if p
    )
    env["KERAS_BACKEND"] = "tensorflow"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_block_runs(block, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(block.code)
    env, python = zygote.python_in(_environment())
    if block.kind == "launch":
        command = [
            *python,
            "-m",
            "keras_psdist",
            "launch",
            *block.launch_args,
            "--timeout",
            str(LAUNCH_TIMEOUT_S - 30),
            "--",
            *python,
            script.name,
        ]
        timeout = LAUNCH_TIMEOUT_S
    else:
        command = [*python, script.name]
        timeout = RUN_TIMEOUT_S
    result = subprocess.run(
        command,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"{block.id} exited with {result.returncode}:\n"
        f"--- stdout (tail)\n{_tail(result.stdout)}\n"
        f"--- stderr (tail)\n{_tail(result.stderr)}"
    )


def test_pages_have_blocks_and_directives_parse():
    """Collection found the pages' blocks (a parse error fails at import)."""
    pages = {b.page for b in BLOCKS}
    assert "README.md" in pages and "docs/quickstart.md" in pages
    assert any(b.kind == "launch" and not b.slow for b in BLOCKS), (
        "at least one launch block must run in the default suite"
    )


def test_docs_use_the_current_mode_names():
    """`mode="sync"` / `mode="async"` are deprecated spellings of in-graph
    and between-graph; no page teaches them (troubleshooting may quote the
    DeprecationWarning that names them)."""
    old = re.compile(r"""mode\s*=\s*["'](sync|async)["']""")
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in PAGES
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if old.search(line) and "DeprecationWarning" not in line
    ]
    assert not found, "\n".join(found)


def _quick_start_blocks() -> list[str]:
    """The README Quick start's shell blocks, each as one line."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return [
        " ".join(block.split())
        for block in re.findall(r"^```\n(.*?)^```$", section, re.S | re.M)
    ]


def test_quick_start_keeps_trying_and_testing_apart():
    """Copying the "try it" block installs and runs the demo, nothing else;
    the test suite is a block of its own."""
    try_it, run_tests = _quick_start_blocks()
    assert "keras-psdist demo" in try_it and "pytest" not in try_it
    assert "nox" not in try_it
    assert "pytest" in run_tests and "keras-psdist demo" not in run_tests


def test_ci_runs_exactly_the_readme_test_command():
    """`.ci/run` runs the README's "run the tests" block, command by command
    (`python -m pip` for its `pip`), after `.ci/`'s own set-up of the
    machine's packages."""
    import shlex

    run_tests = _quick_start_blocks()[1]
    readme = [shlex.split(c) for c in run_tests.split("&&")]
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    ci = [
        shlex.split(line)
        for line in script
        if line.strip() and not line.lstrip().startswith(("#", "set ", "cd ", ".ci/"))
    ]
    ci = [c[2:] if c[:3] == ["python", "-m", "pip"] else c for c in ci]
    assert ci == readme, f".ci/run runs {ci}; the README says {readme}"


@pytest.mark.parametrize(
    "text, error",
    [
        pytest.param(
            "<!-- doc-test: continues -->\n```python\nx = 1\n```\n",
            "no block before",
            id="continues-first",
        ),
        ("<!-- doc-test: skipp -->\n```python\nx = 1\n```\n", "unknown"),
        ("<!-- doc-test: slow -->\n```python\nx = 1\n```\n", "only for launch"),
        ("<!-- doc-test: continues -->\n```\nls\n```\n", "only Python blocks"),
        ("```python\nx = 1\n", "never closed"),
    ],
)
def test_bad_directives_are_errors(text, error):
    with pytest.raises(ValueError, match=error):
        parse_page(text, "page.md")


def test_directives_group_blocks():
    text = "\n".join(
        [
            "```python",
            "a = 1",
            "```",
            "<!-- doc-test: continues -->",
            "```python",
            "assert a == 1",
            "```",
            "<!-- doc-test: skip (needs a GPU) -->",
            "```python",
            "gpu()",
            "```",
            "  <!-- doc-test: slow launch --num-ps 1 --num-workers 2 -->",
            "  ```python",
            "  train()",
            "  ```",
            "```sh",
            "ls",
            "```",
        ]
    )
    run, skip, launch = parse_page(text, "p.md")
    assert (run.line, run.code, run.kind) == (1, "a = 1\n\nassert a == 1\n", "run")
    assert (skip.kind, skip.reason) == ("skip", "needs a GPU")
    assert launch.kind == "launch" and launch.slow
    assert launch.launch_args == ("--num-ps", "1", "--num-workers", "2")
    assert launch.code == "train()\n"
