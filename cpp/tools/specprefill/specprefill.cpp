// llama-specprefill: speculative prefill of one prompt, with its phases timed, and optionally the same prompt with a
// full prefill in the same process for comparison (--baseline). See common/spec-prefill.h.

#include "arg.h"
#include "common.h"
#include "json.h"
#include "log.h"
#include "sampling.h"
#include "spec-prefill.h"
#include "llama.h"
#include "../src/llama-ext.h"

#include <algorithm>
#include <clocale>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

// this tool's own options, taken out of argv before the common parser sees it
struct tool_options {
    bool        baseline = false;
    bool        warmup   = true; // --no-warmup: no warm-up runs before the clock (quicker, the first TTFT cold)
    int         repeat   = 1;
    std::string json_path;
};

static bool take_tool_options(int & argc, char ** argv, tool_options & opts) {
    int out = 1;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--baseline") == 0) {
            opts.baseline = true;
        } else if (strcmp(argv[i], "--no-warmup") == 0) {
            opts.warmup = false;
        } else if (strcmp(argv[i], "--repeat") == 0) {
            opts.repeat = i + 1 < argc ? atoi(argv[++i]) : 0;
            if (opts.repeat < 1) {
                fprintf(stderr, "error: --repeat needs a count of at least 1\n");
                return false;
            }
        } else if (strcmp(argv[i], "--json") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "error: --json needs a file name\n");
                return false;
            }
            opts.json_path = argv[++i];
        } else {
            if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
                printf("llama-specprefill -m TARGET -mpd DRAFT|self (-p PROMPT | -f FILE) [options]\n\n"
                       "  --baseline     also prefill the whole prompt in this process and compare the TTFTs\n"
                       "  --repeat N     run the prompt N times (each with its baseline) and report the last run, as a\n"
                       "                 long-running server would see it; every run's TTFT is printed\n"
                       "  --json FILE    write the kept positions, the per-token scores and the timings as JSON\n"
                       "  --no-warmup    no warm-up runs of the target and the draft before the clock: a quicker\n"
                       "                 start, with first-use costs in the TTFTs (for checks of what is kept)\n\n");
            }
            argv[out++] = argv[i];
        }
    }
    argc = out;
    return true;
}

struct run_result {
    double t_score_ms   = 0.0;
    double t_setup_ms   = 0.0;
    double t_prefill_ms = 0.0;
    double t_ttft_ms    = 0.0;
    double t_decode_ms  = 0.0;
    int    n_prefilled  = 0;
    std::vector<llama_token> tokens; // generated
    std::string text;
    std::vector<llama_pos> kv_positions; // what the target's attention KV holds afterwards
    common_spec_prefill_result sp;
};

static double ms_since(int64_t t_us) {
    return (ggml_time_us() - t_us) / 1000.0;
}

// prefill `kept` (all positions for a full prefill), then generate; the TTFT clock starts before the scoring
static bool run_prompt(llama_context * ctx, common_params & params, const llama_tokens & prompt,
        common_spec_prefill * sp, run_result & out) {
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));
    llama_memory_clear(llama_get_memory(ctx), false);

    const int64_t t_start = ggml_time_us();
    if (sp) {
        out.sp = common_spec_prefill_run(sp, prompt, common_spec_prefill_default_request(sp));
        out.t_score_ms = out.sp.t_score_ms;
        out.t_setup_ms = out.sp.t_setup_ms;
    } else {
        out.sp.status   = COMMON_SPEC_PREFILL_KEPT_ALL;
        out.sp.n_prompt = (int32_t) prompt.size();
        out.sp.kept.resize(prompt.size());
        std::iota(out.sp.kept.begin(), out.sp.kept.end(), 0);
    }

    const int64_t t_prefill = ggml_time_us();
    llama_set_allow_pos_gaps(ctx, out.sp.sparse());
    if (common_spec_prefill_decode(ctx, 0, prompt, out.sp.kept, params.n_batch) != 0) {
        LOG_ERR("%s: prefill of %zu tokens failed\n", __func__, out.sp.kept.size());
        return false;
    }
    out.n_prefilled  = (int) out.sp.kept.size();
    out.t_prefill_ms = ms_since(t_prefill);

    common_sampler * smpl = common_sampler_init(llama_get_model(ctx), params.sampling);
    llama_token id = common_sampler_sample(smpl, ctx, -1);
    common_sampler_accept(smpl, id, true);
    out.t_ttft_ms = ms_since(t_start);

    const int n_ctx   = (int) llama_n_ctx(ctx);
    const int n_limit = params.n_predict < 0 ? n_ctx - (int) prompt.size() : params.n_predict;
    const int64_t t_decode = ggml_time_us();
    bool ok = true;
    while (true) {
        if (llama_vocab_is_eog(vocab, id)) {
            break;
        }
        out.tokens.push_back(id);
        out.text += common_token_to_piece(ctx, id);
        if ((int) out.tokens.size() >= n_limit) {
            break;
        }
        // generation continues at position N (the full prompt length), also after a sparse prefill
        llama_batch batch = llama_batch_get_one(&id, 1);
        if (llama_decode(ctx, batch) != 0) {
            LOG_ERR("%s: decode failed after %zu tokens\n", __func__, out.tokens.size());
            ok = false;
            break;
        }
        id = common_sampler_sample(smpl, ctx, -1);
        common_sampler_accept(smpl, id, true);
    }
    out.t_decode_ms = ms_since(t_decode);
    common_sampler_free(smpl);

    out.kv_positions = llama_memory_seq_positions(llama_get_memory(ctx), 0);
    return ok;
}

static void print_run(const char * title, const run_result & r) {
    LOG("%s\n", title);
    if (r.t_score_ms > 0.0) {
        LOG("  score      %9.1f ms", r.t_score_ms);
        LOG("  (draft prefill %.1f ms, query steps %.1f ms of which reduction %.1f ms", r.sp.t_draft_prefill_ms,
                r.sp.t_query_ms, r.sp.t_reduce_ms);
        if (r.t_setup_ms > 0.0) {
            LOG(", draft context setup %.1f ms", r.t_setup_ms);
        }
        LOG(")");
        LOG("\n");
    }
    LOG("  prefill    %9.1f ms  %d tokens\n", r.t_prefill_ms, r.n_prefilled);
    LOG("  TTFT       %9.1f ms\n", r.t_ttft_ms);
    LOG("  decode     %9.1f ms  %zu tokens (%.1f t/s)\n", r.t_decode_ms, r.tokens.size(),
            r.t_decode_ms > 0.0 ? 1000.0 * r.tokens.size() / r.t_decode_ms : 0.0);
}

static common_json run_json(const run_result & r) {
    common_json j;
    j["prefill_ms"]   = r.t_prefill_ms;
    j["ttft_ms"]      = r.t_ttft_ms;
    j["decode_ms"]    = r.t_decode_ms;
    j["n_prefilled"]  = r.n_prefilled;
    j["n_decoded"]    = (int) r.tokens.size();
    j["tokens"]       = std::vector<int>(r.tokens.begin(), r.tokens.end());
    j["text"]         = r.text;
    j["kv_positions"] = std::vector<int>(r.kv_positions.begin(), r.kv_positions.end());
    return j;
}

static int run(int argc, char ** argv) {
    tool_options opts;
    if (!take_tool_options(argc, argv, opts)) {
        return 1;
    }

    common_params params;
    common_init();
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_SPECULATIVE)) {
        return 1;
    }
    params.spec_prefill.enabled = true;
    params.warmup               = opts.warmup;

    if (params.prompt.empty()) {
        LOG_ERR("error: empty prompt: pass -p PROMPT or -f FILE\n");
        return 1;
    }
    const auto & draft = !params.spec_prefill.mparams.path.empty() ? params.spec_prefill.mparams : params.speculative.draft.mparams;
    if (draft.path.empty()) {
        if (!params.spec_prefill.mparams.hf_repo.empty()) {
            LOG_ERR("error: the draft '%s' (--spec-prefill-hf) is neither downloaded nor in the cache%s\n",
                    params.spec_prefill.mparams.hf_repo.c_str(), params.offline ? " (--offline)" : "");
        } else {
            LOG_ERR("error: no draft model: pass -mpd DRAFT (the model that scores the prompt), or -mpd "
                    COMMON_SPEC_PREFILL_SELF " (the target's first layers)\n");
        }
        return 1;
    }
    if (draft.path != COMMON_SPEC_PREFILL_SELF && !std::ifstream(draft.path).good()) {
        LOG_ERR("error: draft model '%s' not found\n", draft.path.c_str());
        return 1;
    }

    llama_backend_init();
    llama_numa_init(params.numa);

    auto init = common_init_from_params(params);
    llama_model   * model = init->model();
    llama_context * ctx   = init->context();
    if (model == nullptr || ctx == nullptr) {
        LOG_ERR("error: failed to load the target model '%s'\n", params.model.path.c_str());
        return 1;
    }

    const llama_tokens prompt = common_tokenize(ctx, params.prompt, true, true);
    const int n_prompt = (int) prompt.size();
    const int n_ctx    = (int) llama_n_ctx(ctx);
    if (n_prompt == 0) {
        LOG_ERR("error: empty prompt: it has no tokens\n");
        return 1;
    }
    if (n_prompt + std::max(params.n_predict, 1) > n_ctx) {
        LOG_ERR("error: the prompt (%d tokens) and %d generated tokens do not fit the target context (%d tokens); "
                "raise -c or shorten the prompt\n", n_prompt, std::max(params.n_predict, 1), n_ctx);
        return 1;
    }

    std::string error;
    common_spec_prefill * sp = common_spec_prefill_init(params, model, nullptr, error);
    if (sp == nullptr) {
        LOG_ERR("error: %s\n", error.c_str());
        return 1;
    }
    // a warm process, as a server is: the target's prefill kernels run once before the clock (the draft's context
    // warms itself up when it is made)
    if (opts.warmup) {
        const int32_t n_warm = std::min<int32_t>(n_prompt, params.n_ubatch);
        const llama_tokens head(prompt.begin(), prompt.begin() + n_warm);
        std::vector<int32_t> all(n_warm);
        std::iota(all.begin(), all.end(), 0);
        common_spec_prefill_decode(ctx, 0, head, all, params.n_batch);
        llama_memory_clear(llama_get_memory(ctx), false);
    }

    // the draft context a long prompt needs is made once per shape (a server keeps it); make it before the clock
    const int64_t t_setup = ggml_time_us();
    if (!common_spec_prefill_prepare(sp, n_prompt)) {
        common_spec_prefill_free(sp);
        return 1;
    }
    const double t_setup_ms = ms_since(t_setup);

    run_result base;
    run_result spec;
    common_json repeats = common_json::array();
    for (int r = 0; r < opts.repeat; ++r) {
        base = run_result();
        spec = run_result();
        if (opts.baseline && !run_prompt(ctx, params, prompt, nullptr, base)) {
            common_spec_prefill_free(sp);
            return 1;
        }
        if (!run_prompt(ctx, params, prompt, sp, spec)) {
            common_spec_prefill_free(sp);
            return 1;
        }
        common_json rj;
        rj["ttft_ms"]          = spec.t_ttft_ms;
        rj["score_ms"]         = spec.t_score_ms;
        rj["draft_prefill_ms"] = spec.sp.t_draft_prefill_ms;
        rj["query_ms"]         = spec.sp.t_query_ms;
        rj["reduce_ms"]        = spec.sp.t_reduce_ms;
        rj["prefill_ms"]       = spec.t_prefill_ms;
        if (opts.baseline) {
            rj["baseline_ttft_ms"] = base.t_ttft_ms;
        }
        if (opts.repeat > 1) {
            LOG_INF("run %d of %d: TTFT %.1f ms (score %.1f ms: draft prefill %.1f ms, query steps %.1f ms)%s\n", r + 1,
                    opts.repeat, spec.t_ttft_ms, spec.t_score_ms, spec.sp.t_draft_prefill_ms, spec.sp.t_query_ms,
                    opts.baseline ? string_format(", baseline TTFT %.1f ms", base.t_ttft_ms).c_str() : "");
        }
        repeats.push_back(rj);
    }

    const auto & res = spec.sp;
    LOG("\n%s\n\n", spec.text.c_str());
    LOG("speculative prefill: %s, kept %zu of %d prompt tokens (%.1f%%)", common_spec_prefill_status_name(res.status),
            res.kept.size(), n_prompt, 100.0 * res.kept.size() / n_prompt);
    if (!res.reason.empty()) {
        LOG(": %s", res.reason.c_str());
    }
    LOG("\n  %d window(s), %d side by side, %d query rows, %d scorer layers read of %d computed, reduced on %s; "
            "draft context setup %.1f ms\n", res.n_windows, res.n_parallel, res.n_rows, res.n_layers, res.n_layers_run,
            res.reduced_on.empty() ? "-" : res.reduced_on.c_str(), t_setup_ms);
    print_run("speculative prefill", spec);
    if (opts.baseline) {
        print_run("baseline (full prefill)", base);
        LOG("TTFT speedup %.2fx; generated tokens %s\n", base.t_ttft_ms / spec.t_ttft_ms,
                base.tokens == spec.tokens ? "identical" : "differ");
    }

    if (!opts.json_path.empty()) {
        common_json j;
        std::vector<std::string> pieces;
        for (llama_token t : prompt) {
            pieces.push_back(common_token_to_piece(ctx, t));
        }
        j["n_prompt"]       = n_prompt;
        j["prompt_pieces"]  = pieces;
        j["status"]         = common_spec_prefill_status_name(res.status);
        j["reason"]         = res.reason;
        j["n_windows"]      = res.n_windows;
        j["windows"]        = common_json::array();
        for (const auto & w : res.windows) {
            j["windows"].push_back(common_json::array({ w.begin, w.end }));
        }
        j["n_parallel"]     = res.n_parallel;
        j["draft_cells"]    = res.n_draft_cells;
        j["draft_reused"]   = res.n_draft_reused;
        j["n_rows"]         = res.n_rows;
        j["n_layers"]       = res.n_layers;
        j["n_layers_run"]   = res.n_layers_run;
        j["self"]           = common_spec_prefill_is_self(sp);
        j["reduced_on"]     = res.reduced_on;
        j["kept"]           = res.kept;
        j["scores"]         = res.scores;
        j["setup_ms"]       = t_setup_ms;
        j["score_ms"]       = spec.t_score_ms;
        j["score_setup_ms"] = spec.t_setup_ms;
        j["score_draft_prefill_ms"] = res.t_draft_prefill_ms;
        j["score_query_ms"] = res.t_query_ms;
        j["score_reduce_ms"] = res.t_reduce_ms;
        j["run"]            = run_json(spec);
        j["repeats"]        = repeats;
        if (opts.baseline) {
            j["baseline"] = run_json(base);
            j["speedup"]  = base.t_ttft_ms / spec.t_ttft_ms;
        }
        std::ofstream f(opts.json_path);
        f << j.dump_safe(1) << "\n"; // generated text can end inside a UTF-8 sequence
        if (!f.good()) {
            LOG_ERR("error: cannot write %s\n", opts.json_path.c_str());
            common_spec_prefill_free(sp);
            return 1;
        }
    }

    common_spec_prefill_free(sp);
    llama_backend_free();
    return 0;
}

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");

    const int ret = run(argc, argv);
    // the log has its own thread: flush it, or the last messages (errors included) are lost at exit
    common_log_flush(common_log_main());
    return ret;
}
