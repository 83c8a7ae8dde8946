#pragma once

// Speculative prefill scoring where the attention weights are: the per-layer part of common_spec_prefill_scores
// (spec-prefill-select.h: renormalise each head's row over the prompt's keys, average-pool it along its span, max over
// heads and layers) as a small ggml graph on the backend that computed the weights. A query step then brings back one
// value per KV cell and sequence, instead of n_head x n_layer of them.
//
// spec-prefill-select.cpp stays the reference: the driver can score on the host instead
// (LLAMA_SPEC_PREFILL_SCORING=host), and the tests compare the two.
//
//   g = common_spec_prefill_graph_init(dev, n_cells, n_seq, n_layer, pool_kernel, n_threads);
//   per query step:
//       common_spec_prefill_graph_begin_step(g, streams, n_stream);
//       common_spec_prefill_graph_add_layer(g, kq_soft_max, il, error);  // from the eval callback, per usable layer
//       common_spec_prefill_graph_end_step(g, out);                      // out[s*n_cells + j]

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

// for attention weights held in buffers of `dev`; n_cells: cells per sequence (no layer's n_kv exceeds it);
// nullptr if the device has no backend
struct common_spec_prefill_graph * common_spec_prefill_graph_init(ggml_backend_dev_t dev, int32_t n_cells,
        int32_t n_seq, int32_t n_layer, int32_t pool_kernel, int32_t n_threads);

void common_spec_prefill_graph_free(struct common_spec_prefill_graph * g);

ggml_backend_dev_t common_spec_prefill_graph_device(const struct common_spec_prefill_graph * g);

// start a query step for n_stream sequences (n_stream <= n_seq), one query row each
void common_spec_prefill_graph_begin_step(struct common_spec_prefill_graph * g,
        const struct common_spec_prefill_graph_stream * streams, int32_t n_stream);

enum common_spec_prefill_graph_status {
    COMMON_SPEC_PREFILL_GRAPH_OK,
    COMMON_SPEC_PREFILL_GRAPH_BAD_WEIGHTS, // unexpected layout, an empty row, weights past a sequence's cells
    COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED, // the backend lacks an op or memory: score on the host instead
};

// fold layer il's attention weights, kq [n_kv, 1, n_head, n_stream] in a buffer of the graph's device, into the step;
// on failure `error` says why. As on the host, a head that gives the prompt's cells no weight at all (all of it on
// the lookahead tokens) adds nothing; a row with no weight anywhere is an error.
enum common_spec_prefill_graph_status common_spec_prefill_graph_add_layer(struct common_spec_prefill_graph * g,
        const struct ggml_tensor * kq, int32_t il, std::string & error);

// the step's maxima over the added layers, out[s*n_cells + j] for cell j of sequence s (zero outside the spans and
// when no layer was added); returns the number of layers added in this step, or -1 on a backend failure
int32_t common_spec_prefill_graph_end_step(struct common_spec_prefill_graph * g, float * out);
