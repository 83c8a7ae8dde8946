"""An independent Gemma 3 forward pass in NumPy, for checking llama.cpp's sparse prefill on a sliding-window target.

It reads the weights with gguf-py (dequantised to float32) and computes the next-token log-probabilities after a set
of prompt tokens at explicit positions: global attention on every sixth layer (RoPE base 1e6), a 512-position sliding
window on the others (RoPE base 1e4), the mask by position, as Gemma 3 defines it (not as llama.cpp's KV cache
implements it). A sparse prefill is the same call with the kept tokens at their original positions.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

SWA_PATTERN = 6  # layers il with il % 6 == 5 attend globally
ROPE_BASE_SWA = 10000.0


class Gemma3:
    def __init__(self, path: Path, tree: Path):
        sys.path.insert(0, str(tree / "gguf-py"))
        from gguf import GGUFReader  # noqa: PLC0415 - the fetched tree's gguf-py
        from gguf.quants import dequantize  # noqa: PLC0415

        reader = GGUFReader(str(path))
        fields = {k: f.parts[f.data[0]] for k, f in reader.fields.items() if f.data}
        arch = bytes(fields["general.architecture"]).decode()
        if arch != "gemma3":
            raise ValueError(f"{path} is a {arch} model, not gemma3")

        def value(key: str, default=None):
            return fields[f"gemma3.{key}"][0] if f"gemma3.{key}" in fields else default

        self.n_layer = int(value("block_count"))
        self.n_head = int(value("attention.head_count"))
        self.n_head_kv = int(value("attention.head_count_kv"))
        self.head_dim = int(value("attention.key_length"))
        self.n_embd = int(value("embedding_length"))
        self.eps = float(value("attention.layer_norm_rms_epsilon"))
        self.n_swa = int(value("attention.sliding_window"))
        self.rope_base = float(value("rope.freq_base"))
        self.rope_base_swa = float(value("rope.freq_base_swa", ROPE_BASE_SWA))
        self.w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float32).reshape(
            [int(d) for d in reversed(t.shape)]) for t in reader.tensors}

    def is_swa(self, il: int) -> bool:
        return il % SWA_PATTERN < SWA_PATTERN - 1

    def _norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        x64 = x.astype(np.float64)
        return (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + self.eps)).astype(np.float32) * weight

    def _rope(self, x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
        """NEOX-style rotary embedding: dimension i pairs with i + d/2. x: [tokens, heads, d]."""
        half = self.head_dim // 2
        freqs = base ** (-np.arange(half, dtype=np.float64) * 2.0 / self.head_dim)
        angles = positions[:, None].astype(np.float64) * freqs[None, :]
        cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
        x1, x2 = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)

    def logprobs(self, tokens: list[int], positions: list[int], swa: bool = True) -> np.ndarray:
        """log-softmax of the logits after the last of `tokens`, each at its position. swa=False makes every layer
        global (a wrong model, for showing the comparison can tell)."""
        w = self.w
        pos = np.asarray(positions)
        assert len(tokens) == len(pos) and np.all(np.diff(pos) > 0), "positions must increase"
        x = w["token_embd.weight"][tokens] * np.float32(np.sqrt(self.n_embd))
        causal = pos[None, :] <= pos[:, None]
        window = (pos[:, None] - pos[None, :]) < self.n_swa
        for il in range(self.n_layer):
            p = f"blk.{il}."
            local = swa and self.is_swa(il)
            h = self._norm(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(len(tokens), self.n_head, self.head_dim)
            k = (h @ w[p + "attn_k.weight"].T).reshape(len(tokens), self.n_head_kv, self.head_dim)
            v = (h @ w[p + "attn_v.weight"].T).reshape(len(tokens), self.n_head_kv, self.head_dim)
            base = self.rope_base_swa if self.is_swa(il) else self.rope_base
            q = self._rope(self._norm(q, w[p + "attn_q_norm.weight"]), pos, base) / np.float32(np.sqrt(self.head_dim))
            k = self._rope(self._norm(k, w[p + "attn_k_norm.weight"]), pos, base)
            mask = causal & window if local else causal
            group = self.n_head // self.n_head_kv
            out = np.empty((len(tokens), self.n_head, self.head_dim), dtype=np.float32)
            for hd in range(self.n_head):
                kv = hd // group
                scores = (q[:, hd, :] @ k[:, kv, :].T).astype(np.float64)
                scores[~mask] = -np.inf
                scores -= scores.max(-1, keepdims=True)
                probs = np.exp(scores)
                probs /= probs.sum(-1, keepdims=True)
                out[:, hd, :] = (probs @ v[:, kv, :].astype(np.float64)).astype(np.float32)
            attn = out.reshape(len(tokens), -1) @ w[p + "attn_output.weight"].T
            sa = self._norm(attn, w[p + "post_attention_norm.weight"]) + x
            f = self._norm(sa, w[p + "ffn_norm.weight"])
            gate, up = f @ w[p + "ffn_gate.weight"].T, f @ w[p + "ffn_up.weight"].T
            gelu = 0.5 * gate * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gate + 0.044715 * gate ** 3)))
            ff = (gelu * up) @ w[p + "ffn_down.weight"].T
            x = self._norm(ff, w[p + "post_ffw_norm.weight"]) + sa
        last = self._norm(x[-1:], w["output_norm.weight"])[0]
        # in float32 (a float64 copy of the 262K-row embedding took a second a call), then the softmax in float64
        logits = (w["token_embd.weight"] @ last).astype(np.float64)
        logits -= logits.max()
        return logits - np.log(np.exp(logits).sum())
