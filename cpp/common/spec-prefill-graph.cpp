#include "spec-prefill-graph.h"

#include "common.h"
#include "ggml-alloc.h"
#include "log.h"

#include <algorithm>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <vector>

struct common_spec_prefill_graph {
    ggml_backend_dev_t dev          = nullptr;
    ggml_backend_t     backend      = nullptr;
    ggml_gallocr_t     galloc_layer = nullptr; // the step's per-layer reductions
    ggml_gallocr_t     galloc_max   = nullptr; // the max over the step's layers

    int32_t n_cells     = 0;
    int32_t n_seq       = 0;
    int32_t n_layer     = 0;
    int32_t n_head      = 0;
    int32_t pool_kernel = 1;

    // state between a step's two graphs, in one device buffer; a step's layers take slots 0, 1, ...
    ggml_context *        ctx_state = nullptr;
    ggml_backend_buffer_t buf_state = nullptr;
    ggml_tensor * layer_max = nullptr; // [n_cells, n_seq, n_layer]: each layer's max over heads
    ggml_tensor * checks    = nullptr; // [n_head*n_seq, 3, n_layer]: each row's total, prompt and stray weight
    ggml_tensor * mask_norm = nullptr; // [n_cells, 1, 1, n_seq]: 1 on cells [0, n_norm)
    ggml_tensor * mask_span = nullptr; // [n_cells, 1, 1, n_seq]: 1 on the span's cells
    ggml_tensor * mask_past = nullptr; // [n_cells, 1, 1, n_seq]: 1 on cells >= n_filled

    std::vector<uint8_t> meta; // the graphs' tensor and node metadata
    std::vector<float>   host; // masks on their way up, checks on their way down
};

// nodes and tensors per layer of the step graph, with room to spare
static constexpr size_t SPEC_PREFILL_GRAPH_NODES_PER_LAYER = 48;

ggml_backend_dev_t common_spec_prefill_graph_device(const common_spec_prefill_graph * g) {
    return g->dev;
}

common_spec_prefill_graph * common_spec_prefill_graph_init(ggml_backend_dev_t dev, int32_t n_cells, int32_t n_seq,
        int32_t n_layer, int32_t n_head, int32_t pool_kernel, int32_t n_threads) {
    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    if (!backend) {
        return nullptr;
    }
    if (ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev)) {
        auto set_n_threads = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg,
                "ggml_backend_set_n_threads");
        if (set_n_threads) {
            set_n_threads(backend, n_threads);
        }
    }

    auto * g = new common_spec_prefill_graph;
    g->dev          = dev;
    g->backend      = backend;
    g->n_cells      = n_cells;
    g->n_seq        = n_seq;
    g->n_layer      = n_layer;
    g->n_head       = n_head;
    g->pool_kernel  = std::max(1, pool_kernel);
    g->galloc_layer = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
    g->galloc_max   = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));

    ggml_init_params ip = { 8*ggml_tensor_overhead(), nullptr, /*no_alloc =*/ true };
    g->ctx_state = ggml_init(ip);
    g->layer_max = ggml_new_tensor_3d(g->ctx_state, GGML_TYPE_F32, n_cells, n_seq, n_layer);
    g->checks    = ggml_new_tensor_3d(g->ctx_state, GGML_TYPE_F32, (int64_t) n_head*n_seq, 3, n_layer);
    g->mask_norm = ggml_new_tensor_4d(g->ctx_state, GGML_TYPE_F32, n_cells, 1, 1, n_seq);
    g->mask_span = ggml_new_tensor_4d(g->ctx_state, GGML_TYPE_F32, n_cells, 1, 1, n_seq);
    g->mask_past = ggml_new_tensor_4d(g->ctx_state, GGML_TYPE_F32, n_cells, 1, 1, n_seq);
    g->buf_state = ggml_backend_alloc_ctx_tensors(g->ctx_state, backend);
    if (!g->buf_state) {
        common_spec_prefill_graph_free(g);
        return nullptr;
    }
    const size_t n_nodes = SPEC_PREFILL_GRAPH_NODES_PER_LAYER*(size_t) n_layer + 16;
    g->meta.resize(n_nodes*ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false));
    return g;
}

void common_spec_prefill_graph_free(common_spec_prefill_graph * g) {
    if (!g) {
        return;
    }
    ggml_gallocr_free(g->galloc_layer);
    ggml_gallocr_free(g->galloc_max);
    ggml_backend_buffer_free(g->buf_state);
    ggml_free(g->ctx_state);
    ggml_backend_free(g->backend);
    delete g;
}

// the masks of this step's streams, and zeroed layer maxima and checks
static void spec_prefill_graph_upload(common_spec_prefill_graph * g, const common_spec_prefill_graph_stream * streams,
        int32_t n_stream) {
    const int64_t n = (int64_t) g->n_cells*g->n_seq;
    ggml_backend_buffer_clear(g->buf_state, 0);

    auto upload = [&](ggml_tensor * mask, auto && inside) {
        g->host.assign(n, 0.0f);
        for (int32_t s = 0; s < n_stream; ++s) {
            for (int32_t j = 0; j < g->n_cells; ++j) {
                g->host[(size_t) s*g->n_cells + j] = inside(streams[s], j) ? 1.0f : 0.0f;
            }
        }
        ggml_backend_tensor_set(mask, g->host.data(), 0, n*sizeof(float));
    };
    using stream = common_spec_prefill_graph_stream;
    upload(g->mask_norm, [](const stream & st, int32_t j) { return j < st.n_norm; });
    upload(g->mask_span, [](const stream & st, int32_t j) { return j >= st.key0 && j < st.key0 + st.n_keys; });
    upload(g->mask_past, [](const stream & st, int32_t j) { return j >= st.n_filled; });
}

// add one layer's reduction to gf: kq [n_kv, 1, n_head, n_stream], bound by the caller, into layer_max and checks at
// `slot`
static void spec_prefill_graph_build_layer(common_spec_prefill_graph * g, ggml_context * ctx, ggml_cgraph * gf,
        ggml_tensor * kq, int32_t slot) {
    const int64_t n_kv     = kq->ne[0];
    const int64_t n_head   = kq->ne[2];
    const int64_t n_stream = kq->ne[3];
    const int32_t kernel   = g->pool_kernel;

    auto mask = [&](ggml_tensor * m) {
        return ggml_view_4d(ctx, m, n_kv, 1, 1, n_stream, m->nb[1], m->nb[2], m->nb[3], 0);
    };

    ggml_tensor * prompt = ggml_mul(ctx, kq, mask(g->mask_norm));
    ggml_tensor * total  = ggml_sum_rows(ctx, kq);
    ggml_tensor * norm   = ggml_sum_rows(ctx, prompt);
    ggml_tensor * stray  = ggml_sum_rows(ctx, ggml_mul(ctx, kq, mask(g->mask_past)));

    // average over the kernel's cells inside the span: pool the masked row, and divide by the pooled mask, which
    // also undoes whatever a backend divides edge windows by
    ggml_tensor * span   = ggml_mul(ctx, kq, mask(g->mask_span));
    ggml_tensor * pooled = span;
    ggml_tensor * counts = nullptr;
    if (kernel > 1) {
        pooled = ggml_pool_2d(ctx, span, GGML_OP_POOL_AVG, kernel, 1, 1, 1, (float) (kernel/2), 0.0f);
        counts = ggml_pool_2d(ctx, ggml_cont(ctx, mask(g->mask_span)), GGML_OP_POOL_AVG, kernel, 1, 1, 1,
                (float) (kernel/2), 0.0f);
    }
    const int64_t n_out = pooled->ne[0]; // n_kv, or n_kv + 1 for an even kernel

    // a head with no weight on the prompt divides zeros by a tiny number: it adds nothing, as on the host
    ggml_tensor * renorm = ggml_div(ctx, pooled, ggml_clamp(ctx, norm, FLT_MIN, FLT_MAX));
    ggml_tensor * heads  = ggml_pool_2d(ctx, ggml_reshape_3d(ctx, renorm, n_out, n_head, n_stream), GGML_OP_POOL_MAX,
            1, (int) n_head, 1, (int) n_head, 0.0f, 0.0f); // [n_out, 1, n_stream]
    if (counts) {
        heads = ggml_div(ctx, heads, ggml_clamp(ctx, ggml_reshape_3d(ctx, counts, n_out, 1, n_stream), FLT_MIN, FLT_MAX));
    }
    // an even kernel pads k/2 on both sides; the reference's window for cell j starts at j - (k - 1)/2
    const size_t offset = (kernel > 1 && kernel % 2 == 0) ? sizeof(float) : 0;
    ggml_tensor * src = ggml_view_2d(ctx, heads, n_kv, n_stream, heads->nb[2], offset);
    ggml_tensor * dst = ggml_view_2d(ctx, g->layer_max, n_kv, n_stream, g->layer_max->nb[1], slot*g->layer_max->nb[2]);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, src, dst));

    // the rows' checks, read back after the step: kind c of row s*n_head + h at checks[:, c, slot]
    ggml_tensor * kinds[3] = { total, norm, stray };
    for (int c = 0; c < 3; ++c) {
        ggml_tensor * rows = ggml_view_1d(ctx, g->checks, n_head*n_stream, c*g->checks->nb[1] + slot*g->checks->nb[2]);
        ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_reshape_1d(ctx, kinds[c], n_head*n_stream), rows));
    }
}

static ggml_context * spec_prefill_graph_ctx(common_spec_prefill_graph * g) {
    ggml_init_params ip = { g->meta.size(), g->meta.data(), /*no_alloc =*/ true };
    return ggml_init(ip);
}

static ggml_cgraph * spec_prefill_graph_new(common_spec_prefill_graph * g, ggml_context * ctx) {
    return ggml_new_graph_custom(ctx, SPEC_PREFILL_GRAPH_NODES_PER_LAYER*(size_t) g->n_layer + 16, false);
}

common_spec_prefill_graph_status common_spec_prefill_graph_step(common_spec_prefill_graph * g,
        const common_spec_prefill_graph_stream * streams, int32_t n_stream, const ggml_tensor * const * kq,
        const int32_t * il, int32_t n_layers, float * out, std::string & error) {
    n_stream = std::min(n_stream, g->n_seq);
    std::fill(out, out + (size_t) n_stream*g->n_cells, 0.0f);
    if (n_layers <= 0) {
        return COMMON_SPEC_PREFILL_GRAPH_OK;
    }
    for (int32_t i = 0; i < n_layers; ++i) {
        const ggml_tensor * t = kq[i];
        if (t->type != GGML_TYPE_F32 || t->ne[1] != 1 || t->ne[3] != n_stream || !ggml_is_contiguous(t) ||
                t->ne[0] > g->n_cells || t->ne[2] > g->n_head || i >= g->n_layer || !t->buffer) {
            error = string_format("unexpected attention layout in layer %d: type %s, [%" PRId64 ", %" PRId64 ", %"
                    PRId64 ", %" PRId64 "] for %d sequences of %d cells, at most %d heads", il[i],
                    ggml_type_name(t->type), t->ne[0], t->ne[1], t->ne[2], t->ne[3], n_stream, g->n_cells, g->n_head);
            return COMMON_SPEC_PREFILL_GRAPH_BAD_WEIGHTS;
        }
    }
    spec_prefill_graph_upload(g, streams, n_stream);

    auto status = COMMON_SPEC_PREFILL_GRAPH_OK;
    auto fail = [&](common_spec_prefill_graph_status st, const std::string & why) {
        if (status == COMMON_SPEC_PREFILL_GRAPH_OK) {
            status = st;
            error  = why;
        }
    };

    // 1. every layer's reduction, in one graph; the weights stay where the draft's graph left them, bound as inputs.
    // (The allocator plans the graph's buffer from the first step and grows it when a longer one needs more.)
    ggml_context * ctx = spec_prefill_graph_ctx(g);
    ggml_cgraph * gf = spec_prefill_graph_new(g, ctx);
    for (int32_t i = 0; i < n_layers && status == COMMON_SPEC_PREFILL_GRAPH_OK; ++i) {
        ggml_tensor * weights = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, kq[i]->ne[0], 1, kq[i]->ne[2], n_stream);
        if (ggml_backend_tensor_alloc(kq[i]->buffer, weights, kq[i]->data) != GGML_STATUS_SUCCESS) {
            fail(COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED, "cannot bind the attention weights");
        }
        spec_prefill_graph_build_layer(g, ctx, gf, weights, i);
    }
    for (int i = 0; status == COMMON_SPEC_PREFILL_GRAPH_OK && i < ggml_graph_n_nodes(gf); ++i) {
        const ggml_tensor * node = ggml_graph_node(gf, i);
        if (!ggml_backend_supports_op(g->backend, node)) {
            fail(COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED, string_format("the %s backend cannot run %s",
                    ggml_backend_name(g->backend), ggml_op_desc(node)));
        }
    }
    if (status == COMMON_SPEC_PREFILL_GRAPH_OK && (!ggml_gallocr_alloc_graph(g->galloc_layer, gf) ||
            ggml_backend_graph_compute(g->backend, gf) != GGML_STATUS_SUCCESS)) {
        fail(COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED, string_format("the scoring graph failed on %s",
                ggml_backend_name(g->backend)));
    }
    ggml_free(ctx);

    // 2. the max over the layers, in a second graph, as it reads what the first one wrote
    ggml_tensor * result = nullptr;
    if (status == COMMON_SPEC_PREFILL_GRAPH_OK) {
        ctx = spec_prefill_graph_ctx(g);
        ggml_tensor * layers = ggml_view_3d(ctx, g->layer_max, g->n_cells, n_stream, n_layers, g->layer_max->nb[1],
                g->layer_max->nb[2], 0);
        // [n_cells, n_layers, n_stream], then the max over the layers
        ggml_tensor * by_seq = ggml_cont(ctx, ggml_permute(ctx, layers, 0, 2, 1, 3));
        result = ggml_pool_2d(ctx, by_seq, GGML_OP_POOL_MAX, 1, n_layers, 1, n_layers, 0.0f, 0.0f);
        ggml_set_output(result);
        ggml_cgraph * gf_max = ggml_new_graph_custom(ctx, 16, false);
        ggml_build_forward_expand(gf_max, result);
        if (!ggml_gallocr_alloc_graph(g->galloc_max, gf_max) ||
                ggml_backend_graph_compute(g->backend, gf_max) != GGML_STATUS_SUCCESS) {
            fail(COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED, string_format("the scoring graph failed on %s",
                    ggml_backend_name(g->backend)));
        }
    }

    if (status == COMMON_SPEC_PREFILL_GRAPH_OK) {
        const size_t n_checks = (size_t) g->checks->ne[0]*3*n_layers;
        g->host.resize(n_checks);
        ggml_backend_tensor_get(g->checks, g->host.data(), 0, n_checks*sizeof(float));
        for (int32_t i = 0; i < n_layers && status == COMMON_SPEC_PREFILL_GRAPH_OK; ++i) {
            const int64_t n_head = kq[i]->ne[2];
            const int64_t n_kv   = kq[i]->ne[0];
            const float * rows   = g->host.data() + (size_t) i*3*g->checks->ne[0];
            for (int64_t r = 0; r < n_head*n_stream && status == COMMON_SPEC_PREFILL_GRAPH_OK; ++r) {
                const int64_t s     = r / n_head;
                const float   total = rows[r];
                const float   norm  = rows[g->checks->ne[0] + r];
                const float   stray = rows[2*g->checks->ne[0] + r];
                if (!streams[s].active) {
                    continue;
                }
                if (stray != 0.0f) {
                    fail(COMMON_SPEC_PREFILL_GRAPH_BAD_WEIGHTS, string_format("layer %d, sequence %" PRId64 ", head %"
                            PRId64 ": attention %g on KV cells past the sequence's %d of %" PRId64 " cells (cells do "
                            "not map to positions)", il[i], s, r % n_head, stray, streams[s].n_filled, n_kv));
                } else if (!(total > 0.0f) || !std::isfinite(total) || !std::isfinite(norm)) {
                    fail(COMMON_SPEC_PREFILL_GRAPH_BAD_WEIGHTS, string_format("layer %d, sequence %" PRId64 ", head %"
                            PRId64 ": empty or non-finite attention row (weight %g, %g of it on the prompt's %d "
                            "cells)", il[i], s, r % n_head, total, norm, streams[s].n_norm));
                }
            }
        }
    }
    if (status == COMMON_SPEC_PREFILL_GRAPH_OK) {
        ggml_backend_tensor_get(result, out, 0, (size_t) n_stream*g->n_cells*sizeof(float));
    }
    if (result) {
        ggml_free(ctx);
    }
    return status;
}
