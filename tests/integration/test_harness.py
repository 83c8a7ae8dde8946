"""The harness itself: in CI and under `spbuild test` a missing product binary fails instead of skipping."""

from __future__ import annotations

import pytest

from harness import Build


@pytest.mark.parametrize("env", [{"CI": "true"}, {"SPBUILD_TEST": "1"}])
def test_a_missing_product_binary_fails_when_strict(monkeypatch, tmp_path, env):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("SPBUILD_TEST", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(pytest.fail.Exception, match="llama-server is not in this build"):
        Build(None, tmp_path).binary("llama-server")  # type: ignore[arg-type]
    # a test helper the build may legitimately lack still skips
    with pytest.raises(pytest.skip.Exception):
        Build(None, tmp_path).binary("test-llama-archs")  # type: ignore[arg-type]


def test_a_missing_binary_skips_otherwise(monkeypatch, tmp_path):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("SPBUILD_TEST", raising=False)
    with pytest.raises(pytest.skip.Exception):
        Build(None, tmp_path).binary("llama-specprefill")  # type: ignore[arg-type]
