// Which kind of 1-token step before a prefill slows that prefill? The diagnostic behind docs/benchmarks.md's fifth
// run; not part of the build. In a built tree:
//   c++ -O2 -std=c++17 probe-replan.cpp -Iinclude -Iggml/include -Isrc -Lbuild/bin -lllama -lggml -lggml-base \
//       -Wl,-rpath,$PWD/build/bin -o build/bin/probe-replan && build/bin/probe-replan draft.gguf 32768
// "hook only around the step" was a first fix in the driver (re-creates the scheduler twice per round), replaced by
// the re-plan in patch 0004.
#include "llama.h"
#include "../src/llama-ext.h"
#include "ggml.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <string>

static bool cb_attn(ggml_tensor * t, bool ask, void *) {
    if (ask) return strncmp(t->name, "kq_soft_max-", 12) == 0;
    return true;
}

enum step_kind { STEP_NONE, STEP_PLAIN, STEP_HOOK, STEP_HOOK_CB, STEP_HOOK_CB_TOGGLE };

int main(int argc, char ** argv) {
    const char * path = argv[1];
    const int n = argc > 2 ? atoi(argv[2]) : 32768;
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = 99;
    llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) return 1;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::vector<llama_token> toks(n);
    for (int i = 0; i < n; ++i) toks[i] = (i * 7919 + 13) % (n_vocab - 1) + 1;

    struct { const char * name; step_kind kind; } vs[] = {
        {"no step between prefills",        STEP_NONE},
        {"plain 1-token step",              STEP_PLAIN},
        {"1-token step, weights hook",      STEP_HOOK},
        {"hook + eval callback (driver)",   STEP_HOOK_CB},
        {"hook only around the step",       STEP_HOOK_CB_TOGGLE},
        {"no step between prefills",        STEP_NONE},
    };
    for (const auto & v : vs) {
        auto cp = llama_context_default_params();
        cp.n_ctx = GGML_PAD(n + 9, 1024);
        cp.n_batch = 4096; cp.n_ubatch = 1024;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        cp.n_threads = cp.n_threads_batch = 16;
        cp.kv_unified = false; cp.n_seq_max = 1; cp.no_perf = true;
        llama_context * ctx = llama_init_from_model(model, cp);
        const bool hook_always = v.kind == STEP_HOOK || v.kind == STEP_HOOK_CB;
        if (hook_always) llama_set_attn_weights_max_tokens(ctx, 1);
        llama_batch b = llama_batch_init(4096, 0, 1);
        std::vector<double> t_dec;
        auto prefill = [&](int n_tok) {
            t_dec.clear();
            for (int i0 = 0; i0 < n_tok; i0 += 4096) {
                const int m = std::min(4096, n_tok - i0);
                for (int i = 0; i < m; ++i) {
                    b.token[i] = toks[i0 + i]; b.pos[i] = i0 + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 0;
                }
                b.n_tokens = m;
                const int64_t t0 = ggml_time_us();
                if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); exit(1); }
                t_dec.push_back((ggml_time_us() - t0) / 1000.0);
            }
            llama_synchronize(ctx);
        };
        auto step = [&](int pos) {
            if (v.kind == STEP_NONE) return;
            b.n_tokens = 1; b.token[0] = toks[0]; b.pos[0] = pos; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1;
            if (v.kind == STEP_HOOK_CB_TOGGLE) llama_set_attn_weights_max_tokens(ctx, 1);
            if (v.kind == STEP_HOOK_CB || v.kind == STEP_HOOK_CB_TOGGLE) llama_set_eval_callback(ctx, cb_attn, nullptr);
            llama_decode(ctx, b);
            llama_set_eval_callback(ctx, nullptr, nullptr);
            if (v.kind == STEP_HOOK_CB_TOGGLE) llama_set_attn_weights_max_tokens(ctx, 0);
            llama_synchronize(ctx);
        };
        prefill(1024);
        step(1024);
        llama_memory_clear(llama_get_memory(ctx), false);
        std::string line, first;
        for (int r = 0; r < 3; ++r) {
            const int64_t t0 = ggml_time_us();
            prefill(n);
            const double ms = (ggml_time_us() - t0) / 1000.0;
            char buf[64]; snprintf(buf, sizeof buf, " %.1f", ms); line += buf;
            if (r == 1) for (double d : t_dec) { snprintf(buf, sizeof buf, " %.0f", d); first += buf; }
            step(n);
            llama_memory_clear(llama_get_memory(ctx), false);
        }
        printf("%-34s n=%d ms:%s | rep 2 per decode:%s\n", v.name, n, line.c_str(), first.c_str());
        fflush(stdout);
        llama_batch_free(b);
        llama_free(ctx);
    }
    llama_model_free(model);
    return 0;
}
