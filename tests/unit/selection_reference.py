"""A plain NumPy/Python reference of speculative-prefill scoring and selection (cpp/common/spec-prefill-select.h).

Written from the documented algorithm, not from the C++: readability over speed. Two conventions follow the C++
interface rather than any particular implementation:

* `mass` is a float32 parameter in C++, so the mass target is float32(mass) * total;
* sums whose exact rounding decides ties (chunk means, the mass held) are plain left-to-right float64 sums
  (Python's builtin sum() is compensated on 3.12+, so it is not used for those).
"""

from __future__ import annotations

import math
import re

import numpy as np


def seq_sum(values) -> float:
    """Left-to-right float64 sum."""
    acc = 0.0
    for v in values:
        acc += float(v)
    return acc


# --- scoring -------------------------------------------------------------------------------------------------


def pool_span(span: np.ndarray, kernel: int) -> np.ndarray:
    """Average pool along a 1-D span: window [j - left, j + right] clipped to the span, divided by its real size."""
    span = np.asarray(span, dtype=np.float64)
    n = span.shape[0]
    if kernel <= 1:
        return span.copy()
    left, right = (kernel - 1) // 2, kernel // 2
    j = np.arange(n)
    lo = np.maximum(0, j - left)
    hi = np.minimum(n - 1, j + right)  # inclusive
    csum = np.concatenate([[0.0], np.cumsum(span)])
    return (csum[hi + 1] - csum[lo]) / (hi - lo + 1)


def pool_span_naive(span: np.ndarray, kernel: int) -> np.ndarray:
    """The same, one window at a time (to check pool_span itself)."""
    span = np.asarray(span, dtype=np.float64)
    n = span.shape[0]
    if kernel <= 1:
        return span.copy()
    left, right = (kernel - 1) // 2, kernel // 2
    return np.array([span[max(0, j - left):min(n, j + right + 1)].mean() for j in range(n)])


def pool_row(probs: np.ndarray, key0: int, n_keys: int, n_norm: int, kernel: int) -> np.ndarray:
    probs = np.asarray(probs, dtype=np.float64)
    z = probs[:n_norm].sum()
    if z <= 0.0:
        return np.zeros(n_keys)
    p = probs / z
    return pool_span(p[key0:key0 + n_keys], kernel)


def score(attn: np.ndarray, key0: int, n_keys: int, n_norm: int, kernel: int, scale: float = 1.0) -> np.ndarray:
    """attn[n_rows, n_layers, n_head, n_cells] -> scale * mean over rows of the max over (layer, head)."""
    n_rows, n_layers, n_head, _ = attn.shape
    if n_rows == 0:
        return np.zeros(n_keys)
    total = np.zeros(n_keys)
    for r in range(n_rows):
        row_max = np.zeros(n_keys)
        for layer in range(n_layers):
            for h in range(n_head):
                probs = np.asarray(attn[r, layer, h], dtype=np.float64)
                if probs[:n_norm].sum() <= 0.0:
                    continue  # a head with no mass on the prompt is skipped
                row_max = np.maximum(row_max, pool_row(probs, key0, n_keys, n_norm, kernel))
        total += row_max
    return scale * total / n_rows


# --- windows -------------------------------------------------------------------------------------------------


def plan_windows(n_tokens: int, window: int) -> list[tuple[int, int]]:
    if n_tokens <= 0:
        return []
    if window <= 0 or window >= n_tokens:
        return [(0, n_tokens)]
    n_windows = -(-n_tokens // window)
    base, extra = divmod(n_tokens, n_windows)
    out, begin = [], 0
    for w in range(n_windows):
        size = base + (1 if w < extra else 0)
        out.append((begin, begin + size))
        begin += size
    return out


# --- selection -----------------------------------------------------------------------------------------------


def check_params(mode: str, keep: float, mass: float, chunk_size: int, keep_first: int, keep_last: int) -> str | None:
    if mode not in ("keep", "mass"):
        return "unknown mode"
    if not (0.0 < keep <= 1.0):
        return "keep must be in (0, 1]"
    if not (0.0 < mass <= 1.0):
        return "mass must be in (0, 1]"
    if chunk_size < 0:
        return "chunk_size must be >= 0"
    if keep_first < 0 or keep_last < 0:
        return "keep_first and keep_last must be >= 0"
    return None


def clean_scores(scores) -> list[float]:
    """float32 scores as float64, non-finite ones as 0."""
    return [float(s) if math.isfinite(s) else 0.0 for s in np.asarray(scores, dtype=np.float32).tolist()]


def chunk_ranges(n: int, chunk_size: int, line_ends=None) -> list[range]:
    """Fixed chunks; with line_ends, each chunk but the last takes the length, between half and one and a half chunk
    sizes, that ends on a line end and is nearest to the chunk size (the shorter of two as near), if there is one."""
    chunk = max(1, chunk_size)
    out, i0 = [], 0
    while i0 < n:
        end = min(n, i0 + chunk)
        if line_ends is not None and chunk > 1 and end < n:
            lengths = [size for size in range(math.ceil(chunk / 2), chunk + chunk // 2 + 1)
                       if i0 + size <= n and line_ends[i0 + size - 1]]
            if lengths:
                end = i0 + min(lengths, key=lambda size: (abs(size - chunk), size))
        out.append(range(i0, end))
        i0 = end
    return out


def forced_positions(n: int, chunk_size: int, keep_first: int, keep_last: int) -> set[int]:
    chunk = max(1, chunk_size)
    n_head = min(n, keep_first)
    n_tail = min(n, max(keep_last, chunk, 1))
    return set(range(n_head)) | set(range(n - n_tail, n))


def question_line_positions(pieces: list[str], line_ends, n_question: int, max_lines: int) -> set[int]:
    """Tokens of the lines that share a word (4+ ASCII letters or digits, or non-ASCII characters; case folded), or an
    identifier joined by '_' (whole, its outer underscores dropped), with the lines holding the last n_question
    tokens, where that word is in 1 to max_lines lines before them."""
    n = len(pieces)
    if n == 0 or max_lines <= 0 or n_question <= 0:
        return set()
    starts = [0] + [i for i in range(1, n) if line_ends[i - 1]]
    lines = [range(a, b) for a, b in zip(starts, starts[1:] + [n])]
    q0 = max(0, n - n_question)
    q_line = next(k for k, r in enumerate(lines) if q0 in r)

    def words(r: range) -> set[bytes]:
        text = "".join(pieces[i] for i in r).encode()
        found = set(re.findall(rb"[0-9A-Za-z\x80-\xff]{4,}", text))
        found |= {i.strip(b"_") for i in re.findall(rb"[0-9A-Za-z_\x80-\xff]+", text) if b"_" in i.strip(b"_")}
        return {w.lower() for w in found}  # bytes.lower(): ASCII only

    asked = set().union(*(words(r) for r in lines[q_line:]))
    holding: dict[bytes, list[int]] = {w: [] for w in asked}
    for k, r in enumerate(lines[:q_line]):
        for w in words(r) & asked:
            holding[w].append(k)
    out: set[int] = set()
    for ks in holding.values():
        if 1 <= len(ks) <= max_lines:
            for k in ks:
                out.update(lines[k])
    return out


def keep_count(keep: float, n_chunks: int, n_candidates: int) -> int:
    return min(max(1, math.ceil(keep * n_chunks - 1e-6)), n_candidates)


def ranked_candidates(scores, chunk_size: int, keep_first: int, keep_last: int, line_ends=None,
                      forced: set[int] | None = None) -> list[int]:
    """Candidate chunk indices (not entirely always-kept), highest mean first, ties to the lower index."""
    s = clean_scores(scores)
    n = len(s)
    chunks = chunk_ranges(n, chunk_size, line_ends)
    if forced is None:
        forced = forced_positions(n, chunk_size, keep_first, keep_last)
    candidates = [c for c, r in enumerate(chunks) if not all(i in forced for i in r)]
    mean = {c: seq_sum(s[i] for i in chunks[c]) / len(chunks[c]) for c in candidates}
    return sorted(candidates, key=lambda c: (-mean[c], c))


def grow_runs_to_lines(kept: set[int], n: int, line_ends, limit: int) -> set[int]:
    """Each run of kept tokens grows back to its line's start and on to its line's end, where at most limit tokens
    are missing; the runs are those of the selection before any growth."""
    line_start = lambda i: i == 0 or line_ends[i - 1]  # noqa: E731
    grown = set(kept)
    runs, i = [], 0
    while i < n:
        if i in kept:
            j = i
            while j < n and j in kept:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    for a, b in runs:
        starts = [s for s in range(a - limit, a + 1) if s >= 0 and line_start(s)]
        if starts:
            grown.update(range(max(starts), a))
        ends = [e for e in range(b, min(n, b + limit) + 1) if line_ends[e - 1]]
        if ends:
            grown.update(range(b, min(ends)))
    return grown


def select(scores, mode: str = "keep", keep: float = 0.3, mass: float = 0.85, chunk_size: int = 32,
           keep_first: int = 4, keep_last: int = 64, line_ends=None, chunk_lines: bool = True,
           complete_lines: bool = False, pieces: list[str] | None = None, question_lines: int = 0,
           protect=None) -> list[int]:
    problem = check_params(mode, keep, mass, chunk_size, keep_first, keep_last)
    if problem is not None:
        raise ValueError(problem)
    s = clean_scores(scores)
    n = len(s)
    if n == 0:
        return []
    cut_at_lines = line_ends if chunk_lines else None
    chunks = chunk_ranges(n, chunk_size, cut_at_lines)
    kept = forced_positions(n, chunk_size, keep_first, keep_last)
    if question_lines > 0 and line_ends is not None and pieces is not None:
        kept |= question_line_positions(pieces, line_ends, min(n, max(keep_last, chunk_size, 1)), question_lines)
    order = ranked_candidates(scores, chunk_size, keep_first, keep_last, cut_at_lines, forced=set(kept))

    if mode == "keep":
        for c in order[:keep_count(keep, len(chunks), len(order))]:
            kept.update(chunks[c])
    else:
        total = seq_sum(s)
        held = seq_sum(s[i] for i in sorted(kept))
        target = float(np.float32(mass)) * total
        for c in order:
            if held >= target:
                break
            for i in chunks[c]:
                if i not in kept:
                    held += s[i]
            kept.update(chunks[c])
    # protected spans are added to what the selection keeps without them
    kept |= {i for i in range(n) if protect is not None and protect[i]}
    if complete_lines and line_ends is not None:
        kept = grow_runs_to_lines(kept, n, line_ends, max(1, chunk_size) // 2)
    return sorted(kept)
