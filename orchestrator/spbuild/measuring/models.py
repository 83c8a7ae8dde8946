"""Random-weight GGUF models for benchmarks and tests, written with the fetched tree's own gguf-py.

Plain llama models of named shapes (the benchmarks' target and draft), and the models speculative decoding needs:
a target with an MTP head (Qwen3.5 with a nextn layer), EAGLE3, DFlash and DSpark drafts for a llama target. All
carry the llama-bpe vocabulary, so a prefill draft of another shape can score their prompts. Tensor names and shapes
follow the pin's loaders (src/models/{qwen35,eagle3,dflash}.cpp); a layout that does not match fails loudly when
the real binary loads the file. Weight values do not change the cost of a forward pass.

Needs only NumPy and gguf-py, so it also runs on a GPU machine that has nothing else (bench.py make-model).
"""

from __future__ import annotations

import functools

import sys
from pathlib import Path
from typing import Any

# llama-architecture shapes: the target and draft sizes measured in docs/benchmarks.md, and a tiny one for testing
SHAPES: dict[str, dict[str, int]] = {
    "8b": {"n_embd": 4096, "n_layer": 32, "n_head": 32, "n_head_kv": 8, "n_ff": 14336},
    "1.5b": {"n_embd": 2048, "n_layer": 16, "n_head": 32, "n_head_kv": 8, "n_ff": 8192},
    "tiny": {"n_embd": 256, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 512},
    # for tests of scoring with the first layers: enough layers to stop after any of three
    "tiny-deep": {"n_embd": 256, "n_layer": 4, "n_head": 4, "n_head_kv": 2, "n_ff": 512},
    # for tests: with sharp attention, a token attends almost only to itself (see make_model)
    "sharp": {"n_embd": 256, "n_layer": 1, "n_head": 4, "n_head_kv": 4, "n_ff": 256},
}

# the kinds `make` writes; a draft kind is shaped for a llama target of the given shape
KINDS = ("llama", "mtp-target", "eagle3", "dflash", "dspark")

# DFlash/DSpark: tokens drafted per block, and the rank of DSpark's Markov head
DFLASH_BLOCK_SIZE = 4
DSPARK_MARKOV_RANK = 32


def _gguf(tree: Path):
    sys.path.insert(0, str(tree / "gguf-py"))
    import gguf  # noqa: PLC0415 - from the fetched llama.cpp tree, not an installed copy

    return gguf


@functools.cache
def _tokenizer_fields(tree: Path) -> tuple[tuple[str, Any, Any, Any], ...]:
    """The llama-bpe vocabulary's tokenizer fields (key, contents, type, element type), read once per process: gguf-py
    takes about 10 s to parse its 400,000 strings, most of a tiny model's making."""
    vocab = _gguf(tree).GGUFReader(str(tree / "models" / "ggml-vocab-llama-bpe.gguf"))
    return tuple((key, field.contents(), field.types[0], field.types[1] if len(field.types) > 1 else None)
                 for key, field in vocab.fields.items() if key.startswith("tokenizer."))


class _Model:
    """A GGUF being written: the llama-bpe vocabulary, common hyperparameters, and random F16 weights drawn from one
    pool (norms are ones, in F32)."""

    def __init__(self, tree: Path, out: Path, arch: str, name: str, n_ctx_train: int, seed: int,
                 nan_weights: bool = False, mask_token: bool = False, f32: bool = False) -> None:
        import numpy as np

        self.np = np
        self.gguf = _gguf(tree)
        self.writer = self.gguf.GGUFWriter(str(out), arch)
        self.writer.add_name(name)
        self.writer.add_context_length(n_ctx_train)
        self.writer.add_layer_norm_rms_eps(1e-5)
        self.writer.add_file_type(self.gguf.LlamaFileType.ALL_F32 if f32 else self.gguf.LlamaFileType.MOSTLY_F16)
        tokenizer = _tokenizer_fields(tree)
        self.n_vocab = len(next(values for key, values, _, _ in tokenizer if key == "tokenizer.ggml.tokens"))
        self.writer.add_vocab_size(self.n_vocab)
        for key, values, kind, sub in tokenizer:
            self.writer.add_key_value(key, values, kind, sub)
        if mask_token:
            # DFlash denoises a block of mask tokens; llama-bpe reserves special tokens from 128002 on
            self.writer.add_mask_token_id(128002)
        self.offset = 0  # where the next tensor starts in the pool
        rng = np.random.default_rng(seed)
        # an odd length, so no two rows of a matrix repeat the same values (tied logits make greedy decoding depend
        # on how ties are broken, which differs between a batch of drafted tokens and one token at a time)
        self.dtype = np.float32 if f32 else np.float16
        self.pool = (rng.standard_normal((1 << 22) + 1) * 0.02).astype(self.dtype)
        if nan_weights:
            self.pool[:] = np.nan

    def weight(self, name: str, *ne: int, scale: float = 1.0) -> None:
        """A random tensor (F16, or F32 for an F32 model) with llama.cpp's dimensions ne (fastest first, as the loaders write them)."""
        # each tensor starts elsewhere in the pool: the output head must not repeat the token embeddings (a tied head
        # that echoes the input token is a fixed point of greedy decoding)
        self.offset = (self.offset + 1_000_003) % len(self.pool)
        values = self.np.resize(self.np.roll(self.pool, -self.offset), tuple(reversed(ne)))
        self.writer.add_tensor(name, values * self.dtype(scale) if scale != 1.0 else values)

    def shape(self, shape: dict[str, int], n_block: int) -> None:
        """The hyperparameters every architecture here shares: a SHAPES entry, with n_block blocks."""
        self.writer.add_embedding_length(shape["n_embd"])
        self.writer.add_block_count(n_block)
        self.writer.add_feed_forward_length(shape["n_ff"])
        self.writer.add_head_count(shape["n_head"])
        self.writer.add_head_count_kv(shape["n_head_kv"])

    def ones(self, name: str, n: int) -> None:
        self.writer.add_tensor(name, self.np.ones(n, dtype=self.np.float32))

    def f32(self, name: str, values: Any) -> None:
        self.writer.add_tensor(name, self.np.asarray(values, dtype=self.np.float32))

    def attention(self, p: str, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_q: int | None = None,
                  n_in: int | None = None, qk_scale: float = 1.0) -> None:
        n_in = n_in or n_embd
        self.weight(p + "attn_q.weight", n_in, n_q or n_head * head_dim, scale=qk_scale)
        self.weight(p + "attn_k.weight", n_in, n_head_kv * head_dim, scale=qk_scale)
        self.weight(p + "attn_v.weight", n_in, n_head_kv * head_dim)
        self.weight(p + "attn_output.weight", n_head * head_dim, n_embd)

    def ffn(self, p: str, n_embd: int, n_ff: int) -> None:
        self.ones(p + "ffn_norm.weight", n_embd)
        self.weight(p + "ffn_gate.weight", n_embd, n_ff)
        self.weight(p + "ffn_up.weight", n_embd, n_ff)
        self.weight(p + "ffn_down.weight", n_ff, n_embd)

    def head(self, n_embd: int) -> None:
        self.weight("token_embd.weight", n_embd, self.n_vocab)
        self.ones("output_norm.weight", n_embd)
        # logits spread wide enough that the greedy choice does not flip with rounding
        self.weight("output.weight", n_embd, self.n_vocab, scale=8.0)

    def close(self) -> None:
        self.writer.write_header_to_file()
        self.writer.write_kv_data_to_file()
        self.writer.write_tensors_to_file()
        self.writer.close()


def make_model(tree: Path, shape: str, out: Path, n_ctx_train: int = 131072, seed: int = 0,
               sharp_attention: bool = False, nan_weights: bool = False, qk_scale: float = 1.0,
               f32: bool = False) -> Path:
    """A llama-architecture GGUF of `shape`. sharp_attention makes the query and key projections a large multiple of
    the identity (the shape needs n_head == n_head_kv): each token's attention then sits almost only on itself, so a
    lookahead token's row can give the prompt exactly zero weight, a case the scoring must handle. nan_weights makes
    every weight NaN: a draft whose attention rows are not finite, so that scoring fails for real."""
    s = SHAPES[shape]
    n_embd, head_dim = s["n_embd"], s["n_embd"] // s["n_head"]
    m = _Model(tree, out, "llama", f"random-{shape}", n_ctx_train, seed, nan_weights, f32=f32)
    m.shape(s, s["n_layer"])
    m.writer.add_rope_dimension_count(head_dim)
    m.writer.add_rope_freq_base(500000.0)
    m.head(n_embd)
    for il in range(s["n_layer"]):
        p = f"blk.{il}."
        m.ones(p + "attn_norm.weight", n_embd)
        if sharp_attention:
            assert s["n_head_kv"] == s["n_head"], "sharp attention needs as many KV heads as heads"
            sharp = (m.np.eye(n_embd) * 8.0).astype(m.np.float16)
            m.writer.add_tensor(p + "attn_q.weight", sharp)
            m.writer.add_tensor(p + "attn_k.weight", sharp)
            m.weight(p + "attn_v.weight", n_embd, n_embd)
            m.weight(p + "attn_output.weight", n_embd, n_embd)
        else:
            m.attention(p, n_embd, s["n_head"], s["n_head_kv"], head_dim, qk_scale=qk_scale)
        m.ffn(p, n_embd, s["n_ff"])
    m.close()
    return out


def make_mtp_target(tree: Path, shape: str, out: Path, n_ctx_train: int = 32768, seed: int = 0) -> Path:
    """A Qwen3.5 (hybrid: gated delta net and attention layers, M-RoPE) target of `shape` with one MTP (nextn) layer
    after its trunk, the layout `--spec-type draft-mtp` drafts with."""
    s = SHAPES[shape]
    n_embd, n_head, n_head_kv, n_ff = s["n_embd"], s["n_head"], s["n_head_kv"], s["n_ff"]
    n_trunk = s["n_layer"]
    head_dim = n_embd // n_head
    interval = 2 if n_trunk < 4 else 4  # every interval-th trunk layer is full attention, the others recurrent
    d_state, n_v_heads, n_k_heads, d_conv = 128, n_head, n_head_kv, 4
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads

    m = _Model(tree, out, "qwen35", f"random-{shape}-mtp", n_ctx_train, seed)
    w = m.writer
    m.shape(s, n_trunk + 1)
    w.add_uint32("qwen35.nextn_predict_layers", 1)
    w.add_rope_freq_base(10000000.0)
    w.add_array("qwen35.rope.dimension_sections", [head_dim // 4] * 4)
    w.add_uint32("qwen35.full_attention_interval", interval)
    w.add_uint32("qwen35.ssm.conv_kernel", d_conv)
    w.add_uint32("qwen35.ssm.inner_size", value_dim)
    w.add_uint32("qwen35.ssm.state_size", d_state)
    w.add_uint32("qwen35.ssm.time_step_rank", n_v_heads)
    w.add_uint32("qwen35.ssm.group_count", n_k_heads)
    m.head(n_embd)

    def full_attention(p: str) -> None:
        m.ones(p + "attn_norm.weight", n_embd)
        m.ones(p + "post_attention_norm.weight", n_embd)
        m.attention(p, n_embd, n_head, n_head_kv, head_dim, n_q=2 * n_head * head_dim)  # queries and their gates
        m.ones(p + "attn_q_norm.weight", head_dim)
        m.ones(p + "attn_k_norm.weight", head_dim)

    for il in range(n_trunk):
        p = f"blk.{il}."
        if (il + 1) % interval == 0:
            full_attention(p)
        else:
            m.ones(p + "attn_norm.weight", n_embd)
            m.ones(p + "post_attention_norm.weight", n_embd)
            m.weight(p + "attn_qkv.weight", n_embd, 2 * key_dim + value_dim)
            m.weight(p + "attn_gate.weight", n_embd, value_dim)
            m.f32(p + "ssm_conv1d.weight", m.np.resize(m.pool, (2 * key_dim + value_dim, d_conv)))
            m.f32(p + "ssm_dt.bias", m.np.zeros(n_v_heads))
            m.f32(p + "ssm_a", -m.np.ones(n_v_heads))  # state decay: must be negative
            m.weight(p + "ssm_beta.weight", n_embd, n_v_heads)
            m.weight(p + "ssm_alpha.weight", n_embd, n_v_heads)
            m.ones(p + "ssm_norm.weight", d_state)
            m.weight(p + "ssm_out.weight", value_dim, n_embd)
        _qwen35_ffn(m, p, n_embd, n_ff)
    p = f"blk.{n_trunk}."
    full_attention(p)
    _qwen35_ffn(m, p, n_embd, n_ff)
    m.weight(p + "nextn.eh_proj.weight", 2 * n_embd, n_embd)
    m.ones(p + "nextn.enorm.weight", n_embd)
    m.ones(p + "nextn.hnorm.weight", n_embd)
    m.close()
    return out


def _qwen35_ffn(m: _Model, p: str, n_embd: int, n_ff: int) -> None:
    # Qwen3.5's post_attention_norm is its FFN input norm: no ffn_norm tensor
    m.weight(p + "ffn_gate.weight", n_embd, n_ff)
    m.weight(p + "ffn_up.weight", n_embd, n_ff)
    m.weight(p + "ffn_down.weight", n_ff, n_embd)


def make_eagle3_draft(tree: Path, target_shape: str, out: Path, n_ctx_train: int = 32768, seed: int = 2) -> Path:
    """An EAGLE3 draft (one decoder layer over the fused hidden states of three target layers) for a llama target of
    `target_shape`: the first layer's input, the last layer's input, and the output (id n_layer)."""
    s = SHAPES[target_shape]
    n_embd, n_head, n_head_kv, n_ff = s["n_embd"], s["n_head"], s["n_head_kv"], s["n_ff"]
    head_dim = n_embd // n_head
    layers = [0, s["n_layer"] - 1, s["n_layer"]]
    m = _Model(tree, out, "eagle3", f"random-eagle3-for-{target_shape}", n_ctx_train, seed)
    m.shape(s, 1)
    w = m.writer
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_array("eagle3.target_layers", layers)
    w.add_uint32("eagle3.target_hidden_size", n_embd)
    m.head(n_embd)
    m.weight("fc.weight", len(layers) * n_embd, n_embd)
    p = "blk.0."
    m.ones(p + "attn_norm.weight", n_embd)
    m.ones(p + "attn_norm_2.weight", n_embd)
    m.attention(p, n_embd, n_head, n_head_kv, head_dim, n_in=2 * n_embd)  # token embedding beside the fused features
    m.ffn(p, n_embd, n_ff)
    m.close()
    return out


def make_dflash_draft(tree: Path, target_shape: str, out: Path, dspark: bool = False, n_ctx_train: int = 32768,
                      seed: int = 3) -> Path:
    """A DFlash draft (block denoising over the target's hidden states of every layer) for a llama target of
    `target_shape`; with `dspark`, a DSpark draft: the same plus a Markov head and a confidence head."""
    s = SHAPES[target_shape]
    n_embd, n_head, n_head_kv, n_ff = s["n_embd"], s["n_head"], s["n_head_kv"], s["n_ff"]
    head_dim = n_embd // n_head
    layers = list(range(s["n_layer"]))
    kind = "dspark" if dspark else "dflash"
    m = _Model(tree, out, "dflash", f"random-{kind}-for-{target_shape}", n_ctx_train, seed, mask_token=True)
    m.shape(s, 1)
    w = m.writer
    w.add_rope_freq_base(1000000.0)
    w.add_array("dflash.target_layers", layers)
    w.add_uint32("dflash.block_size", DFLASH_BLOCK_SIZE)
    m.head(n_embd)
    m.weight("fc.weight", len(layers) * n_embd, n_embd)
    m.ones("enc.output_norm.weight", n_embd)
    if dspark:
        m.weight("markov_w1.weight", DSPARK_MARKOV_RANK, m.n_vocab)
        m.weight("markov_w2.weight", DSPARK_MARKOV_RANK, m.n_vocab)
        m.weight("conf_proj.weight", n_embd + DSPARK_MARKOV_RANK, 1)
        m.f32("conf_proj.bias", [0.0])
    p = "blk.0."
    m.ones(p + "attn_norm.weight", n_embd)
    m.attention(p, n_embd, n_head, n_head_kv, head_dim)
    m.ones(p + "attn_q_norm.weight", head_dim)
    m.ones(p + "attn_k_norm.weight", head_dim)
    m.ffn(p, n_embd, n_ff)
    m.close()
    return out


def make(tree: Path, kind: str, shape: str, out: Path, n_ctx_train: int) -> Path:
    """One model of `kind` (see KINDS); for the draft kinds, `shape` is the llama target's."""
    if kind == "llama":
        return make_model(tree, shape, out, n_ctx_train)
    if kind == "mtp-target":
        return make_mtp_target(tree, shape, out, n_ctx_train)
    if kind == "eagle3":
        return make_eagle3_draft(tree, shape, out, n_ctx_train)
    if kind in ("dflash", "dspark"):
        return make_dflash_draft(tree, shape, out, dspark=kind == "dspark", n_ctx_train=n_ctx_train)
    raise ValueError(f"unknown model kind {kind!r}: use one of {', '.join(KINDS)}")
