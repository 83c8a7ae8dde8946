"""The real models' verification and the kinds drawn from llama.cpp sources, on files made here."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from spbuild.errors import VerificationError
from spbuild.measuring import real_models, source_tasks, tasks


def _gguf(path: Path, name: str) -> Path:
    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    kv = (string("general.architecture") + struct.pack("<I", 8) + string("qwen2") +
          string("general.alignment") + struct.pack("<I", 4) + struct.pack("<I", 32) +
          string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2) + struct.pack("<ff", 0.5, 1.0) +
          string("general.name") + struct.pack("<I", 8) + string(name))
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 4) + kv)
    return path


def test_the_gguf_name_is_read_past_scalars_and_arrays(tmp_path):
    assert real_models.gguf_name(_gguf(tmp_path / "m.gguf", "Qwen2.5 Coder")) == "Qwen2.5 Coder"
    (tmp_path / "x.bin").write_bytes(b"not a gguf at all, just bytes")
    assert real_models.gguf_name(tmp_path / "x.bin") is None


def test_a_file_that_is_not_the_recorded_model_is_refused_naming_what_differs(tmp_path):
    path = _gguf(tmp_path / "m.gguf", "Something Else")
    data = path.read_bytes()
    model = real_models.SplitModel("m.gguf", "pkg-part{n}", "1.0", 1, len(data), hashlib.sha256(data).hexdigest(),
                                   "Qwen2.5 Coder")
    with pytest.raises(VerificationError, match="general.name 'Something Else', expected 'Qwen2.5 Coder'"):
        real_models.verify(model, path)
    with pytest.raises(VerificationError, match="size"):
        real_models.verify(real_models.SplitModel("m.gguf", "p{n}", "1", 1, len(data) + 1, "0", "Something Else"),
                           path)
    real_models.verify(real_models.SplitModel("m.gguf", "p{n}", "1", 1, len(data), hashlib.sha256(data).hexdigest(),
                                              "Something Else"), path)


def _tree(root: Path) -> Path:
    src = root / "src"
    src.mkdir(parents=True)
    for i in range(30):
        (src / f"file{i:02d}.cpp").write_text("\n".join(
            [f"// filler file {i}", f"static int helper_{i}_value(int x) {{", "    return x;", "}", ""] * 20))
    (src / "consts.h").write_text("#pragma once\n\n#define LLAMA_TEST_LIMIT 4096\n\nenum kind {\n"
                                  "    KIND_FIRST_ONE = 17,\n};\n\n// returns how many widgets the frobnicator holds\n"
                                  "static int count_widgets_now(const struct frob * fr, int flags) {\n")
    (src / "ours.cpp").write_text("// spec_prefill: our own code is never a question\n#define SPEC_ONLY_VALUE 77\n")
    return root


def test_source_kinds_ask_what_only_the_excerpt_answers(tmp_path):
    tree = _tree(tmp_path)
    assert [q.answer for q in source_tasks.questions(tree, "define")] == ["4096"]  # not our file's
    assert [q.answer for q in source_tasks.questions(tree, "enum")] == ["17"]
    assert [q.answer for q in source_tasks.questions(tree, "docfn")] == ["count_widgets_now"]
    for kind in ("define", "enum", "docfn"):
        for depth in (0.1, 0.9):
            case = tasks.make_case(kind, "ignored", 800, depth, 0, source_tree=tree, chat=kind == "docfn")
            assert case.filler == "source" and all(line in case.prompt for line in case.evidence)
            body = case.prompt[:case.prompt.index("\n\nQuestion:")]
            where = body.index(case.evidence[0]) / len(body)
            assert abs(where - depth) < 0.35
            assert body.count(case.evidence[0]) == 1
    with pytest.raises(ValueError, match="source_tree"):
        tasks.make_case("define", "prose", 800, 0.5)
