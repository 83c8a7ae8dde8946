"""The settings table (cpp/common/spec-prefill-settings.cpp, through spbuild._selection) against the README's flag
table and the measuring tools' knobs: a setting added to the table and not documented, or documented with another
default, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spbuild import _selection as sel
from spbuild.measuring import evaluate

README = Path(__file__).resolve().parents[2] / "README.md"
# the draft's own flags, written by hand beside the table's
DRAFT_FLAGS = {"--spec-prefill", "-mpd", "--spec-prefill-model", "-hfpd", "--spec-prefill-hf", "-nglpd",
               "--spec-prefill-ngl", "-devpd", "--spec-prefill-device", "--no-spec-prefill-tool-guard"}


def readme_flag_rows() -> dict[str, str]:
    """The README's flag table: each flag spelled in a row's first cell (a boolean's `--[no-]x` as `--x`), to the
    row's default cell."""
    rows: dict[str, str] = {}
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) < 3 or not cells[0].startswith("`-"):
            continue
        first = cells[0].replace("\\|", "|")
        for flag in re.findall(r"`(-[-\w\[\]]+)", first):
            rows[flag.replace("--[no-]", "--")] = cells[1]
    return rows


def default_matches(setting: dict, cell: str) -> bool:
    """Whether a README default cell starts with the table's default: numbers by value, booleans as on/off."""
    head = cell.split(" ")[0].strip("`")
    if setting["type"] == "bool":
        return head == {"enabled": "on", "disabled": "off"}[setting["default"]]
    if setting["type"] in ("int", "float"):
        try:
            return float(head) == pytest.approx(float(setting["default"]))
        except ValueError:
            return False
    return head == setting["default"]


SETTINGS = sel.settings()


def test_the_table_has_one_row_per_key_and_flag():
    keys = [s["key"] for s in SETTINGS]
    assert len(keys) == len(set(keys))
    flags = [f for s in SETTINGS for f in s["flags"] + s["flags_neg"]]
    assert len(flags) == len(set(flags))
    for s in SETTINGS:
        assert s["flags"][0].startswith("--spec-prefill-"), s
        assert s["env"].startswith("LLAMA_ARG_SPEC_PREFILL_"), s
        assert s["help"], s


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s["key"])
def test_every_setting_is_in_the_readme_with_its_default(setting):
    rows = readme_flag_rows()
    flag = setting["flags"][0]
    assert flag in rows, f"README's flag table has no row for {flag}"
    assert default_matches(setting, rows[flag]), (flag, rows[flag], setting["default"])


def test_every_readme_flag_is_in_the_table():
    known = {f for s in SETTINGS for f in s["flags"] + s["flags_neg"]} | DRAFT_FLAGS
    unknown = [f for f in readme_flag_rows() if f not in known]
    assert not unknown, f"README documents flags the table does not have: {unknown}"


def test_the_seed_tools_variables_are_documented():
    text = README.read_text()
    seed = [s["env_seed"] for s in SETTINGS if s["env_seed"]]
    assert {"SP_KEEP_PCT", "SP_MAX_KEEP", "SP_SPEC_CTX", "SP_LOOKAHEAD", "SP_CHUNK", "SP_WINDOW",
            "SP_CUMULATIVE_MASS", "SP_SELECT_MODE"} <= set(seed)
    missing = [name for name in seed if f"`{name}`" not in text]
    assert not missing, f"README does not name the seed's variables {missing}"


def test_the_evals_variants_are_the_tables_settings():
    """`spbuild eval --vary FIELD=N` sends FIELD in the request's spec_prefill object, or its flag for the tool: each
    must be a setting a request may set, spelled as the table spells its flag."""
    by_key = {s["key"]: s for s in SETTINGS}
    for key, flag in evaluate.VARIANT_FIELDS.items():
        assert key in by_key and by_key[key]["per_request"], key
        assert flag == by_key[key]["flags"][0], (key, flag)
