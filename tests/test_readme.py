"""The README is true: every ```sh block of README.md runs, in a fresh GRIDSHIFT_HOME
with fake GPUs, in a temporary copy of the working directory (``examples/``,
``configs/``; ``.venv`` is this test environment; ``../shared/data`` the shared data),
under ``bash -e -o pipefail`` so that every command's exit code counts.

A block is steered by HTML comments right above its fence (invisible on GitHub):

- ``<!-- readme-test: skip (REASON) -->``: not run (a network, root, a server), with
  the reason in the skip;
- ``<!-- readme-test: needs-data -->``: skipped when ``$GRIDSHIFT_SHARED_DATA`` (default
  /work/shared/data) is absent;
- ``<!-- readme-test: simulate-args ARGS -->``: ARGS appended to each ``gridshift
  simulate`` of the block, to keep the test short (say so in the README's text);
- ``<!-- readme-test: creates PATH -->``: the block must leave that file behind.

Other slices change the CLI's output: this checks exit codes and the files a block
promises, not text."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT, base_env, shared_data

pytestmark = pytest.mark.backends("sqlite")
DIRECTIVE = re.compile(r"^<!--\s*readme-test:\s*(?P<verb>[\w-]+)\s*(?P<arg>.*?)\s*-->$")


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    code: str
    directives: dict[str, list[str]] = field(default_factory=dict)


def readme_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            start = i
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            block = Block(start + 1, "\n".join(lines[start + 1 : j]) + "\n")
            k = start - 1
            while k >= 0 and (m := DIRECTIVE.match(lines[k].strip())):
                block.directives.setdefault(m["verb"], []).insert(0, m["arg"])
                k -= 1
            blocks.append(block)
            i = j
        i += 1
    return blocks


BLOCKS = readme_blocks((ROOT / "README.md").read_text())


def test_the_readme_has_shell_blocks_and_known_directives():
    assert len(BLOCKS) >= 8
    for block in BLOCKS:
        unknown = set(block.directives) - {"skip", "needs-data", "simulate-args", "creates"}
        assert not unknown, (block.line, unknown)
        for reason in block.directives.get("skip", []):
            assert reason.startswith("(") and len(reason) > 5, (block.line, reason)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the repository's working files, with .venv and ../shared/data linked."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for folder in ("examples", "configs"):
        shutil.copytree(ROOT / folder, repo / folder)
    (repo / ".venv").symlink_to(Path(sys.executable).parent.parent)
    data = shared_data()
    if data.is_dir():
        (tmp_path / "shared").mkdir()
        (tmp_path / "shared" / "data").symlink_to(data)
    return repo


@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}" for b in BLOCKS])
def test_readme_block(block: Block, workdir: Path, tmp_path: Path):
    if "skip" in block.directives:
        pytest.skip(f"README line {block.line}: {block.directives['skip'][0].strip('()')}")
    if "needs-data" in block.directives and not shared_data().is_dir():
        pytest.skip(f"README line {block.line}: needs $GRIDSHIFT_SHARED_DATA")
    home = tmp_path / "home"
    home.mkdir()
    env = base_env(home)
    env.pop("COLUMNS", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the toy's checkpoints
    env["GRIDSHIFT_DAEMON_INTERVAL_S"] = "0.2"  # `daemon --until-idle` ends sooner
    extra = " ".join(block.directives.get("simulate-args", []))
    prelude = "set -e -o pipefail\n"
    if extra:  # a function: each `gridshift simulate` of the block gets the extra args
        prelude += (
            'gridshift() { if [ "$1" = simulate ]; then command gridshift "$@" '
            f'{extra}; else command gridshift "$@"; fi; }}\n'
        )
    proc = subprocess.run(
        ["bash", "-c", prelude + block.code],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (
        f"README line {block.line} exited {proc.returncode}\n{block.code}\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
    for path in block.directives.get("creates", []):
        assert (workdir / path).is_file(), f"README line {block.line} did not write {path}"
