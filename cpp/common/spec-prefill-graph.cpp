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
    ggml_backend_dev_t dev     = nullptr;
    ggml_backend_t     backend = nullptr;
    ggml_gallocr_t     galloc  = nullptr;

    int32_t n_cells     = 0;
    int32_t n_seq       = 0;
    int32_t n_layer     = 0;
    int32_t pool_kernel = 1;

    // state that lives across a step's graphs, in one device buffer
    ggml_context *        ctx_state = nullptr;
    ggml_backend_buffer_t buf_state = nullptr;
    ggml_tensor * layer_max = nullptr; // [n_cells, n_seq, n_layer]: each added layer's max over heads
    ggml_tensor * mask_norm = nullptr; // [n_cells, 1, 1, n_seq]: 1 on cells [0, n_norm)
    ggml_tensor * mask_span = nullptr; // [n_cells, 1, 1, n_seq]: 1 on the span's cells
    ggml_tensor * mask_past = nullptr; // [n_cells, 1, 1, n_seq]: 1 on cells >= n_filled

    std::vector<common_spec_prefill_graph_stream> streams;
    bool    masks_stale = true;
    int32_t n_added     = 0; // layers added in this step
    int64_t n_reserved_head = -1;

    std::vector<uint8_t> meta; // the graphs' tensor and node metadata
    std::vector<float>   host; // masks on their way up, checks on their way down
};

ggml_backend_dev_t common_spec_prefill_graph_device(const common_spec_prefill_graph * g) {
    return g->dev;
}

common_spec_prefill_graph * common_spec_prefill_graph_init(ggml_backend_dev_t dev, int32_t n_cells, int32_t n_seq,
        int32_t n_layer, int32_t pool_kernel, int32_t n_threads) {
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
    g->dev         = dev;
    g->backend     = backend;
    g->n_cells     = n_cells;
    g->n_seq       = n_seq;
    g->n_layer     = n_layer;
    g->pool_kernel = std::max(1, pool_kernel);
    g->galloc      = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));

    ggml_init_params ip = { 8*ggml_tensor_overhead(), nullptr, /*no_alloc =*/ true };
    g->ctx_state = ggml_init(ip);
    g->layer_max = ggml_new_tensor_3d(g->ctx_state, GGML_TYPE_F32, n_cells, n_seq, n_layer);
    g->mask_norm = ggml_new_tensor_4d(g->ctx_state, GGML_TYPE_F32, n_cells, 1, 1, n_seq);
    g->mask_span = ggml_new_tensor_4d(g->ctx_state, GGML_TYPE_F32, n_cells, 1, 1, n_seq);
    g->mask_past = ggml_new_tensor_4d(g->ctx_state, GGML_TYPE_F32, n_cells, 1, 1, n_seq);
    g->buf_state = ggml_backend_alloc_ctx_tensors(g->ctx_state, backend);
    if (!g->buf_state) {
        common_spec_prefill_graph_free(g);
        return nullptr;
    }
    g->meta.resize(64*ggml_tensor_overhead() + ggml_graph_overhead());
    return g;
}

void common_spec_prefill_graph_free(common_spec_prefill_graph * g) {
    if (!g) {
        return;
    }
    ggml_gallocr_free(g->galloc);
    ggml_backend_buffer_free(g->buf_state);
    ggml_free(g->ctx_state);
    ggml_backend_free(g->backend);
    delete g;
}

void common_spec_prefill_graph_begin_step(common_spec_prefill_graph * g,
        const common_spec_prefill_graph_stream * streams, int32_t n_stream) {
    g->streams.assign(streams, streams + std::min(n_stream, g->n_seq));
    g->masks_stale = true;
    g->n_added     = 0;
}

// the masks of this step's streams, and a zeroed layer_max
static void spec_prefill_graph_upload(common_spec_prefill_graph * g) {
    const int64_t n = (int64_t) g->n_cells*g->n_seq;
    ggml_backend_buffer_clear(g->buf_state, 0);

    auto upload = [&](ggml_tensor * mask, auto && inside) {
        g->host.assign(n, 0.0f);
        for (size_t s = 0; s < g->streams.size(); ++s) {
            for (int32_t j = 0; j < g->n_cells; ++j) {
                g->host[s*g->n_cells + j] = inside(g->streams[s], j) ? 1.0f : 0.0f;
            }
        }
        ggml_backend_tensor_set(mask, g->host.data(), 0, n*sizeof(float));
    };
    using stream = common_spec_prefill_graph_stream;
    upload(g->mask_norm, [](const stream & st, int32_t j) { return j < st.n_norm; });
    upload(g->mask_span, [](const stream & st, int32_t j) { return j >= st.key0 && j < st.key0 + st.n_keys; });
    upload(g->mask_past, [](const stream & st, int32_t j) { return j >= st.n_filled; });
    g->masks_stale = false;
}

struct spec_prefill_layer_graph {
    ggml_cgraph * gf    = nullptr;
    ggml_tensor * total = nullptr; // [1, 1, n_head, n_stream] each row's weight, all cells
    ggml_tensor * norm  = nullptr; // [1, 1, n_head, n_stream] each row's weight on the prompt's keys
    ggml_tensor * stray = nullptr; // [1, 1, n_head, n_stream] each row's weight past the filled cells
};

// kq: [n_kv, 1, n_head, n_stream]; its data is bound by the caller (or left unallocated to reserve memory)
static spec_prefill_layer_graph spec_prefill_graph_build(common_spec_prefill_graph * g, ggml_context * ctx,
        ggml_tensor * kq, int32_t il) {
    const int64_t n_kv     = kq->ne[0];
    const int64_t n_head   = kq->ne[2];
    const int64_t n_stream = kq->ne[3];
    const int32_t kernel   = g->pool_kernel;

    auto mask = [&](ggml_tensor * m) {
        return ggml_view_4d(ctx, m, n_kv, 1, 1, n_stream, m->nb[1], m->nb[2], m->nb[3], 0);
    };

    spec_prefill_layer_graph lg;
    lg.gf = ggml_new_graph_custom(ctx, 64, false);

    ggml_tensor * prompt = ggml_mul(ctx, kq, mask(g->mask_norm));
    lg.total = ggml_sum_rows(ctx, kq);
    lg.norm  = ggml_sum_rows(ctx, prompt);
    lg.stray = ggml_sum_rows(ctx, ggml_mul(ctx, kq, mask(g->mask_past)));

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
    ggml_tensor * renorm = ggml_div(ctx, pooled, ggml_clamp(ctx, lg.norm, FLT_MIN, FLT_MAX));
    ggml_tensor * heads  = ggml_pool_2d(ctx, ggml_reshape_3d(ctx, renorm, n_out, n_head, n_stream), GGML_OP_POOL_MAX,
            1, (int) n_head, 1, (int) n_head, 0.0f, 0.0f); // [n_out, 1, n_stream]
    if (counts) {
        heads = ggml_div(ctx, heads, ggml_clamp(ctx, ggml_reshape_3d(ctx, counts, n_out, 1, n_stream), FLT_MIN, FLT_MAX));
    }
    // an even kernel pads k/2 on both sides; the reference's window for cell j starts at j - (k - 1)/2
    const size_t offset = (kernel > 1 && kernel % 2 == 0) ? sizeof(float) : 0;
    ggml_tensor * src = ggml_view_2d(ctx, heads, n_kv, n_stream, heads->nb[2], offset);
    ggml_tensor * dst = ggml_view_2d(ctx, g->layer_max, n_kv, n_stream, g->layer_max->nb[1], il*g->layer_max->nb[2]);

    ggml_set_output(lg.total);
    ggml_set_output(lg.norm);
    ggml_set_output(lg.stray);
    ggml_build_forward_expand(lg.gf, lg.total);
    ggml_build_forward_expand(lg.gf, lg.norm);
    ggml_build_forward_expand(lg.gf, lg.stray);
    ggml_build_forward_expand(lg.gf, ggml_cpy(ctx, src, dst));
    return lg;
}

static ggml_context * spec_prefill_graph_ctx(common_spec_prefill_graph * g) {
    ggml_init_params ip = { g->meta.size(), g->meta.data(), /*no_alloc =*/ true };
    return ggml_init(ip);
}

common_spec_prefill_graph_status common_spec_prefill_graph_add_layer(common_spec_prefill_graph * g,
        const ggml_tensor * kq, int32_t il, std::string & error) {
    const int64_t n_kv     = kq->ne[0];
    const int64_t n_head   = kq->ne[2];
    const int64_t n_stream = kq->ne[3];
    if (kq->type != GGML_TYPE_F32 || kq->ne[1] != 1 || n_stream != (int64_t) g->streams.size() ||
            !ggml_is_contiguous(kq) || n_kv > g->n_cells || il < 0 || il >= g->n_layer) {
        error = string_format("unexpected attention layout in layer %d: type %s, [%" PRId64 ", %" PRId64 ", %" PRId64
                ", %" PRId64 "] for %zu sequences of %d cells", il, ggml_type_name(kq->type), n_kv, kq->ne[1], n_head,
                n_stream, g->streams.size(), g->n_cells);
        return COMMON_SPEC_PREFILL_GRAPH_BAD_WEIGHTS;
    }
    if (g->masks_stale) {
        spec_prefill_graph_upload(g);
    }

    // size the compute buffer once, for the largest n_kv this context can have
    if (n_head != g->n_reserved_head) {
        ggml_context * ctx = spec_prefill_graph_ctx(g);
        ggml_tensor * kq_max = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, g->n_cells, 1, n_head, g->n_seq);
        const bool ok = ggml_gallocr_reserve(g->galloc, spec_prefill_graph_build(g, ctx, kq_max, 0).gf);
        ggml_free(ctx);
        if (!ok) {
            error = string_format("cannot allocate the scoring graph's buffer on %s", ggml_backend_name(g->backend));
            return COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED;
        }
        g->n_reserved_head = n_head;
    }

    ggml_context * ctx = spec_prefill_graph_ctx(g);
    auto status = COMMON_SPEC_PREFILL_GRAPH_OK;
    auto fail = [&](common_spec_prefill_graph_status st, const std::string & why) {
        status = st;
        error  = why;
    };

    // the layer's weights stay where the draft's graph left them: bind them as an input of this graph
    ggml_tensor * weights = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, n_kv, 1, n_head, n_stream);
    if (ggml_backend_tensor_alloc(kq->buffer, weights, kq->data) != GGML_STATUS_SUCCESS) {
        fail(COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED, "cannot bind the attention weights");
    }
    spec_prefill_layer_graph lg = spec_prefill_graph_build(g, ctx, weights, il);
    for (int i = 0; status == COMMON_SPEC_PREFILL_GRAPH_OK && i < ggml_graph_n_nodes(lg.gf); ++i) {
        const ggml_tensor * node = ggml_graph_node(lg.gf, i);
        if (!ggml_backend_supports_op(g->backend, node)) {
            fail(COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED, string_format("the %s backend cannot run %s",
                    ggml_backend_name(g->backend), ggml_op_desc(node)));
        }
    }
    if (status == COMMON_SPEC_PREFILL_GRAPH_OK && !ggml_gallocr_alloc_graph(g->galloc, lg.gf)) {
        fail(COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED, "cannot allocate the scoring graph");
    }
    if (status == COMMON_SPEC_PREFILL_GRAPH_OK && ggml_backend_graph_compute(g->backend, lg.gf) != GGML_STATUS_SUCCESS) {
        fail(COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED, string_format("the scoring graph failed on %s",
                ggml_backend_name(g->backend)));
    }

    if (status == COMMON_SPEC_PREFILL_GRAPH_OK) {
        const int64_t n_rows = n_head*n_stream;
        g->host.resize(3*n_rows);
        ggml_backend_tensor_get(lg.total, g->host.data(),            0, n_rows*sizeof(float));
        ggml_backend_tensor_get(lg.norm,  g->host.data() + n_rows,   0, n_rows*sizeof(float));
        ggml_backend_tensor_get(lg.stray, g->host.data() + 2*n_rows, 0, n_rows*sizeof(float));
        for (int64_t r = 0; r < n_rows && status == COMMON_SPEC_PREFILL_GRAPH_OK; ++r) {
            const int64_t s     = r / n_head;
            const float   total = g->host[r];
            const float   norm  = g->host[n_rows + r];
            const float   stray = g->host[2*n_rows + r];
            if (!g->streams[s].active) {
                continue;
            }
            if (stray != 0.0f) {
                fail(COMMON_SPEC_PREFILL_GRAPH_BAD_WEIGHTS, string_format("layer %d, sequence %" PRId64 ", head %"
                        PRId64 ": attention %g on KV cells past the sequence's %d of %" PRId64 " cells (cells do not "
                        "map to positions)", il, s, r % n_head, stray, g->streams[s].n_filled, n_kv));
            } else if (!(total > 0.0f) || !std::isfinite(total) || !std::isfinite(norm)) {
                fail(COMMON_SPEC_PREFILL_GRAPH_BAD_WEIGHTS, string_format("layer %d, sequence %" PRId64 ", head %"
                        PRId64 ": empty or non-finite attention row (weight %g, %g of it on the prompt's %d cells)", il,
                        s, r % n_head, total, norm, g->streams[s].n_norm));
            }
        }
    }
    ggml_free(ctx);
    if (status == COMMON_SPEC_PREFILL_GRAPH_OK) {
        g->n_added++;
    }
    return status;
}

int32_t common_spec_prefill_graph_end_step(common_spec_prefill_graph * g, float * out) {
    const int64_t n_stream = (int64_t) g->streams.size();
    if (g->n_added == 0) {
        std::fill(out, out + n_stream*g->n_cells, 0.0f);
        return 0;
    }
    ggml_context * ctx = spec_prefill_graph_ctx(g);
    ggml_tensor * layers = ggml_view_3d(ctx, g->layer_max, g->n_cells, n_stream, g->n_layer, g->layer_max->nb[1],
            g->layer_max->nb[2], 0);
    // [n_cells, n_layer, n_stream], then the max over layers (layers not added hold zeros)
    ggml_tensor * by_seq = ggml_cont(ctx, ggml_permute(ctx, layers, 0, 2, 1, 3));
    ggml_tensor * result = ggml_pool_2d(ctx, by_seq, GGML_OP_POOL_MAX, 1, g->n_layer, 1, g->n_layer, 0.0f, 0.0f);
    ggml_set_output(result);
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 16, false);
    ggml_build_forward_expand(gf, result);

    int32_t ret = g->n_added;
    if (!ggml_gallocr_alloc_graph(g->galloc, gf) || ggml_backend_graph_compute(g->backend, gf) != GGML_STATUS_SUCCESS) {
        LOG_WRN("%s: the scoring graph failed on %s\n", __func__, ggml_backend_name(g->backend));
        ret = -1;
    } else {
        ggml_backend_tensor_get(result, out, 0, n_stream*g->n_cells*sizeof(float));
    }
    ggml_free(ctx);
    g->masks_stale = true; // and layer_max zeroed with them
    g->n_added     = 0;
    return ret;
}
