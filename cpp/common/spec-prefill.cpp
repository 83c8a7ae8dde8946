#include "spec-prefill.h"
#include "spec-prefill-graph.h"
#include "spec-prefill-plan.h"
#include "spec-prefill-settings.h"

#include "log.h"
#include "llama-cpp.h"
#include "speculative.h"
#include "../src/llama-ext.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

// the scoring graph's groups of layers: 64 MiB of weights is every layer of a 1.5B draft at 32K cells, a third of
// them at 128K; the graph's memory is a few times that
static constexpr size_t SPEC_PREFILL_GRAPH_GROUP_MB = 64;

const char * common_spec_prefill_status_name(enum common_spec_prefill_status status) {
    switch (status) {
        case COMMON_SPEC_PREFILL_SPARSE:   return "sparse";
        case COMMON_SPEC_PREFILL_SHORT:    return "short";
        case COMMON_SPEC_PREFILL_KEPT_ALL: return "kept_all";
        case COMMON_SPEC_PREFILL_FAILED:   return "failed";
        case COMMON_SPEC_PREFILL_CANCELLED: return "cancelled";
    }
    return "unknown";
}

// what the eval callback needs to turn one layer's kq_soft_max into scores for each sequence of the step
struct spec_prefill_stream {
    common_spec_prefill_scores * scores = nullptr;

    int32_t key0    = 0; // first cell of the window's own tokens
    int32_t n_keys  = 0; // the window's own tokens
    int32_t n_norm  = 0; // cells of prompt tokens: rows are renormalised over [0, n_norm)
    int32_t n_cells = 0; // cells in use after this step's token: cells >= n_cells must have zero weight
    int32_t n_added = 0; // layers folded into the current row (on the host or in the scoring graph)
    bool    done    = false; // the lookahead hit end of generation: no more rows
};

// where the attention rows are reduced: LLAMA_SPEC_PREFILL_SCORING=auto|host|graph
enum spec_prefill_scoring {
    SPEC_PREFILL_SCORING_AUTO,  // in a graph on the device holding the weights; on the host for host buffers
    SPEC_PREFILL_SCORING_HOST,  // always on the host (the reference: spec-prefill-select.cpp)
    SPEC_PREFILL_SCORING_GRAPH, // always in a graph, also on the CPU backend
};

struct common_spec_prefill {
    common_params_spec_prefill params;
    enum spec_prefill_scoring scoring = SPEC_PREFILL_SCORING_AUTO;

    bool    warmup = true; // run each new draft context's graphs once before its first prompt (--no-warmup: not)
    int32_t n_threads;
    int32_t n_threads_batch;
    int32_t n_batch;
    int32_t n_ubatch;
    enum llama_flash_attn_type flash_attn_type;

    llama_model_ptr   model_owned; // null when the caller's speculative draft is shared, or the target scores
    llama_model     * model = nullptr;
    bool              self  = false; // the target's own weights score (-mpd self)
    llama_context_ptr ctx;
    // spec_prefill_probe_layers's context, kept until the scorer is freed: freed before the scoring context's first
    // use, its buffers met a use-after-free in lavapipe 22.3's deferred buffer destruction (the Vulkan tests' device;
    // docs/log/benchmarks-notes.md) now and then. It is 256 cells and a compute buffer for 8 tokens
    llama_context_ptr ctx_probe;
    const llama_vocab * vocab = nullptr;
    std::vector<std::string> token_pieces; // per token id: its text (special tokens rendered), found at its first use
    std::vector<uint8_t>     token_known;  // per token id: token_pieces holds it

    int32_t n_layer     = 0;
    int32_t n_layers    = 0; // layers a request scores with by default (all, or --spec-prefill-layers)
    int32_t n_swa       = 0;
    // what the graph of one query step showed at init (spec_prefill_probe_layers): the layers with attention weights
    // (not recurrent ones), and whether a graph built for fewer layers (llama_set_graph_n_layer) has only those
    std::vector<char> layer_attn;
    bool probed    = false;
    bool graph_cut = false;
    bool layer_stop = true; // build the graph with only the layers that score (LLAMA_SPEC_PREFILL_LAYER_STOP)
    int32_t n_ctx_max   = 0; // the most KV cells the draft context may have
    int32_t ctx_n_seq   = 0; // shape of the current context
    int32_t ctx_n_cells = 0; // cells per sequence
    int32_t ctx_n_layer = 0; // the layers whose KV it holds (llama_init_from_model_n_layer; 0: all)

    // common_spec_prefill_prepare's context: its cells are the draft's whole KV from then on (never more), and its
    // sequence length the longest one may be. Within those cells the context is reshaped for a request whose windows
    // it would score in far fewer rounds side by side (a per-request window on a context prepared for full scoring)
    bool    fixed_size    = false;
    int32_t fixed_n_seq   = 0;
    int32_t fixed_n_cells = 0;
    bool    reshape_off   = false; // a reshape failed once: plans keep the current shape
    int32_t n_ctx_created = 0;     // contexts made so far (a request's setup time counts only when it made one)

    // the draft's KV after a round of one sequence, kept for the next prompt that starts with the same tokens (an
    // agent's next turn on the same slot scores its new tokens without the draft prefilling the turns before them):
    // sequence 0 holds kv_tokens at positions [0, kv_tokens.size())
    // (kv_tokens under kv_mutex: a server's planning asks, from its own thread, how much of a prompt it holds)
    std::mutex   kv_mutex;
    llama_tokens kv_tokens;
    int32_t kv_n_layer  = 0;     // the graph's layers then: a deeper graph needs the layers a cut one left out
    int32_t graph_n_layer = 0;   // the graph's layers now (llama_set_graph_n_layer; 0: all)
    bool    kv_reuse    = true;  // off for sliding-window and recurrent scorers, or LLAMA_SPEC_PREFILL_DRAFT_REUSE=0

    common_spec_prefill_pool * pool = nullptr;   // threads for reading rows on the host, made once
    common_spec_prefill_graph * graph = nullptr; // made for the draft context's shape, at its first use
    size_t graph_group_bytes = 0;                // the most weights its groups of layers hold
    bool graph_failed = false;                   // the backend cannot run it: host scoring from then on
};

// What one run holds, a prompt's scoring or a context's warm-up: made by it, handed to the eval callback and the abort
// callback, gone with it, so nothing of one request is left for the next to reset
struct spec_prefill_run {
    common_spec_prefill * sp = nullptr;
    const std::atomic<bool> * cancel = nullptr; // the request's cancel flag
    // the prompt continues a reused prefix (n_past > 0): only then may the draft start on the KV the last prompt left,
    // so a prompt scored again from scratch (a retry, a benchmark's repeat) is scored from scratch in the draft too
    bool continuation = false;

    std::vector<char> layer_usable; // per layer: its rows are read in this round
    std::vector<char> layer_seen;   // per layer: its rows were read in some round
    int32_t n_usable    = 0;        // layers this round scores with (usable, with attention weights)

    // the current query step
    std::vector<spec_prefill_stream> streams;
    std::vector<const ggml_tensor *> step_weights; // this step's kq_soft_max of the usable layers, valid until the
    std::vector<int32_t>             step_layers;  // next decode, and their layers
    std::vector<common_spec_prefill_graph_stream> graph_streams; // the step's sequences, for the scoring graph
    int32_t n_step_read = 0; // usable layers the step read
    std::string capture_error;

    std::vector<float> buf;       // one layer's weights on the host
    std::vector<float> graph_out; // the scoring graph's values per cell and sequence
    bool graph_off_prompt = false; // the graph's checks failed on this prompt: host scoring for the rest of it
    int32_t n_reads_graph = 0;     // layer reads reduced in the scoring graph
    int32_t n_reads_host  = 0;     // and on the host
    int64_t t_reduce_us   = 0;     // time reducing rows after the query steps' decodes

    spec_prefill_run(common_spec_prefill * sp, const std::atomic<bool> * cancel) : sp(sp), cancel(cancel),
            layer_usable(sp->n_layer, 0), layer_seen(sp->n_layer, 0) {
        llama_set_abort_callback(sp->ctx.get(), abort_cb, this);
    }
    ~spec_prefill_run() {
        llama_set_abort_callback(sp->ctx.get(), nullptr, nullptr);
    }
    spec_prefill_run(const spec_prefill_run &) = delete;
    spec_prefill_run & operator=(const spec_prefill_run &) = delete;

    bool cancelled() const {
        return cancel && cancel->load(std::memory_order_relaxed);
    }
    // cancellation: the CPU backend checks it between graph nodes, the driver between its decodes
    static bool abort_cb(void * data) {
        return ((const spec_prefill_run *) data)->cancelled();
    }
};

//
// eval callback: reads kq_soft_max-<il> of the query steps
//

// the scoring graph for the buffer that holds t, or nullptr to score on the host
static common_spec_prefill_graph * spec_prefill_graph_for(spec_prefill_run & run, const ggml_tensor * t) {
    common_spec_prefill * sp = run.sp;
    if (sp->scoring == SPEC_PREFILL_SCORING_HOST || sp->graph_failed || run.graph_off_prompt || !t->buffer) {
        return nullptr;
    }
    if (sp->scoring == SPEC_PREFILL_SCORING_AUTO && ggml_backend_buffer_is_host(t->buffer)) {
        return nullptr; // the host reads the rows in place, no copy to save
    }
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer));
    if (!dev && ggml_backend_buffer_is_host(t->buffer)) {
        dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU); // the CPU buffer type names no device
    }
    if (!dev) {
        return nullptr;
    }
    if (!sp->graph) {
        sp->graph = common_spec_prefill_graph_init(dev, sp->ctx_n_cells, sp->ctx_n_seq, sp->n_layer,
                llama_model_n_head(sp->model), sp->params.pool_kernel, sp->n_threads_batch, sp->graph_group_bytes);
        if (!sp->graph) {
            LOG_WRN("%s: cannot set up scoring on %s, scoring on the host\n", __func__, ggml_backend_dev_name(dev));
            sp->graph_failed = true;
            return nullptr;
        }
        LOG_INF("%s: attention rows are reduced on %s\n", __func__, ggml_backend_dev_name(dev));
    }
    // layers on another device (a model split across GPUs) are scored on the host
    return common_spec_prefill_graph_device(sp->graph) == dev ? sp->graph : nullptr;
}

// fold one layer's rows into the streams' current rows on the host (spec-prefill-select.cpp)
static bool spec_prefill_read_layer_host(spec_prefill_run & run, const ggml_tensor * t, int il) {
    common_spec_prefill * sp = run.sp;
    const int64_t n_kv     = t->ne[0];
    const int64_t n_rows   = t->ne[1];
    const int64_t n_head   = t->ne[2];
    const int64_t n_stream = t->ne[3];

    if (t->type != GGML_TYPE_F32 || n_rows != 1 || n_stream != (int64_t) run.streams.size()) {
        run.capture_error = string_format("unexpected attention layout in layer %d: type %s, [%" PRId64 ", %" PRId64
                ", %" PRId64 ", %" PRId64 "] for %zu sequences", il, ggml_type_name(t->type), n_kv, n_rows, n_head,
                n_stream, run.streams.size());
        return false;
    }
    run.buf.resize(ggml_nelements(t));
    ggml_backend_tensor_get(t, run.buf.data(), 0, ggml_nbytes(t));

    // cell j must be position j: nothing may sit beyond the cells a sequence has filled (checked on its first head)
    for (int64_t s = 0; s < n_stream; ++s) {
        const spec_prefill_stream & st = run.streams[s];
        if (st.done) {
            continue;
        }
        const float * probs = run.buf.data() + s*n_head*n_kv;
        if (st.n_cells > n_kv) {
            run.capture_error = string_format("layer %d has %" PRId64 " KV cells, sequence %" PRId64 " needs %d", il,
                    n_kv, s, st.n_cells);
            return false;
        }
        double used = 0.0;
        for (int64_t j = 0; j < n_kv; ++j) {
            if (j >= st.n_cells && probs[j] != 0.0f) {
                run.capture_error = string_format("layer %d, sequence %" PRId64 ": attention on KV cell %" PRId64
                        " past the sequence's %d cells (cells do not map to positions)", il, s, j, st.n_cells);
                return false;
            }
            used += probs[j];
        }
        if (!(used > 0.0) || !std::isfinite(used)) {
            run.capture_error = string_format("layer %d, sequence %" PRId64 ": empty or non-finite attention row", il, s);
            return false;
        }
    }

    // the windows' rows are independent, and each window's heads split into parts: all the parts of all the windows
    // run side by side on the context's thread pool
    std::vector<std::pair<int32_t, int32_t>> tasks; // (stream, part)
    std::vector<int32_t> n_parts(n_stream, 0);
    for (int64_t s = 0; s < n_stream; ++s) {
        spec_prefill_stream & st = run.streams[s];
        if (!st.done) {
            n_parts[s] = common_spec_prefill_scores_n_parts(st.scores, n_head, st.n_norm);
            for (int32_t t = 0; t < n_parts[s]; ++t) {
                tasks.emplace_back((int32_t) s, t);
            }
            st.n_added++;
        }
    }
    common_spec_prefill_pool_run(sp->pool, (int32_t) tasks.size(), [&](int32_t i) {
        const auto [s, t] = tasks[i];
        const spec_prefill_stream & st = run.streams[s];
        common_spec_prefill_scores_add_heads_part(st.scores, run.buf.data() + (int64_t) s*n_head*n_kv, n_head, n_kv,
                st.key0, st.n_norm, t, n_parts[s]);
    });
    run.layer_seen[il] = 1;
    run.n_reads_host++;
    run.n_step_read++;
    return true;
}

static void spec_prefill_read_step(spec_prefill_run & run);

// records the usable layers' kq_soft_max-<il> as the scheduler goes by them. Beside flash attention they are graph
// outputs (patch 0003): nothing reuses their memory, so the decode runs through and they are read after it, all at
// once. On the plain path the attention output reads them and their memory is reused after that, so the graph stops
// at each one (a wait for the device per layer) and it is read here
static bool spec_prefill_eval_cb(ggml_tensor * t, bool ask, void * user_data) {
    auto & run = *(spec_prefill_run *) user_data;
    common_spec_prefill * sp = run.sp;

    static constexpr char prefix[] = "kq_soft_max-";
    if (!ask) {
        spec_prefill_read_step(run);
        return true; // false would abort the graph: errors are reported after the decode
    }
    if (strncmp(t->name, prefix, sizeof(prefix) - 1) != 0) {
        return false;
    }
    const int il = atoi(t->name + sizeof(prefix) - 1);
    if (il < 0 || il >= sp->n_layer || !run.layer_usable[il]) {
        return false;
    }
    run.step_weights.push_back(t);
    run.step_layers.push_back(il);
    return (t->flags & GGML_TENSOR_FLAG_OUTPUT) == 0;
}

// fold the recorded layers into the streams' current rows: in one scoring graph where the weights are, or on the
// host. A graph whose checks fail hands this step and the next ones to the host, which checks the same
// weights: if they pass there, the graph was what failed on this backend, and the request still gets its scores
static void spec_prefill_read_step(spec_prefill_run & run) {
    common_spec_prefill * sp = run.sp;
    std::vector<const ggml_tensor *> on_graph;
    std::vector<int32_t>             on_graph_il;
    for (size_t i = 0; i < run.step_weights.size() && run.capture_error.empty(); ++i) {
        const ggml_tensor * t = run.step_weights[i];
        if (spec_prefill_graph_for(run, t)) {
            on_graph.push_back(t);
            on_graph_il.push_back(run.step_layers[i]);
        } else {
            spec_prefill_read_layer_host(run, t, run.step_layers[i]);
        }
    }
    if (!on_graph.empty() && run.capture_error.empty()) {
        const int32_t n_seq = (int32_t) run.graph_streams.size();
        run.graph_out.resize((size_t) n_seq*sp->ctx_n_cells);
        std::string error;
        const auto status = common_spec_prefill_graph_step(sp->graph, run.graph_streams.data(), n_seq, on_graph.data(),
                on_graph_il.data(), (int32_t) on_graph.size(), run.graph_out.data(), error);
        if (status == COMMON_SPEC_PREFILL_GRAPH_OK) {
            for (int32_t s = 0; s < n_seq; ++s) {
                auto & st = run.streams[s];
                if (!st.done) {
                    common_spec_prefill_scores_add_max(st.scores,
                            run.graph_out.data() + (size_t) s*sp->ctx_n_cells + run.graph_streams[s].key0);
                    st.n_added += (int32_t) on_graph.size();
                }
            }
            for (int32_t il : on_graph_il) {
                run.layer_seen[il] = 1;
            }
            run.n_reads_graph += (int32_t) on_graph.size();
            run.n_step_read   += (int32_t) on_graph.size();
        } else {
            // weights the graph rejects are checked again on the host: a fault of one prompt's graph costs that
            // prompt speed, an unsupported backend every prompt's
            const bool unsupported = status == COMMON_SPEC_PREFILL_GRAPH_UNSUPPORTED;
            LOG_WRN("%s: %s; scoring on the host%s\n", __func__, error.c_str(), unsupported ? "" : " for this prompt");
            (unsupported ? sp->graph_failed : run.graph_off_prompt) = true;
            for (size_t i = 0; i < on_graph.size() && run.capture_error.empty(); ++i) {
                spec_prefill_read_layer_host(run, on_graph[i], on_graph_il[i]);
            }
        }
    }
    run.step_weights.clear();
    run.step_layers.clear();
}

// one query step's decode: the eval callback records the usable layers' attention weights, folded into the streams'
// rows once the decode is done (or dropped if it failed). The callback is installed only around the query steps:
// installed, it makes the scheduler wait after every split, which would stall the prompt prefill's pipelining
static int32_t spec_prefill_decode_query(spec_prefill_run & run, const llama_batch & batch) {
    common_spec_prefill * sp = run.sp;
    llama_context * ctx = sp->ctx.get();
    llama_set_eval_callback(ctx, spec_prefill_eval_cb, &run);
    run.n_step_read = 0;
    const int32_t ret = llama_decode(ctx, batch);
    llama_set_eval_callback(ctx, nullptr, nullptr);
    llama_synchronize(ctx);
    if (ret == 0) {
        const int64_t t_reduce = ggml_time_us();
        spec_prefill_read_step(run);
        run.t_reduce_us += ggml_time_us() - t_reduce;
        // every usable layer gave its weights (a graph built for fewer layers than the request's would not)
        if (run.capture_error.empty() && sp->probed && run.n_step_read < run.n_usable) {
            run.capture_error = string_format("the draft's graph gave the attention weights of %d of the %d layers "
                    "it scores with", run.n_step_read, run.n_usable);
        }
    } else {
        run.step_weights.clear();
        run.step_layers.clear();
    }
    return ret;
}

// append one token of one sequence to a batch made by llama_batch_init
static void spec_prefill_batch_add(llama_batch & batch, llama_token tok, llama_pos pos, llama_seq_id seq, bool output) {
    const int32_t i = batch.n_tokens++;
    batch.token[i]     = tok;
    batch.pos[i]       = pos;
    batch.n_seq_id[i]  = 1;
    batch.seq_id[i][0] = seq;
    batch.logits[i]    = output;
}

//
// init
//

// a scoring context's parameters: n_seq sequences of n_cells cells, one KV stream each (cell j is position j)
static llama_context_params spec_prefill_ctx_params(const common_spec_prefill * sp, int32_t n_seq, int32_t n_cells,
        int32_t n_batch, int32_t n_ubatch) {
    auto cparams = llama_context_default_params();
    cparams.n_ctx           = (uint32_t) n_seq * n_cells;
    cparams.n_seq_max       = n_seq;
    cparams.kv_unified      = false;
    cparams.n_batch         = n_batch;
    cparams.n_ubatch        = n_ubatch;
    cparams.n_threads       = sp->n_threads;
    cparams.n_threads_batch = sp->n_threads_batch;
    cparams.flash_attn_type = sp->flash_attn_type;
    cparams.type_k          = GGML_TYPE_F16;
    cparams.type_v          = GGML_TYPE_F16;
    cparams.no_perf         = true;
    return cparams;
}

// what the probe's graph showed: the layers with attention weights ("kq_soft_max-<il>"), and the last layer any node
// names ("<name>-<il>")
struct spec_prefill_probe {
    std::vector<char> attn;
    int32_t il_max = -1;
};

static bool spec_prefill_probe_cb(ggml_tensor * t, bool ask, void * user_data) {
    auto * probe = (spec_prefill_probe *) user_data;
    if (ask) {
        int il = -1;
        char rest = 0;
        if (sscanf(t->name, "kq_soft_max-%d%c", &il, &rest) == 1 && il >= 0 && il < (int) probe->attn.size()) {
            probe->attn[il] = 1;
        }
        const char * dash = strrchr(t->name, '-');
        if (dash && sscanf(dash + 1, "%d%c", &il, &rest) == 1) {
            probe->il_max = std::max(probe->il_max, il);
        }
    }
    return false;
}

// query steps of the scorer in a context of its own: one with every layer, to see which have attention weights (a
// hybrid model's recurrent layers have none), one with the graph built for one layer, to see whether the architecture
// builds fewer (llama_set_graph_n_layer): what scoring with the first K layers relies on, found in the graph itself
// rather than from a list of architectures. On failure every layer counts as an attention layer, and fewer layers
// run the whole graph
static bool spec_prefill_probe_layers(common_spec_prefill * sp) {
    sp->layer_attn.assign(sp->n_layer, 1);
    sp->graph_cut = false;

    sp->ctx_probe.reset(llama_init_from_model(sp->model, spec_prefill_ctx_params(sp, 1, 256, 8, 8)));
    llama_context * ctx = sp->ctx_probe.get();
    if (!ctx) {
        return false;
    }
    llama_set_attn_weights_max_tokens(ctx, 1);
    const llama_token tok = llama_vocab_bos(sp->vocab) >= 0 ? llama_vocab_bos(sp->vocab) : 0;
    llama_batch batch = llama_batch_init(1, 0, 1);
    spec_prefill_batch_add(batch, tok, 0, 0, false);
    bool ok = llama_decode(ctx, batch) == 0;
    spec_prefill_probe full, cut;
    full.attn.assign(sp->n_layer, 0);
    cut.attn.assign(sp->n_layer, 0);
    for (auto * probe : { &full, &cut }) {
        llama_set_graph_n_layer(ctx, probe == &cut ? 1 : 0);
        llama_set_eval_callback(ctx, spec_prefill_probe_cb, probe);
        batch.n_tokens = 0;
        spec_prefill_batch_add(batch, tok, probe == &cut ? 2 : 1, 0, false);
        ok = ok && llama_decode(ctx, batch) == 0;
    }
    llama_set_eval_callback(ctx, nullptr, nullptr);
    llama_batch_free(batch);
    ok = ok && std::count(full.attn.begin(), full.attn.end(), 1) > 0;
    if (ok) {
        sp->layer_attn = full.attn;
        sp->graph_cut  = sp->n_layer == 1 || (full.il_max >= 1 && cut.il_max == 0);
    }
    sp->probed = ok;
    return ok;
}

// the first layer with attention over the whole context (not a sliding window), or -1
static int32_t spec_prefill_first_full_layer(const common_spec_prefill * sp) {
    for (int32_t il = 0; il < sp->n_layer; ++il) {
        if (sp->layer_attn[il] && !llama_model_is_swa_layer(sp->model, il)) {
            return il;
        }
    }
    return -1;
}

// the target's default for scoring itself: a quarter of its layers, and at least its first full-attention one
static int32_t spec_prefill_self_layers(const common_spec_prefill * sp) {
    return std::min(sp->n_layer, std::max({ 1, sp->n_layer / 4, spec_prefill_first_full_layer(sp) + 1 }));
}

// why the first n_layers layers cannot score, or "": they must hold an attention layer that sees the whole context
// (or, in a model with none, any attention layer)
static std::string spec_prefill_layers_problem(const common_spec_prefill * sp, int32_t n_layers) {
    const int32_t full = spec_prefill_first_full_layer(sp);
    if (full >= n_layers) {
        return string_format("its first %d layers hold no full-attention layer (the first is layer %d): score with "
                "%d layers or more (--spec-prefill-layers, spec_prefill.layers)", n_layers, full, full + 1);
    }
    if (full < 0 && std::find(sp->layer_attn.begin(), sp->layer_attn.begin() + n_layers, 1) ==
            sp->layer_attn.begin() + n_layers) {
        return string_format("its first %d layers hold no attention layer", n_layers);
    }
    return "";
}

static bool spec_prefill_vocab_matches(const llama_vocab * tgt, const llama_vocab * dft, std::string & why) {
    if (llama_vocab_type(tgt) != llama_vocab_type(dft)) {
        why = string_format("tokenizer types differ (target %d, draft %d)", llama_vocab_type(tgt), llama_vocab_type(dft));
        return false;
    }
    const int32_t n_tgt = llama_vocab_n_tokens(tgt);
    const int32_t n_dft = llama_vocab_n_tokens(dft);
    if (n_tgt != n_dft) {
        why = string_format("vocabulary sizes differ (target %d, draft %d)", n_tgt, n_dft);
        return false;
    }
    if (llama_vocab_get_add_bos(tgt) != llama_vocab_get_add_bos(dft) ||
            (llama_vocab_get_add_bos(tgt) && llama_vocab_bos(tgt) != llama_vocab_bos(dft))) {
        why = "BOS tokens differ";
        return false;
    }
    for (int32_t i = 0; i < n_tgt; ++i) {
        if (strcmp(llama_vocab_get_text(tgt, i), llama_vocab_get_text(dft, i)) != 0) {
            why = string_format("token %d differs (target '%s', draft '%s')", i, llama_vocab_get_text(tgt, i),
                    llama_vocab_get_text(dft, i));
            return false;
        }
    }
    return true;
}

// A prefill draft on a ggml RPC device whose connection failed: its buffers and graphs do nothing from then on (the
// remote's copy of the weights is gone with it), so nothing it computes can be used. nullptr when all is well.
static const char * spec_prefill_lost_device(const common_spec_prefill * sp) {
    for (int32_t i = 0; i < llama_model_n_devices(sp->model); ++i) {
        ggml_backend_dev_t dev = llama_model_get_device(sp->model, i);
        using lost_fn_t = bool (*)(ggml_backend_dev_t);
        auto lost = (lost_fn_t) ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev),
                "ggml_backend_rpc_device_lost");
        if (lost && lost(dev)) {
            return ggml_backend_dev_name(dev);
        }
    }
    return nullptr;
}

static std::string spec_prefill_lost_reason(const char * dev) {
    return string_format("the prefill draft's remote device %s lost its connection; spec prefill stays off until the "
            "server restarts", dev);
}

std::string common_spec_prefill_devices(const common_spec_prefill * sp) {
    std::string out;
    for (int32_t i = 0; i < llama_model_n_devices(sp->model); ++i) {
        ggml_backend_dev_t dev = llama_model_get_device(sp->model, i);
        out += (out.empty() ? "" : ",") + std::string(ggml_backend_dev_name(dev));
        if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            out += std::string(" (") + ggml_backend_dev_description(dev) + ")";
        }
    }
    return out.empty() ? "CPU" : out;
}

// a 0/1 environment switch: unset keeps value; anything else is an error naming both meanings
static bool spec_prefill_env_switch(const char * name, const char * on, const char * off, bool & value,
        std::string & error) {
    const char * env = getenv(name);
    if (!env) {
        return true;
    }
    if (strcmp(env, "0") != 0 && strcmp(env, "1") != 0) {
        error = string_format("%s is '%s': use 1 (%s) or 0 (%s)", name, env, on, off);
        return false;
    }
    value = strcmp(env, "1") == 0;
    return true;
}

common_spec_prefill * common_spec_prefill_init(const common_params & params, const llama_model * model_tgt,
        llama_model * model_spec_draft, std::string & error) {
    const auto & spp = params.spec_prefill;

    if (const std::string problem = common_spec_prefill_settings_check(spp); !problem.empty()) {
        error = "speculative prefill: " + problem;
        return nullptr;
    }

    // the target scores for itself: a context of its own on the target's weights, with the target's threads
    const bool self = spp.mparams.path == COMMON_SPEC_PREFILL_SELF;

    // loaded as upstream loads a speculative draft (threads, cache types, no embeddings), not with the target's
    // tensor split, overrides or adapters
    const common_params params_spec = common_base_params_to_speculative(params);
    common_params params_dft = self ? params : params_spec;
    params_dft.model = !spp.mparams.path.empty() ? spp.mparams : params.speculative.draft.mparams;
    if (params_dft.model.path.empty()) {
        error = "speculative prefill needs a draft model: pass -mpd FILE (or --spec-draft-model), or -mpd "
                COMMON_SPEC_PREFILL_SELF " to score with the target's first layers";
        return nullptr;
    }
    params_dft.n_gpu_layers = spp.n_gpu_layers;
    if (!spp.devices.empty()) {
        params_dft.devices = spp.devices;
    }
    params_dft.tensor_buft_overrides.clear();
    params_dft.lora_adapters.clear();

    // the speculative draft is loaded with -ngld/-devd (params_spec): the same file placed the same way is one
    // model, not two
    const bool share = !self && model_spec_draft && params_dft.model.path == params.speculative.draft.mparams.path &&
            params_dft.n_gpu_layers == params_spec.n_gpu_layers && params_dft.devices == params_spec.devices;
    llama_model_ptr model_owned;
    if (!share && !self) {
        auto mparams = common_model_params_to_llama(params_dft);
        model_owned.reset(llama_model_load_from_file(params_dft.model.path.c_str(), mparams));
        if (!model_owned) {
            error = "speculative prefill: failed to load the draft model '" + params_dft.model.path + "'";
            return nullptr;
        }
    }
    // llama_init_from_model takes a non-const model, but does not change it
    llama_model * model = self ? const_cast<llama_model *>(model_tgt) : share ? model_spec_draft : model_owned.get();

    // EAGLE3, DFlash and DSpark drafts read the target's hidden states: they cannot prefill a prompt on their own
    if (!self && llama_model_target_layer_ids_n(model) > 0) {
        error = "speculative prefill: the draft '" + params_dft.model.path + "' reads the target's hidden states "
                "(an EAGLE3, DFlash or DSpark draft) and cannot score a prompt on its own: give the prefill a "
                "standalone draft with -mpd FILE";
        return nullptr;
    }

    std::string why;
    if (!self && !spec_prefill_vocab_matches(llama_model_get_vocab(model_tgt), llama_model_get_vocab(model), why)) {
        error = "speculative prefill: the draft '" + params_dft.model.path + "' does not share the target's "
                "vocabulary: " + why;
        return nullptr;
    }

    auto scoring = SPEC_PREFILL_SCORING_AUTO;
    if (const char * env = getenv("LLAMA_SPEC_PREFILL_SCORING")) {
        if (strcmp(env, "host") == 0) {
            scoring = SPEC_PREFILL_SCORING_HOST;
        } else if (strcmp(env, "graph") == 0) {
            scoring = SPEC_PREFILL_SCORING_GRAPH;
        } else if (strcmp(env, "auto") != 0) {
            error = string_format("LLAMA_SPEC_PREFILL_SCORING is '%s': use auto, host or graph", env);
            return nullptr;
        }
    }

    // the scoring graph reduces its layers in groups of at most this many bytes of weights (0: a layer at a time)
    size_t graph_group_bytes = SPEC_PREFILL_GRAPH_GROUP_MB << 20;
    if (const char * env = getenv("LLAMA_SPEC_PREFILL_GRAPH_GROUP_MB")) {
        char * end = nullptr;
        const long mb = strtol(env, &end, 10);
        if (end == env || *end != '\0' || mb < 0 || mb > (1 << 20)) {
            error = string_format("LLAMA_SPEC_PREFILL_GRAPH_GROUP_MB is '%s': use a number of MiB, 0 or more", env);
            return nullptr;
        }
        graph_group_bytes = (size_t) mb << 20;
    }

    // LLAMA_SPEC_PREFILL_LAYER_STOP=0: scoring with fewer layers still computes the whole graph (the tests' reference
    // for the graph built with fewer layers)
    bool layer_stop = true;
    if (!spec_prefill_env_switch("LLAMA_SPEC_PREFILL_LAYER_STOP", "build the graph with only the layers that score",
                "compute all of them", layer_stop, error)) {
        return nullptr;
    }

    // LLAMA_SPEC_PREFILL_DRAFT_REUSE=0: every round prefills its sequence from scratch (the reference for the reuse)
    bool kv_reuse = true;
    if (!spec_prefill_env_switch("LLAMA_SPEC_PREFILL_DRAFT_REUSE", "a prompt that starts with the last scored one "
                "reuses its draft KV", "never", kv_reuse, error)) {
        return nullptr;
    }

    auto * sp = new common_spec_prefill;
    sp->params          = spp;
    sp->layer_stop      = layer_stop;
    sp->scoring         = scoring;
    sp->graph_group_bytes = graph_group_bytes;
    sp->n_threads       = params_dft.cpuparams.n_threads;
    sp->n_threads_batch = params_dft.cpuparams_batch.n_threads > 0 ? params_dft.cpuparams_batch.n_threads : params_dft.cpuparams.n_threads;
    sp->n_batch         = std::max(1, params.n_batch);
    sp->n_ubatch        = std::max(1, std::min(params.n_ubatch, params.n_batch));
    sp->flash_attn_type = params.flash_attn_type;
    sp->vocab           = llama_model_get_vocab(model);
    sp->token_pieces.assign(llama_vocab_n_tokens(sp->vocab), std::string());
    sp->token_known.assign(llama_vocab_n_tokens(sp->vocab), 0);
    sp->n_layer         = llama_model_n_layer(model);
    sp->n_swa           = llama_model_n_swa(model);
    // a sliding-window cache drops what a shorter prefix would need again, a recurrent state cannot be cut back
    sp->kv_reuse        = kv_reuse && sp->n_swa == 0 && !llama_model_is_recurrent(model) && !llama_model_is_hybrid(model);
    sp->n_ctx_max       = spp.n_ctx > 0 ? spp.n_ctx : llama_model_n_ctx_train(model);
    sp->warmup          = params.warmup;
    sp->model           = model;
    sp->model_owned     = std::move(model_owned);
    sp->self            = self;
    sp->pool = common_spec_prefill_pool_init(sp->n_threads_batch);

    if (!spec_prefill_probe_layers(sp)) {
        LOG_WRN("%s: could not look into the scorer's graph: every layer counts as an attention layer, and scoring "
                "with fewer layers runs the whole graph\n", __func__);
    }
    const std::string scorer = self ? "the target '" + params.model.path + "'" : "the draft '" + params_dft.model.path + "'";
    if (spp.n_layers > sp->n_layer) {
        error = string_format("speculative prefill: --spec-prefill-layers %d, but %s has %d layers", spp.n_layers,
                scorer.c_str(), sp->n_layer);
        common_spec_prefill_free(sp);
        return nullptr;
    }
    sp->n_layers = spp.n_layers > 0 ? spp.n_layers : self ? spec_prefill_self_layers(sp) : sp->n_layer;
    if (const std::string problem = spec_prefill_layers_problem(sp, sp->n_layers); !problem.empty()) {
        error = "speculative prefill: " + scorer + ": " + problem;
        common_spec_prefill_free(sp);
        return nullptr;
    }
    if (sp->n_layers < sp->n_layer && sp->probed && !sp->graph_cut) {
        LOG_WRN("%s: %s builds every layer into its graph whatever it is asked: scoring with its first %d layers "
                "computes all %d\n", __func__, scorer.c_str(), sp->n_layers, sp->n_layer);
    }

    // a window wider than the context is narrowed to what fits when a prompt is planned (so a window of at least
    // the prompt's length always means "score it whole, as far as the context holds"); only a context too small
    // for any window is an error
    const int32_t n_window_min = 512;
    if (sp->n_ctx_max < n_window_min) {
        error = string_format("speculative prefill: the draft context (--spec-prefill-ctx, default: the draft's trained "
                "context) holds %d tokens, fewer than the %d a window needs; raise --spec-prefill-ctx", sp->n_ctx_max,
                n_window_min);
        common_spec_prefill_free(sp);
        return nullptr;
    }
    const int32_t n_window_fit = sp->n_ctx_max - COMMON_SPEC_PREFILL_N_SINK -
            common_spec_prefill_lookahead_max(spp.lookahead);
    if (spp.window > n_window_fit) {
        LOG_WRN("%s: windows of %d tokens do not fit the draft context of %d cells: a prompt that needs more is "
                "scored in windows of what fits\n", __func__, spp.window, sp->n_ctx_max);
    }

    if (const char * dev = spec_prefill_lost_device(sp)) {
        error = string_format("speculative prefill: the draft's remote device %s lost its connection while the "
                "draft was loaded", dev);
        common_spec_prefill_free(sp);
        return nullptr;
    }

    LOG_INF("%s: scorer %s%s: %d layers, scoring with %s, sliding window %d, up to %d KV cells\n", __func__,
            scorer.c_str(), share ? " (the speculative-decoding draft's weights, shared)" :
            self ? " (its own weights, in a context of their own)" : "", sp->n_layer,
            sp->n_layers == sp->n_layer ? "all of them" : string_format("the first %d", sp->n_layers).c_str(),
            sp->n_swa, sp->n_ctx_max);
    return sp;
}

void common_spec_prefill_free(common_spec_prefill * sp) {
    if (sp) {
        common_spec_prefill_graph_free(sp->graph);
        common_spec_prefill_pool_free(sp->pool);
    }
    delete sp;
}

static const std::string & spec_prefill_piece(common_spec_prefill * sp, llama_token tok) {
    static const std::string none;
    if (tok < 0 || tok >= (llama_token) sp->token_pieces.size()) {
        return none;
    }
    if (!sp->token_known[tok]) {
        sp->token_pieces[tok] = common_token_to_piece(sp->vocab, tok, true);
        sp->token_known[tok]  = 1;
    }
    return sp->token_pieces[tok];
}

// which of prompt[n_past, N) end a line: a token whose piece ends with a newline, or that a piece starting with one
// follows (the draft's vocabulary is the target's)
static std::vector<uint8_t> spec_prefill_line_ends(common_spec_prefill * sp, const llama_tokens & prompt,
        int32_t n_past) {
    const int32_t n_prompt = (int32_t) prompt.size();
    auto starts_with_newline = [&](int32_t i) {
        const std::string & piece = spec_prefill_piece(sp, prompt[i]);
        return !piece.empty() && piece.front() == '\n';
    };
    std::vector<uint8_t> ends(std::max(0, n_prompt - n_past), 0);
    for (int32_t i = n_past; i < n_prompt; ++i) {
        const std::string & piece = spec_prefill_piece(sp, prompt[i]);
        ends[i - n_past] = (!piece.empty() && piece.back() == '\n') || (i + 1 < n_prompt && starts_with_newline(i + 1));
    }
    return ends;
}

//
// planning: windows, and the context shape they need (the pure part is spec-prefill-plan.cpp)
//

// the draft context as planning sees it: its limits, and its shape now (read at each plan: a reshape changes it)
static common_spec_prefill_shape spec_prefill_shape(const common_spec_prefill * sp) {
    common_spec_prefill_shape shape;
    shape.n_ctx_max     = sp->n_ctx_max;
    shape.fixed_size    = sp->fixed_size;
    shape.fixed_n_seq   = sp->fixed_n_seq;
    shape.fixed_n_cells = sp->fixed_n_cells;
    shape.ctx_n_seq     = sp->ctx_n_seq;
    shape.ctx_n_cells   = sp->ctx_n_cells;
    shape.reshape_off   = sp->reshape_off;
    // a query step holds one token per window in one ubatch
    shape.n_seq_max     = std::max<int32_t>(1, std::min<int32_t>((int32_t) llama_max_parallel_sequences(),
            sp->n_ubatch));
    shape.n_look_max    = common_spec_prefill_lookahead_max(sp->params.lookahead);
    return shape;
}

// what the request asks of its plan
static common_spec_prefill_plan_params spec_prefill_plan_params(const common_spec_prefill_request & req) {
    return { req.n_past, req.window, req.select.keep_last };
}

// the layers a graph scoring with the first n_layers is built with (0: all): fewer only where the architecture builds
// fewer (the probe saw it) and LLAMA_SPEC_PREFILL_LAYER_STOP is not 0
static int32_t spec_prefill_graph_layers(const common_spec_prefill * sp, int32_t n_layers) {
    return n_layers < sp->n_layer && sp->graph_cut && sp->layer_stop ? n_layers : 0;
}

// run both kinds of graph once (a prefill ubatch, and a query step that also outputs attention weights), so that
// first-use costs (kernel loading, pipeline compiles) do not land on the first prompt
static void spec_prefill_warmup(common_spec_prefill * sp) {
    llama_context * ctx = sp->ctx.get();
    llama_set_graph_n_layer(ctx, sp->ctx_n_layer); // every layer the context holds, whatever the last request scored with
    const llama_token tok = llama_vocab_bos(sp->vocab) >= 0 ? llama_vocab_bos(sp->vocab) : 0;
    const int32_t n_prefill = std::min(sp->n_ubatch, sp->ctx_n_cells - 1);

    llama_batch batch = llama_batch_init(std::max(n_prefill, sp->ctx_n_seq), 0, 1);
    for (int32_t i = 0; i < n_prefill; ++i) {
        spec_prefill_batch_add(batch, tok, i, 0, false);
    }
    bool ok = llama_decode(ctx, batch) == 0;
    batch.n_tokens = 0;
    for (int32_t s = 0; s < sp->ctx_n_seq; ++s) {
        spec_prefill_batch_add(batch, tok, s == 0 ? n_prefill : 0, s, true);
    }
    // the query step goes through the scoring too (its graph is made, sized and checked here), on streams marked done
    // for the host, so that nothing is folded into scores
    spec_prefill_run run(sp, nullptr);
    run.streams.assign(sp->ctx_n_seq, {});
    run.graph_streams.resize(sp->ctx_n_seq);
    for (int32_t s = 0; s < sp->ctx_n_seq; ++s) {
        const int32_t n_filled = s == 0 ? n_prefill + 1 : 1;
        run.streams[s].n_cells = n_filled;
        run.streams[s].done    = true;
        run.graph_streams[s]   = { 0, n_filled, n_filled, n_filled, true };
    }
    run.layer_usable = sp->layer_attn;
    run.n_usable     = 0; // nothing to check: the whole graph runs
    ok = ok && spec_prefill_decode_query(run, batch) == 0;
    const std::string error = run.capture_error;
    ok = ok && error.empty();
    llama_batch_free(batch);
    llama_memory_clear(llama_get_memory(ctx), false);
    if (!ok) {
        LOG_WRN("%s: the draft's warm-up failed%s%s\n", __func__, error.empty() ? "" : ": ", error.c_str());
    }
}

// (re)create the draft context when the plan needs more sequences or cells than the current one has; a prepared
// context keeps its cells: it is only reshaped into n_seq sequences that share them (plans are made to fit them)
// n_layer: the layers the graph is built with (0: all), whose KV the context must hold
static bool spec_prefill_ensure_ctx(common_spec_prefill * sp, int32_t n_seq, int32_t n_cells, int32_t n_layer) {
    const bool layers_held = sp->ctx_n_layer == 0 || (n_layer > 0 && n_layer <= sp->ctx_n_layer);
    if (sp->ctx && layers_held && sp->ctx_n_seq >= n_seq && sp->ctx_n_cells >= n_cells &&
            (sp->fixed_size || sp->ctx_n_seq == n_seq)) {
        return true;
    }
    // the KV of at least the layers a request scores with by default, so that one asking fewer keeps the context
    const int32_t n_layer_default = spec_prefill_graph_layers(sp, sp->n_layers);
    const int32_t n_layer_kv = n_layer == 0 || n_layer_default == 0 ? 0 : std::max(n_layer, n_layer_default);
    if (sp->fixed_size) {
        // each sequence gets an equal share of the cells, on llama.cpp's 256-cell grid (the prepared sequence
        // length is on it already), never longer than the prepared one
        const int32_t n_fixed     = common_spec_prefill_fixed_cells(spec_prefill_shape(sp));
        const int32_t n_cells_fit = std::min(n_fixed / std::max(1, n_seq) / 256 * 256, sp->fixed_n_cells);
        if (n_cells > n_cells_fit) {
            LOG_ERR("%s: a plan of %d x %d cells does not fit the prepared draft context of %d x %d\n", __func__,
                    n_seq, n_cells, sp->fixed_n_seq, sp->fixed_n_cells);
            return false;
        }
        n_cells = n_cells_fit;
    } else {
        // round up, so that slightly longer prompts reuse the context, but never past the cap on all cells
        const int32_t n_cells_padded = GGML_PAD(n_cells, 256);
        if ((int64_t) n_seq*n_cells_padded <= sp->n_ctx_max) {
            n_cells = n_cells_padded;
        }
    }
    sp->ctx.reset();
    {
        std::lock_guard<std::mutex> lock(sp->kv_mutex); // a new context holds nothing
        sp->kv_tokens.clear();
    }
    common_spec_prefill_graph_free(sp->graph); // it is shaped for the context
    sp->graph        = nullptr;
    sp->graph_failed = false;

    sp->ctx.reset(llama_init_from_model_n_layer(sp->model, spec_prefill_ctx_params(sp, n_seq, n_cells, sp->n_batch,
            sp->n_ubatch), (uint32_t) n_layer_kv));
    if (!sp->ctx) {
        sp->ctx_n_seq = sp->ctx_n_cells = sp->ctx_n_layer = 0;
        return false;
    }
    sp->ctx_n_layer = n_layer_kv;
    // the query steps decode one token per sequence: only they output attention weights (beside flash attention)
    llama_set_attn_weights_max_tokens(sp->ctx.get(), (uint32_t) n_seq);
    sp->ctx_n_seq   = n_seq;
    sp->ctx_n_cells = (int32_t) llama_n_ctx_seq(sp->ctx.get());
    sp->n_ctx_created++;
    if (sp->warmup) {
        spec_prefill_warmup(sp);
    }
    return true;
}

bool common_spec_prefill_prepare(common_spec_prefill * sp, int32_t n_prompt) {
    const llama_tokens dummy(std::max(1, n_prompt), 0);
    sp->fixed_size = false;
    common_spec_prefill_request req = common_spec_prefill_default_request(sp);
    if (req.window <= 0) {
        req.window = (int32_t) dummy.size(); // automatic windows, but room for a request that asks for the whole prompt
    }
    const auto plan = common_spec_prefill_make_plan(spec_prefill_shape(sp), dummy, spec_prefill_plan_params(req));
    int32_t n_cells = plan.n_cells;
    if (sp->params.window <= 0 && plan.windows.size() == 1) {
        // scored in full by default: room beside it for windows of COMMON_SPEC_PREFILL_WINDOW_PREPARED side by side,
        // where --spec-prefill-ctx allows all of them (fewer would save no round). The most cells a prompt's windows
        // take is the slot's prompt's, or that of the longest prompt whose windows are all full-sized (one window
        // fewer, each longer)
        req.window = COMMON_SPEC_PREFILL_WINDOW_PREPARED;
        int64_t n_cells_w = 0;
        for (const int32_t n : { n_prompt, n_prompt / req.window * req.window }) {
            const auto plan_w = common_spec_prefill_make_plan(spec_prefill_shape(sp), llama_tokens(std::max(1, n), 0),
                    spec_prefill_plan_params(req));
            if (plan_w.windows.size() > 1) {
                n_cells_w = std::max(n_cells_w, (int64_t) plan_w.windows.size() * GGML_PAD(plan_w.n_cells, 256));
            }
        }
        if (n_cells_w > n_cells && n_cells_w <= sp->n_ctx_max) {
            n_cells = (int32_t) n_cells_w;
        }
    }
    if (!spec_prefill_ensure_ctx(sp, plan.n_seq, n_cells, spec_prefill_graph_layers(sp, sp->n_layers))) {
        LOG_ERR("%s: cannot create a draft context of %d x %d cells\n", __func__, plan.n_seq, n_cells);
        return false;
    }
    sp->fixed_size    = true;
    sp->fixed_n_seq   = sp->ctx_n_seq;
    sp->fixed_n_cells = sp->ctx_n_cells;
    return true;
}

size_t common_spec_prefill_model_size(const common_spec_prefill * sp) {
    return sp->self ? 0 : llama_model_size(sp->model);
}

size_t common_spec_prefill_ctx_size(const common_spec_prefill * sp) {
    size_t size = 0;
    if (sp->ctx) {
        for (const auto & [buft, mb] : llama_get_memory_breakdown(sp->ctx.get())) {
            size += mb.context + mb.compute;
        }
    }
    return size;
}

const llama_model * common_spec_prefill_model(const common_spec_prefill * sp) {
    return sp->model;
}

bool common_spec_prefill_is_self(const common_spec_prefill * sp) {
    return sp->self;
}

int32_t common_spec_prefill_n_layers(const common_spec_prefill * sp) {
    return sp->n_layers;
}

int32_t common_spec_prefill_n_layer(const common_spec_prefill * sp) {
    return sp->n_layer;
}

// how many tokens a and b begin with alike, at most n_max
static int32_t spec_prefill_common_prefix(const llama_tokens & a, const llama_tokens & b, int32_t n_max) {
    const int32_t n = std::min({ (int32_t) a.size(), (int32_t) b.size(), n_max });
    int32_t i = 0;
    while (i < n && a[i] == b[i]) {
        i++;
    }
    return i;
}

int32_t common_spec_prefill_n_draft_past(common_spec_prefill * sp, const llama_tokens & prompt,
        const common_spec_prefill_request & req, const llama_tokens * before) {
    const int32_t n_prompt = (int32_t) prompt.size();
    const int32_t n_past   = common_spec_prefill_n_past(req.n_past, n_prompt);
    // the context before the new tokens that the first window re-reads: all of it where the draft's context has room,
    // one window of it where the new tokens take several (common_spec_prefill_make_plan's, told from the constant
    // cap: the context's current shape is the scoring thread's)
    const int32_t n_new  = n_prompt - n_past;
    const int32_t window = common_spec_prefill_window_size(req.window, n_new);
    const int32_t n_room = sp->n_ctx_max - std::min(n_new, COMMON_SPEC_PREFILL_WINDOW_PREPARED) -
            std::max(COMMON_SPEC_PREFILL_N_QUESTION_MIN, req.select.keep_last) -
            common_spec_prefill_lookahead_max(sp->params.lookahead);
    int32_t n_read = std::min(n_past, std::max(0, n_room));
    if (window > 0 && n_new > window) {
        n_read = std::min(n_read, window);
    }
    int32_t n_held = 0;
    if (n_read == n_past && before) {
        n_held = sp->kv_reuse ? spec_prefill_common_prefix(*before, prompt, n_past) : 0;
    } else if (n_read == n_past) {
        std::lock_guard<std::mutex> lock(sp->kv_mutex);
        n_held = spec_prefill_common_prefix(sp->kv_tokens, prompt, n_past);
    }
    return n_read - n_held;
}

common_spec_prefill_request common_spec_prefill_default_request(const common_spec_prefill * sp) {
    common_spec_prefill_request req;
    req.select     = sp->params.select;
    req.min_tokens = sp->params.min_tokens;
    req.window     = sp->params.window;
    req.lookahead  = sp->params.lookahead;
    req.n_layers   = sp->n_layers;
    return req;
}

//
// scoring
//

// score one round of windows, side by side as the sequences of one batch; writes their scores into `scores`
//
// The query rows: with every layer, the window's last token and n_look - 1 greedy lookahead tokens after it; with the
// first n_layers only there are no logits to pick them from, so they are the window's last n_look tokens themselves
// (the prompt's end, where the question is), prefilled one step at a time
static bool spec_prefill_score_round(spec_prefill_run & run,
        const std::vector<common_spec_prefill_window_seq *> & round,
        int32_t n_look, int32_t n_layers, common_spec_prefill_result & res, std::string & error) {
    common_spec_prefill * sp = run.sp;
    llama_context * ctx = sp->ctx.get();
    llama_memory_t  mem = llama_get_memory(ctx);
    const int32_t n_seq  = (int32_t) round.size();
    const bool tail_rows = n_layers < sp->n_layer;

    // the rows come from the tail: as many as the shortest sequence has tokens after its first
    int32_t n_len_min = INT32_MAX;
    for (const auto * w : round) {
        n_len_min = std::min(n_len_min, (int32_t) w->tokens.size());
    }
    if (tail_rows) {
        n_look = std::max(1, std::min(n_look, n_len_min - 1));
    }
    // tokens of each sequence the query steps decode: its last one, or its last n_look
    const int32_t n_query_own = tail_rows ? n_look : 1;

    // a single sequence may start on the KV the last round kept: the tokens both begin with, up to its query tokens
    const bool keep_kv = n_seq == 1 && sp->kv_reuse;
    int32_t n_reuse = 0;
    if (keep_kv && run.continuation && sp->kv_n_layer == sp->graph_n_layer) {
        n_reuse = spec_prefill_common_prefix(sp->kv_tokens, round[0]->tokens,
                (int32_t) round[0]->tokens.size() - n_query_own);
    }
    {
        std::lock_guard<std::mutex> lock(sp->kv_mutex);
        sp->kv_tokens.clear();
    }
    if (n_reuse == 0 || !llama_memory_seq_rm(mem, 0, n_reuse, -1)) {
        n_reuse = 0;
        llama_memory_clear(mem, false);
    }
    res.n_draft_reused += n_reuse;

    // which layers see every key of the longest sequence of this round
    int32_t n_cells_max = 0;
    for (const auto * w : round) {
        n_cells_max = std::max(n_cells_max, (int32_t) w->tokens.size() + (tail_rows ? 0 : n_look));
    }
    run.n_usable = 0;
    for (int32_t il = 0; il < sp->n_layer; ++il) {
        run.layer_usable[il] = il < n_layers && sp->layer_attn[il] &&
                (!llama_model_is_swa_layer(sp->model, il) || sp->n_swa >= n_cells_max);
        run.n_usable += run.layer_usable[il];
    }

    llama_batch batch = llama_batch_init(std::max(sp->n_batch, n_seq), 0, 1);
    // where the prefill's time goes, for the debug log: in llama_decode (building, queueing, or waiting for the
    // device when its queue is full) against waiting for the device at the end
    int32_t n_decodes = 0;
    int64_t t_decode_us = 0;
    int64_t t_decode_max_us = 0;
    auto flush = [&](bool query = false) -> bool {
        if (batch.n_tokens == 0) {
            return true;
        }
        if (run.cancelled()) {
            batch.n_tokens = 0;
            error = "cancelled";
            return false;
        }
        const int64_t t_decode = ggml_time_us();
        const int32_t ret = query ? spec_prefill_decode_query(run, batch) : llama_decode(ctx, batch);
        if (!query) {
            const int64_t t = ggml_time_us() - t_decode;
            n_decodes++;
            t_decode_us    += t;
            t_decode_max_us = std::max(t_decode_max_us, t);
        }
        batch.n_tokens = 0;
        if (ret != 0) {
            error = string_format("draft decode failed (%d)", ret);
            return false;
        }
        return true;
    };

    // 1. every window but its query tokens, with flash attention, no outputs. A window of a ubatch or more has batches
    // of its own: with one KV stream per window, a batch across two windows is split into ubatches of equal parts of
    // each, and the longer one's rest into a short ubatch; shorter windows share batches, or their ubatches would be
    // short
    const int64_t t_prefill = ggml_time_us();
    bool ok = true;
    for (int32_t s = 0; s < n_seq && ok; ++s) {
        const auto & toks = round[s]->tokens;
        const bool own_batches = (int32_t) toks.size() > sp->n_ubatch;
        if (own_batches) {
            ok = flush();
        }
        res.n_draft_prefilled += std::max(0, (int32_t) toks.size() - n_query_own - (s == 0 ? n_reuse : 0));
        for (int32_t p = s == 0 ? n_reuse : 0; p + n_query_own < (int32_t) toks.size() && ok; ++p) {
            spec_prefill_batch_add(batch, toks[p], p, s, false);
            if (batch.n_tokens == sp->n_batch) {
                ok = flush();
            }
        }
        if (own_batches) {
            ok = ok && flush();
        }
    }
    ok = ok && flush();
    const int64_t t_sync = ggml_time_us();
    llama_synchronize(ctx);
    res.t_draft_prefill_ms += (ggml_time_us() - t_prefill) / 1000.0;
    LOG_DBG("%s: draft prefill of %d windows: %.1f ms, of which %d llama_decode calls %.1f ms (longest %.1f ms), "
            "the final wait for the device %.1f ms\n", __func__, n_seq, (ggml_time_us() - t_prefill) / 1000.0,
            n_decodes, t_decode_us / 1000.0, t_decode_max_us / 1000.0, (ggml_time_us() - t_sync) / 1000.0);

    // each sequence's attention KV holds positions [0, len - n_query_own), all of them (hybrid memory reports the
    // recurrent state's single position as its range, so look at the attention positions themselves)
    for (int32_t s = 0; s < n_seq && ok; ++s) {
        const int32_t n_held = (int32_t) round[s]->tokens.size() - n_query_own;
        const std::vector<llama_pos> held = llama_memory_seq_positions(mem, s);
        if (n_held > 0 && ((int32_t) held.size() != n_held || held.front() != 0 || held.back() != n_held - 1)) {
            error = string_format("draft sequence %d holds %zu attention positions, expected 0 to %d", s, held.size(),
                    n_held - 1);
            ok = false;
        }
    }

    // 2. query steps, one token per sequence: the prompt's last token, then greedy lookahead tokens (or the last
    // n_look tokens)
    const int64_t t_query = ggml_time_us();
    run.streams.assign(n_seq, {});
    for (int32_t s = 0; s < n_seq; ++s) {
        auto & st = run.streams[s];
        st.n_keys = round[s]->end - round[s]->begin;
        st.scores = common_spec_prefill_scores_init(st.n_keys, sp->params.pool_kernel,
                std::max(1, sp->n_threads_batch / n_seq));
        st.key0   = round[s]->key0;
        st.n_norm = (int32_t) round[s]->tokens.size();
    }
    run.graph_streams.resize(n_seq);
    std::vector<llama_token> next(n_seq);
    for (int32_t s = 0; s < n_seq; ++s) {
        next[s] = round[s]->tokens.back();
    }

    const int32_t n_vocab = llama_vocab_n_tokens(sp->vocab);
    for (int32_t k = 0; k < n_look && ok; ++k) {
        for (int32_t s = 0; s < n_seq; ++s) {
            auto & st = run.streams[s];
            const int32_t pos = (int32_t) round[s]->tokens.size() - n_query_own + k;
            st.n_cells = pos + 1;
            st.n_added = 0;
            if (!st.done) {
                common_spec_prefill_scores_begin_row(st.scores);
            }
            // finished sequences still decode, so that every step holds all streams in order
            spec_prefill_batch_add(batch, tail_rows ? round[s]->tokens[pos] : next[s], pos, s, !tail_rows);
            run.graph_streams[s] = { st.key0, st.n_keys, st.n_norm, st.n_cells, !st.done };
        }
        ok = flush(/*query =*/ true);
        if (ok && !run.capture_error.empty()) {
            error = run.capture_error;
            ok = false;
        }
        bool all_done = true;
        for (int32_t s = 0; s < n_seq && ok; ++s) {
            auto & st = run.streams[s];
            if (st.done) {
                continue;
            }
            if (st.n_added == 0) {
                error = string_format("no attention rows were captured: no draft layer sees all %d tokens of a "
                        "window (sliding window %d); lower --spec-prefill-window", n_cells_max, sp->n_swa);
                ok = false;
                break;
            }
            common_spec_prefill_scores_end_row(st.scores);
            res.n_rows++;
            if (tail_rows) {
                all_done = false;
                continue;
            }

            const float * logits = llama_get_logits_ith(ctx, s);
            next[s] = (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
            st.done = llama_vocab_is_eog(sp->vocab, next[s]);
            all_done = all_done && st.done;
        }
        if (all_done) {
            break;
        }
    }

    res.t_query_ms += (ggml_time_us() - t_query) / 1000.0;

    for (int32_t s = 0; s < n_seq; ++s) {
        if (ok) {
            // renormalised over n_norm keys, a window's rows compare to a full-prompt row once scaled by
            // n_norm / n_prompt (a uniform row then scores 1/n_prompt everywhere)
            const float scale = (float) run.streams[s].n_norm / (float) res.n_prompt;
            common_spec_prefill_scores_get(run.streams[s].scores, scale, res.scores.data() + round[s]->begin);
        }
        common_spec_prefill_scores_free(run.streams[s].scores);
    }
    run.streams.clear();
    llama_batch_free(batch);
    // the query steps' first token is the sequence's last (or its last n_look are the sequence's own): positions
    // [0, len) hold the sequence, the greedy tokens after it are dropped
    const int32_t n_len = (int32_t) round[0]->tokens.size();
    if (ok && keep_kv && llama_memory_seq_rm(mem, 0, n_len, -1)) {
        std::lock_guard<std::mutex> lock(sp->kv_mutex);
        sp->kv_tokens  = round[0]->tokens;
        sp->kv_n_layer = sp->graph_n_layer;
    } else {
        llama_memory_clear(mem, false);
    }
    return ok;
}

common_spec_prefill_result common_spec_prefill_run(common_spec_prefill * sp, const llama_tokens & prompt,
        const common_spec_prefill_request & req) {
    const int64_t t_start = ggml_time_us();

    common_spec_prefill_result res;
    res.n_prompt = (int32_t) prompt.size();
    res.n_past   = common_spec_prefill_n_past(req.n_past, res.n_prompt);
    auto full = [&](enum common_spec_prefill_status status, const std::string & reason) {
        res.status = status;
        res.reason = reason;
        res.kept.resize(status == COMMON_SPEC_PREFILL_CANCELLED ? 0 : res.n_prompt - res.n_past);
        std::iota(res.kept.begin(), res.kept.end(), res.n_past);
        res.t_score_ms = (ggml_time_us() - t_start) / 1000.0;
        return res;
    };

    common_spec_prefill_settings asked;
    asked.select = req.select;
    if (const std::string problem = common_spec_prefill_settings_check(asked); !problem.empty()) {
        return full(COMMON_SPEC_PREFILL_FAILED, problem.c_str());
    }
    const int32_t n_look     = req.lookahead == 0 ? sp->params.lookahead : req.lookahead;
    const int32_t n_look_max = common_spec_prefill_lookahead_max(sp->params.lookahead);
    if (n_look < 1 || n_look > n_look_max) {
        return full(COMMON_SPEC_PREFILL_FAILED, string_format("lookahead %d is outside [1, %d] (the draft context has "
                "room for max(--spec-prefill-lookahead, 8) rows)", n_look, n_look_max));
    }
    if (const char * dev = spec_prefill_lost_device(sp)) {
        return full(COMMON_SPEC_PREFILL_FAILED, spec_prefill_lost_reason(dev));
    }
    // the first n_layers layers score: the request's, at most all of them
    const int32_t n_layers = req.n_layers > 0 ? std::min(req.n_layers, sp->n_layer) : sp->n_layers;
    if (const std::string problem = spec_prefill_layers_problem(sp, n_layers); !problem.empty()) {
        return full(COMMON_SPEC_PREFILL_FAILED, "the scorer: " + problem);
    }
    const int32_t n_new = res.n_prompt - res.n_past;
    if (n_new < std::max(1, req.min_tokens)) {
        return full(COMMON_SPEC_PREFILL_SHORT, string_format("%d new prompt tokens, below the minimum of %d "
                "(--spec-prefill-min-tokens)", n_new,
                req.min_tokens));
    }

    auto plan = common_spec_prefill_make_plan(spec_prefill_shape(sp), prompt, spec_prefill_plan_params(req));
    for (const auto & w : plan.windows) {
        res.windows.push_back({ w.begin, w.end });
    }
    res.n_windows  = (int32_t) plan.windows.size();
    res.n_parallel = plan.n_seq;

    const int64_t t_setup = ggml_time_us();
    const int32_t n_created = sp->n_ctx_created;
    // the graph of a K-layer model over the same weights (patch 0016): the layers after K are not computed
    const int32_t n_graph_layer = spec_prefill_graph_layers(sp, n_layers);
    bool have_ctx = spec_prefill_ensure_ctx(sp, plan.n_seq, plan.n_cells, n_graph_layer);
    if (!have_ctx && sp->fixed_size && !sp->reshape_off) {
        // the reshape failed (memory): back to the prepared shape, for this request and the ones after it
        LOG_WRN("%s: cannot reshape the draft context into %d x %d cells; keeping %d x %d from now on\n", __func__,
                plan.n_seq, plan.n_cells, sp->fixed_n_seq, sp->fixed_n_cells);
        sp->reshape_off = true;
        have_ctx = spec_prefill_ensure_ctx(sp, sp->fixed_n_seq, sp->fixed_n_cells, n_graph_layer);
        if (have_ctx) {
            plan = common_spec_prefill_make_plan(spec_prefill_shape(sp), prompt, spec_prefill_plan_params(req));
            res.n_parallel = plan.n_seq;
        }
    }
    if (!have_ctx) {
        return full(COMMON_SPEC_PREFILL_FAILED, string_format("cannot create a draft context of %d x %d cells",
                plan.n_seq, plan.n_cells));
    }
    res.t_setup_ms    = sp->n_ctx_created == n_created ? 0.0 : (ggml_time_us() - t_setup) / 1000.0;
    res.n_draft_cells = sp->ctx_n_seq * sp->ctx_n_cells;

    res.scores.assign(res.n_prompt, 0.0f);
    llama_set_graph_n_layer(sp->ctx.get(), n_graph_layer);
    sp->graph_n_layer = n_graph_layer;
    res.n_layers_run = n_graph_layer > 0 ? n_graph_layer : sp->n_layer;
    spec_prefill_run run(sp, req.cancel);
    run.continuation = res.n_past > 0;

    std::string error;
    for (size_t w0 = 0; w0 < plan.windows.size(); w0 += plan.n_seq) {
        std::vector<common_spec_prefill_window_seq *> round;
        for (size_t w = w0; w < std::min(plan.windows.size(), w0 + plan.n_seq); ++w) {
            round.push_back(&plan.windows[w]);
        }
        if (!spec_prefill_score_round(run, round, n_look, n_layers, res, error)) {
            res.scores.clear();
            if (run.cancelled()) {
                return full(COMMON_SPEC_PREFILL_CANCELLED, "cancelled");
            }
            if (const char * dev = spec_prefill_lost_device(sp)) {
                error = spec_prefill_lost_reason(dev) + " (" + error + ")";
            }
            LOG_WRN("%s: scoring failed, prefilling in full: %s\n", __func__, error.c_str());
            return full(COMMON_SPEC_PREFILL_FAILED, "scoring failed: " + error);
        }
    }
    // a connection lost after the last graph was queued leaves zeros where the attention rows would be
    if (const char * dev = spec_prefill_lost_device(sp)) {
        res.scores.clear();
        return full(COMMON_SPEC_PREFILL_FAILED, "scoring failed: " + spec_prefill_lost_reason(dev));
    }
    res.n_layers = (int32_t) std::count(run.layer_seen.begin(), run.layer_seen.end(), 1);
    res.t_reduce_ms = run.t_reduce_us / 1000.0;
    if (run.n_reads_graph > 0) {
        res.reduced_on = ggml_backend_dev_name(common_spec_prefill_graph_device(sp->graph));
    }
    if (run.n_reads_host > 0) {
        res.reduced_on += res.reduced_on.empty() ? "host" : "+host";
    }

    // select among the new tokens only; the always-kept head is part of a reused prefix, if there is one
    auto select = req.select;
    if (res.n_past > 0) {
        select.keep_first = 0;
    }
    std::vector<uint8_t> line_ends;
    if (select.chunk_lines || select.complete_lines || select.question_lines > 0) {
        line_ends = spec_prefill_line_ends(sp, prompt, res.n_past);
    }
    std::vector<std::string> pieces;
    if (select.question_lines > 0) {
        pieces.reserve(n_new);
        for (int32_t i = res.n_past; i < res.n_prompt; ++i) {
            pieces.push_back(spec_prefill_piece(sp, prompt[i]));
        }
    }
    std::vector<uint8_t> protect;
    for (const auto & span : req.protect) {
        const int32_t b = std::max(span.begin, res.n_past) - res.n_past;
        const int32_t e = std::min(span.end, res.n_prompt) - res.n_past;
        if (b < e) {
            protect.resize(n_new, 0);
            std::fill(protect.begin() + b, protect.begin() + e, 1);
        }
    }
    auto kept = common_spec_prefill_select(res.scores.data() + res.n_past, n_new, select,
            line_ends.empty() ? nullptr : line_ends.data(), pieces.empty() ? nullptr : pieces.data(),
            protect.empty() ? nullptr : protect.data());
    if ((int32_t) kept.size() >= n_new) {
        return full(COMMON_SPEC_PREFILL_KEPT_ALL, "the selection kept every token");
    }
    for (auto & pos : kept) {
        pos += res.n_past;
    }
    res.status     = COMMON_SPEC_PREFILL_SPARSE;
    res.kept       = std::move(kept);
    res.t_score_ms = (ggml_time_us() - t_start) / 1000.0;
    return res;
}

int32_t common_spec_prefill_decode(llama_context * ctx, llama_seq_id seq, const llama_tokens & prompt,
        const std::vector<int32_t> & kept, int32_t n_batch) {
    n_batch = std::max(1, n_batch);
    llama_batch batch = llama_batch_init(n_batch, 0, 1);
    int32_t ret = 0;
    for (size_t i0 = 0; i0 < kept.size() && ret == 0; i0 += n_batch) {
        const size_t i1 = std::min(kept.size(), i0 + n_batch);
        batch.n_tokens = 0;
        for (size_t i = i0; i < i1; ++i) {
            spec_prefill_batch_add(batch, prompt[kept[i]], kept[i], seq, i + 1 == kept.size());
        }
        ret = llama_decode(ctx, batch);
    }
    llama_batch_free(batch);
    return ret;
}
