"""The kept sets of the tiny models under a few settings, against the ones recorded in data/kept-sets.json: a
refactor of the scoring, the selection or the settings that changes what is kept fails here, and a change meant to
change it records the new sets (SPBUILD_RECORD_KEPT=1) in the same commit, where the diff shows what moved."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from spbuild.measuring.evaluate import _ranges as ranges

from harness import TINY_ARCHS, words_prompt

pytestmark = pytest.mark.build

RECORD = Path(__file__).with_name("data") / "kept-sets.json"
PROMPT = words_prompt(1800)
SETTINGS = {
    "keep-0.3": ("--spec-prefill-p", "0.3"),
    "keep-0.3-windows-1024": ("--spec-prefill-p", "0.3", "--spec-prefill-window", "1024"),
    "mass-0.85": ("--spec-prefill-select", "mass", "--spec-prefill-mass", "0.85"),
    "keep-0.2-chunk-16-lines": ("--spec-prefill-p", "0.2", "--spec-prefill-chunk", "16", "--spec-prefill-chunk-lines"),
}


def kept_sets(tool, tiny_models) -> dict[str, list[list[int]]]:
    found = {}
    for arch in TINY_ARCHS:
        for name, args in SETTINGS.items():
            result = tool.run("-m", tiny_models[arch], "-mpd", tiny_models[arch], "--device", "none", "-c", "8192",
                              "--spec-prefill-ctx", "16384", "-n", "1", "--temp", "0", "--no-warmup",
                              "--spec-prefill-min-tokens", "256", *args, prompt=PROMPT)
            assert result.returncode == 0, result.stderr[-3000:]
            assert result.report["status"] == "sparse", result.report["reason"]
            found[f"{arch}/{name}"] = ranges(result.report["kept"])
    return found


def test_the_tiny_models_keep_what_they_kept(tool, tiny_models):
    found = kept_sets(tool, tiny_models)
    if os.environ.get("SPBUILD_RECORD_KEPT") == "1":
        RECORD.parent.mkdir(exist_ok=True)
        RECORD.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n")
    recorded = json.loads(RECORD.read_text())
    assert set(found) == set(recorded)
    changed = [key for key in found if found[key] != recorded[key]]
    assert not changed, f"kept sets changed for {changed}: record them with SPBUILD_RECORD_KEPT=1 if meant"
