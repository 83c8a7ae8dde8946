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
    int32_t n_head      = 0;
    int32_t pool_kernel = 1;
    size_t  group_bytes = 0; // the most attention weights reduced at once: a step's layers go in groups of this size

    // the step's masks, uploaded in one transfer: [n_cells, SPEC_PREFILL_MASK_COUNT, 1, n_seq]
    ggml_context *        ctx_state = nullptr;
    ggml_backend_buffer_t buf_state = nullptr;
    ggml_tensor *         masks     = nullptr;

    std::vector<uint8_t> meta; // the graph's tensor and node metadata
    std::vector<float>   host; // masks on their way up, checks and scores on their way down
};

enum spec_prefill_mask {
    SPEC_PREFILL_MASK_NORM,  // 1 on cells [0, n_norm): the prompt's keys, over which rows are renormalised
    SPEC_PREFILL_MASK_SPAN,  // 1 on the span's cells: the keys that are scored
    SPEC_PREFILL_MASK_PAST,  // 1 on cells >= n_filled: no weight may land there
    SPEC_PREFILL_MASK_COUNT,
};

// the checks per row, in this order: all its weight, the weight on the prompt's keys, the weight past the filled cells
static constexpr int SPEC_PREFILL_N_CHECKS = 3;

// nodes and tensors per layer of the step graph, with room to spare (a layer is a copy; a group adds about 20)
static constexpr size_t SPEC_PREFILL_GRAPH_NODES_PER_LAYER = 48;

ggml_backend_dev_t common_spec_prefill_graph_device(const common_spec_prefill_graph * g) {
    return g->dev;
}

common_spec_prefill_graph * common_spec_prefill_graph_init(ggml_backend_dev_t dev, int32_t n_cells, int32_t n_seq,
        int32_t n_layer, int32_t n_head, int32_t pool_kernel, int32_t n_threads, size_t group_bytes) {
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
    g->n_head      = n_head;
    g->pool_kernel = std::max(1, pool_kernel);
    g->group_bytes = group_bytes;
    g->galloc      = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));

    ggml_init_params ip = { 2*ggml_tensor_overhead(), nullptr, /*no_alloc =*/ true };
    g->ctx_state = ggml_init(ip);
    g->masks     = ggml_new_tensor_4d(g->ctx_state, GGML_TYPE_F32, n_cells, SPEC_PREFILL_MASK_COUNT, 1, n_seq);
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
    ggml_gallocr_free(g->galloc);
    ggml_backend_buffer_free(g->buf_state);
    ggml_free(g->ctx_state);
    ggml_backend_free(g->backend);
    delete g;
}

// this step's masks, for its streams (those past n_stream stay zero)
static void spec_prefill_graph_upload(common_spec_prefill_graph * g, const common_spec_prefill_graph_stream * streams,
        int32_t n_stream) {
    const int64_t n = ggml_nelements(g->masks);
    g->host.assign(n, 0.0f);
    for (int32_t s = 0; s < n_stream; ++s) {
        const auto & st = streams[s];
        float * m = g->host.data() + (size_t) s*SPEC_PREFILL_MASK_COUNT*g->n_cells;
        for (int32_t j = 0; j < g->n_cells; ++j) {
            m[SPEC_PREFILL_MASK_NORM*g->n_cells + j] = j < st.n_norm ? 1.0f : 0.0f;
            m[SPEC_PREFILL_MASK_SPAN*g->n_cells + j] = j >= st.key0 && j < st.key0 + st.n_keys ? 1.0f : 0.0f;
            m[SPEC_PREFILL_MASK_PAST*g->n_cells + j] = j >= st.n_filled ? 1.0f : 0.0f;
        }
    }
    ggml_backend_tensor_set(g->masks, g->host.data(), 0, n*sizeof(float));
}

// consecutive layers of one shape, reduced together
struct spec_prefill_graph_group {
    int32_t first;   // index into the step's layers
    int32_t n;       // layers
    int64_t n_kv;
    int64_t n_head;
};

static std::vector<spec_prefill_graph_group> spec_prefill_graph_groups(const common_spec_prefill_graph * g,
        const ggml_tensor * const * kq, int32_t n_layers) {
    std::vector<spec_prefill_graph_group> groups;
    for (int32_t i = 0; i < n_layers; ++i) {
        const int64_t n_kv = kq[i]->ne[0];
        const int64_t n_head = kq[i]->ne[2];
        if (!groups.empty()) {
            auto & last = groups.back();
            if (last.n_kv == n_kv && last.n_head == n_head && (size_t) (last.n + 1)*ggml_nbytes(kq[i]) <= g->group_bytes) {
                last.n++;
                continue;
            }
        }
        groups.push_back({ i, 1, n_kv, n_head });
    }
    return groups;
}

// a mask for the step's first n_kv cells of each stream: [n_kv, 1, 1, n_stream]
static ggml_tensor * spec_prefill_graph_mask(common_spec_prefill_graph * g, ggml_context * ctx, spec_prefill_mask kind,
        int64_t n_kv, int64_t n_stream) {
    return ggml_view_4d(ctx, g->masks, n_kv, 1, 1, n_stream, g->masks->nb[1], g->masks->nb[2], g->masks->nb[3],
            kind*g->masks->nb[1]);
}

// one group's reduction. Its layers' weights are copied side by side into one tensor, [n_kv, n_head*n, 1, n_stream]
// (a row per head and layer), so that the reduction is a fixed handful of ops whatever the number of layers: a backend
// pays for every op it dispatches, and per layer that cost more than the arithmetic (on Vulkan several times more).
// Returns the group's max over its rows, [n_kv, 1, n_stream], before the division by the pooled span; `checks` gets
// [SPEC_PREFILL_N_CHECKS, n_head*n, 1, n_stream]
static ggml_tensor * spec_prefill_graph_build_group(common_spec_prefill_graph * g, ggml_context * ctx, ggml_cgraph * gf,
        ggml_tensor * const * weights, const spec_prefill_graph_group & grp, int64_t n_stream, ggml_tensor ** checks) {
    const int64_t n_kv   = grp.n_kv;
    const int64_t n_head = grp.n_head;
    const int64_t n_rows = n_head*grp.n;
    const int32_t kernel = g->pool_kernel;

    // the first layer padded with zeros to the group's size (an op, so that its memory is planned like the other
    // intermediates, not kept for the whole graph as a leaf would be), then the others copied into their slices
    auto layer = [&](int32_t l) { return ggml_reshape_4d(ctx, weights[grp.first + l], n_kv, n_head, 1, n_stream); };
    ggml_tensor * stack = grp.n == 1 ? layer(0) : ggml_pad(ctx, layer(0), 0, 0, grp.n - 1, 0);
    for (int32_t l = 1; l < grp.n; ++l) {
        ggml_tensor * slice = ggml_view_4d(ctx, stack, n_kv, n_head, 1, n_stream, stack->nb[1], stack->nb[2],
                stack->nb[3], l*stack->nb[2]);
        ggml_build_forward_expand(gf, ggml_cpy(ctx, layer(l), slice));
    }
    ggml_tensor * rows = ggml_reshape_4d(ctx, stack, n_kv, n_rows, 1, n_stream);

    auto mask = [&](spec_prefill_mask kind) { return spec_prefill_graph_mask(g, ctx, kind, n_kv, n_stream); };
    ggml_tensor * total = ggml_sum_rows(ctx, rows);
    ggml_tensor * norm  = ggml_sum_rows(ctx, ggml_mul(ctx, rows, mask(SPEC_PREFILL_MASK_NORM)));
    ggml_tensor * stray = ggml_sum_rows(ctx, ggml_mul(ctx, rows, mask(SPEC_PREFILL_MASK_PAST)));
    *checks = ggml_concat(ctx, ggml_concat(ctx, total, norm, 0), stray, 0);

    // average over the kernel's cells inside the span (the pooled mask divides it later), renormalised over the
    // prompt's keys: a head with no weight on the prompt divides zeros by a tiny number and adds nothing, as on the host
    ggml_tensor * pooled = ggml_mul(ctx, rows, mask(SPEC_PREFILL_MASK_SPAN));
    if (kernel > 1) {
        pooled = ggml_pool_2d(ctx, pooled, GGML_OP_POOL_AVG, kernel, 1, 1, 1, (float) (kernel/2), 0.0f);
    }
    const int64_t n_out = pooled->ne[0]; // n_kv, or n_kv + 1 for an even kernel
    ggml_tensor * renorm = ggml_div(ctx, pooled, ggml_clamp(ctx, norm, FLT_MIN, FLT_MAX));
    return ggml_pool_2d(ctx, ggml_reshape_3d(ctx, renorm, n_out, n_rows, n_stream), GGML_OP_POOL_MAX,
            1, (int) n_rows, 1, (int) n_rows, 0.0f, 0.0f); // [n_out, 1, n_stream]
}

// the step's graph: every group's reduction, the max over the groups, the division by the pooled span; its outputs
// are the scores [n_kv, 1, n_stream] and the checks of every row
static ggml_tensor * spec_prefill_graph_build(common_spec_prefill_graph * g, ggml_context * ctx, ggml_cgraph * gf,
        ggml_tensor * const * weights, const std::vector<spec_prefill_graph_group> & groups, int64_t n_stream,
        ggml_tensor ** checks) {
    const int32_t kernel = g->pool_kernel;
    int64_t n_kv = 0;
    for (const auto & grp : groups) {
        n_kv = std::max(n_kv, grp.n_kv);
    }
    // an even kernel pads k/2 on both sides; the reference's window for cell j starts at j - (k - 1)/2
    const size_t offset = (kernel > 1 && kernel % 2 == 0) ? sizeof(float) : 0;

    ggml_tensor * merged = nullptr;
    *checks = nullptr;
    for (const auto & grp : groups) {
        ggml_tensor * grp_checks = nullptr;
        ggml_tensor * heads = spec_prefill_graph_build_group(g, ctx, gf, weights, grp, n_stream, &grp_checks);
        ggml_tensor * cells = ggml_view_3d(ctx, heads, grp.n_kv, 1, n_stream, heads->nb[1], heads->nb[2], offset);
        if (grp.n_kv < n_kv) {
            cells = ggml_pad(ctx, ggml_cont(ctx, cells), (int) (n_kv - grp.n_kv), 0, 0, 0);
        }
        merged  = merged  ? ggml_concat(ctx, merged, cells, 1) : cells;
        *checks = *checks ? ggml_concat(ctx, *checks, grp_checks, 1) : grp_checks;
    }
    if (groups.size() > 1) {
        merged = ggml_pool_2d(ctx, merged, GGML_OP_POOL_MAX, 1, (int) groups.size(), 1, (int) groups.size(), 0.0f, 0.0f);
    }
    if (kernel > 1) {
        // the pooled span: how many of a cell's kernel cells lie inside it, whatever a backend divides edge windows by
        ggml_tensor * span   = ggml_cont(ctx, spec_prefill_graph_mask(g, ctx, SPEC_PREFILL_MASK_SPAN, n_kv, n_stream));
        ggml_tensor * counts = ggml_clamp(ctx, ggml_pool_2d(ctx, span, GGML_OP_POOL_AVG, kernel, 1, 1, 1,
                (float) (kernel/2), 0.0f), FLT_MIN, FLT_MAX);
        merged = ggml_div(ctx, merged, ggml_view_3d(ctx, counts, n_kv, 1, n_stream, counts->nb[1], counts->nb[3], offset));
    }
    ggml_tensor * scores = ggml_cont(ctx, merged);
    ggml_set_output(scores);
    ggml_set_output(*checks);
    ggml_build_forward_expand(gf, scores);
    ggml_build_forward_expand(gf, *checks);
    return scores;
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

    // one graph: the weights stay where the draft's graph left them, bound as its inputs (the allocator plans its
    // buffer from the first step and grows it when a longer one needs more)
    ggml_init_params ip = { g->meta.size(), g->meta.data(), /*no_alloc =*/ true };
    ggml_context * ctx = ggml_init(ip);
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, SPEC_PREFILL_GRAPH_NODES_PER_LAYER*(size_t) g->n_layer + 16, false);
    std::vector<ggml_tensor *> weights(n_layers);
    for (int32_t i = 0; i < n_layers; ++i) {
        weights[i] = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, kq[i]->ne[0], 1, kq[i]->ne[2], n_stream);
        if (ggml_backend_tensor_alloc(kq[i]->buffer, weights[i], kq[i]->data) != GGML_STATUS_SUCCESS) {
            ggml_free(ctx);
            error = "cannot bind the attention weights";
            return COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED;
        }
    }
    const auto groups = spec_prefill_graph_groups(g, kq, n_layers);
    ggml_tensor * checks = nullptr;
    ggml_tensor * scores = spec_prefill_graph_build(g, ctx, gf, weights.data(), groups, n_stream, &checks);

    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        const ggml_tensor * node = ggml_graph_node(gf, i);
        if (!ggml_backend_supports_op(g->backend, node)) {
            error = string_format("the %s backend cannot run %s", ggml_backend_name(g->backend), ggml_op_desc(node));
            ggml_free(ctx);
            return COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED;
        }
    }
    if (!ggml_gallocr_alloc_graph(g->galloc, gf) || ggml_backend_graph_compute(g->backend, gf) != GGML_STATUS_SUCCESS) {
        error = string_format("the scoring graph failed on %s", ggml_backend_name(g->backend));
        ggml_free(ctx);
        return COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED;
    }

    // the rows' checks: [SPEC_PREFILL_N_CHECKS, rows of every group, 1, n_stream]
    const int64_t n_rows = checks->ne[1];
    g->host.resize(ggml_nelements(checks));
    ggml_backend_tensor_get(checks, g->host.data(), 0, ggml_nbytes(checks));
    auto status = COMMON_SPEC_PREFILL_GRAPH_OK;
    for (int32_t s = 0; s < n_stream && status == COMMON_SPEC_PREFILL_GRAPH_OK; ++s) {
        if (!streams[s].active) {
            continue;
        }
        int64_t r = 0;
        for (const auto & grp : groups) {
            for (int64_t k = 0; k < grp.n*grp.n_head && status == COMMON_SPEC_PREFILL_GRAPH_OK; ++k, ++r) {
                const float * row   = g->host.data() + ((size_t) s*n_rows + r)*SPEC_PREFILL_N_CHECKS;
                const float   total = row[0];
                const float   norm  = row[1];
                const float   stray = row[2];
                const int32_t layer = il[grp.first + k / grp.n_head];
                const int64_t head  = k % grp.n_head;
                if (stray != 0.0f) {
                    error = string_format("layer %d, sequence %d, head %" PRId64 ": attention %g on KV cells past the "
                            "sequence's %d of %" PRId64 " cells (cells do not map to positions)", layer, s, head,
                            stray, streams[s].n_filled, grp.n_kv);
                    status = COMMON_SPEC_PREFILL_GRAPH_BAD_WEIGHTS;
                } else if (!(total > 0.0f) || !std::isfinite(total) || !std::isfinite(norm)) {
                    error = string_format("layer %d, sequence %d, head %" PRId64 ": empty or non-finite attention row "
                            "(weight %g, %g of it on the prompt's %d cells)", layer, s, head, total, norm,
                            streams[s].n_norm);
                    status = COMMON_SPEC_PREFILL_GRAPH_BAD_WEIGHTS;
                }
            }
        }
    }
    if (status == COMMON_SPEC_PREFILL_GRAPH_OK) {
        const int64_t n_kv = scores->ne[0];
        g->host.resize(ggml_nelements(scores));
        ggml_backend_tensor_get(scores, g->host.data(), 0, ggml_nbytes(scores));
        for (int32_t s = 0; s < n_stream; ++s) {
            std::copy_n(g->host.data() + (size_t) s*n_kv, n_kv, out + (size_t) s*g->n_cells);
        }
    }
    ggml_free(ctx);
    return status;
}
