#pragma once

// Speculative prefill (Liu, Chen, Zhang, ICML 2025): a small draft model prefills the prompt, reads the attention
// that the prompt's last token and a few greedy lookahead tokens pay to each prompt token, and the target prefills
// only the important chunks, at their original positions. Lossy by design.
//
//   sp = common_spec_prefill_init(params, model_tgt, err);
//   res = common_spec_prefill_run(sp, prompt);            // res.kept: positions to prefill, res.status: what it did
//   llama_set_allow_pos_gaps(ctx_tgt, true);
//   common_spec_prefill_decode(ctx_tgt, seq, prompt, res.kept, n_batch);   // then generate from position N
//
// The draft runs in its own context (one sequence per scored window, cleared before each use, so KV cell j holds
// position j). Flash attention stays on; the 1-token query steps also output their attention weights, as a side
// branch (llama_set_attn_weights_max_tokens).

#include "common.h"

#include <string>
#include <vector>

enum common_spec_prefill_status {
    COMMON_SPEC_PREFILL_SPARSE,   // scored: the target prefills only `kept`
    COMMON_SPEC_PREFILL_SHORT,    // shorter than min_tokens: full prefill
    COMMON_SPEC_PREFILL_KEPT_ALL, // the selection kept every token: full prefill
    COMMON_SPEC_PREFILL_FAILED,   // scoring failed: full prefill, `reason` says why
};

// "sparse", "short", "kept_all" or "failed"
const char * common_spec_prefill_status_name(enum common_spec_prefill_status status);

struct common_spec_prefill_result {
    enum common_spec_prefill_status status = COMMON_SPEC_PREFILL_FAILED;

    std::string reason; // why the prompt was prefilled in full (empty when sparse)

    int32_t n_prompt = 0;
    std::vector<int32_t> kept;   // sorted positions for the target to prefill: all of them unless sparse
    std::vector<float>   scores; // per prompt token; empty when the prompt was not scored

    int32_t n_windows  = 0; // scored windows
    int32_t n_parallel = 0; // windows scored side by side as sequences of one batch
    int32_t n_rows     = 0; // query rows used, over all windows
    int32_t n_layers   = 0; // draft layers whose rows were used
    std::string reduced_on; // where the rows were reduced: a device ("CUDA0"), "host", or both ("CUDA0+host")

    double t_setup_ms         = 0.0; // (re)creating the draft context, when the prompt needed a bigger one
    double t_draft_prefill_ms = 0.0; // the draft's prefill of the windows (flash attention)
    double t_query_ms         = 0.0; // the query steps: lookahead decodes and the reduction of their attention
    double t_score_ms         = 0.0; // scoring and selection, setup included

    bool sparse() const { return status == COMMON_SPEC_PREFILL_SPARSE; }
};

struct common_spec_prefill;

// Load the draft (params.spec_prefill.mparams, else the speculative draft model) and check that its vocabulary is
// the target's. On failure: nullptr, and `error` says why.
struct common_spec_prefill * common_spec_prefill_init(const common_params & params, const struct llama_model * model_tgt,
        std::string & error);

void common_spec_prefill_free(struct common_spec_prefill * sp);

// Create the draft context a prompt of n_prompt tokens needs, ahead of time (common_spec_prefill_run does it when
// needed). Returns false and logs if it cannot be created.
bool common_spec_prefill_prepare(struct common_spec_prefill * sp, int32_t n_prompt);

// Score the prompt and select the tokens to prefill. Never fails: a problem gives a full-prefill result that says why.
struct common_spec_prefill_result common_spec_prefill_run(struct common_spec_prefill * sp, const llama_tokens & prompt);

// Decode prompt[kept[i]] at position kept[i] into sequence `seq` of `ctx`, n_batch tokens per call; the last kept
// token outputs logits (batch index: its index in the last call). Gaps need llama_set_allow_pos_gaps(ctx, true).
// Returns 0, or the failing llama_decode result.
int32_t common_spec_prefill_decode(struct llama_context * ctx, llama_seq_id seq, const llama_tokens & prompt,
        const std::vector<int32_t> & kept, int32_t n_batch);
