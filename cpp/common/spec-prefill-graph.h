#pragma once

// Speculative prefill scoring where the attention weights are: the per-layer part of common_spec_prefill_scores
// (spec-prefill-select.h: renormalise each head's row over the prompt's keys, average-pool it along its span, max over
// heads and layers) as a small ggml graph on the backend that computed the weights. A query step then brings back one
// value per KV cell and sequence, instead of n_head x n_layer of them.
//
// spec-prefill-select.cpp stays the reference: the driver can score on the host instead
// (LLAMA_SPEC_PREFILL_SCORING=host), and the tests compare the two.
//
//   g = common_spec_prefill_graph_init(dev, n_cells, n_seq, n_layer, n_head, pool_kernel, n_threads, group_bytes);
//   per query step, once the draft's decode is done (its kq_soft_max tensors stay valid until its next decode):
//       common_spec_prefill_graph_step(g, streams, n_stream, kq, il, n, out, error);  // out[s*n_cells + j]
//
// A step is one graph and one wait for the device. Its layers are copied side by side into groups of at most
// group_bytes of weights, each reduced by a fixed handful of ops, so the ops a backend dispatches grow with the
// groups, not with the layers.

#include "ggml.h"
#include "ggml-backend.h"

#include <cstdint>
#include <string>

struct common_spec_prefill_graph_stream {
    int32_t key0;     // first cell of the span that is scored
    int32_t n_keys;   // cells in the span
    int32_t n_norm;   // rows are renormalised over cells [0, n_norm)
    int32_t n_filled; // cells the sequence has filled: weights on cells >= n_filled mean cell j is not position j
    bool    active;   // false: the sequence's rows are computed but neither checked nor used (it hit end of generation)
};

struct common_spec_prefill_graph;

// for attention weights held in buffers of `dev`; n_cells: cells per sequence (no layer's n_kv exceeds it); n_head:
// the most heads a layer has; group_bytes: the most weights reduced at once (the graph's memory is a few times
// that); nullptr if the device has no backend
struct common_spec_prefill_graph * common_spec_prefill_graph_init(ggml_backend_dev_t dev, int32_t n_cells,
        int32_t n_seq, int32_t n_layer, int32_t n_head, int32_t pool_kernel, int32_t n_threads, size_t group_bytes);

void common_spec_prefill_graph_free(struct common_spec_prefill_graph * g);

ggml_backend_dev_t common_spec_prefill_graph_device(const struct common_spec_prefill_graph * g);

enum common_spec_prefill_graph_status {
    COMMON_SPEC_PREFILL_GRAPH_OK,
    COMMON_SPEC_PREFILL_GRAPH_BAD_WEIGHTS, // unexpected layout, an empty row, weights past a sequence's cells
    COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED, // the backend lacks an op or memory: score on the host instead
};

// one query step of n_stream sequences (n_stream <= n_seq), one query row each: kq[i] holds layer il[i]'s attention
// weights, [n_kv, 1, n_head, n_stream] in a buffer of the graph's device. out[s*n_cells + j], for cell j of sequence s,
// gets the max over those layers of each layer's max over heads (zero outside the spans). As on the host, a head that
// gives the prompt's cells no weight at all (all of it on the lookahead tokens) adds nothing; a row with no weight
// anywhere, non-finite weights or weight past a sequence's filled cells fail the step, and `error` says where.
enum common_spec_prefill_graph_status common_spec_prefill_graph_step(struct common_spec_prefill_graph * g,
        const struct common_spec_prefill_graph_stream * streams, int32_t n_stream, const struct ggml_tensor * const * kq,
        const int32_t * il, int32_t n_layers, float * out, std::string & error);
