#pragma once

// Speculative prefill (Liu, Chen, Zhang, ICML 2025): a small draft model prefills the prompt, reads the attention
// that the prompt's last token and a few greedy lookahead tokens pay to each prompt token, and the target prefills
// only the important chunks, at their original positions. Lossy by design.
//
//   sp  = common_spec_prefill_init(params, model_tgt, nullptr, err);
//   req = common_spec_prefill_default_request(sp);   // per-request settings, a cancel flag, a reused prefix
//   res = common_spec_prefill_run(sp, prompt, req);  // res.kept: positions to prefill, res.status: what it did
//   llama_set_allow_pos_gaps(ctx_tgt, true);
//   common_spec_prefill_decode(ctx_tgt, seq, prompt, res.kept, n_batch);   // then generate from position N
//
// The draft runs in its own context (one sequence per scored window, cleared before each use, so KV cell j holds
// position j). Flash attention stays on; the 1-token query steps also output their attention weights, as a side
// branch (llama_set_attn_weights_max_tokens). One object is used by one thread at a time; the server gives it a
// worker thread of its own (tools/server/server-specprefill.cpp).

#include "common.h"
#include "spec-prefill-select.h"

#include <atomic>
#include <string>
#include <vector>

enum common_spec_prefill_status {
    COMMON_SPEC_PREFILL_SPARSE,   // scored: the target prefills only `kept`
    COMMON_SPEC_PREFILL_SHORT,    // shorter than min_tokens: full prefill
    COMMON_SPEC_PREFILL_KEPT_ALL, // the selection kept every token: full prefill
    COMMON_SPEC_PREFILL_FAILED,   // scoring failed: full prefill, `reason` says why
    COMMON_SPEC_PREFILL_CANCELLED, // the request's cancel flag stopped the scoring: nothing to prefill
};

// "sparse", "short", "kept_all", "failed" or "cancelled"
const char * common_spec_prefill_status_name(enum common_spec_prefill_status status);

struct common_spec_prefill_result {
    enum common_spec_prefill_status status = COMMON_SPEC_PREFILL_FAILED;

    std::string reason; // why the prompt was prefilled in full (empty when sparse)

    int32_t n_prompt = 0;
    int32_t n_past   = 0; // positions below this were already prefilled (the request's reused prefix)
    std::vector<int32_t> kept;   // sorted positions in [n_past, n_prompt) to prefill: all of them unless sparse
    std::vector<float>   scores; // per prompt token (0 below n_past); empty when the prompt was not scored

    std::vector<common_spec_prefill_window> windows; // the scored windows' own spans of the prompt, in order
    int32_t n_windows  = 0; // scored windows
    int32_t n_parallel = 0; // windows scored side by side as sequences of one batch
    int32_t n_draft_cells = 0; // KV cells of the draft context that scored it, over all its sequences
    int32_t n_draft_reused = 0; // tokens of the draft's KV kept from the last scored prompt, which began the same way
    int32_t n_draft_prefilled = 0; // tokens the draft prefilled (every window's, less those reused)
    int32_t n_rows     = 0; // query rows used, over all windows
    int32_t n_layers   = 0; // draft layers whose rows were used
    int32_t n_layers_run = 0; // draft layers computed: the request's first n_layers, or all of them
    std::string reduced_on; // where the rows were reduced: a device ("CUDA0"), "host", or both ("CUDA0+host")

    double t_setup_ms         = 0.0; // (re)creating the draft context, when the prompt needed another shape
    double t_draft_prefill_ms = 0.0; // the draft's prefill of the windows (flash attention)
    double t_query_ms         = 0.0; // the query steps: lookahead decodes and the reduction of their attention
    double t_reduce_ms        = 0.0; // of t_query_ms: reducing the attention rows to scores, once each decode is done
    double t_score_ms         = 0.0; // scoring and selection, setup included

    bool sparse() const { return status == COMMON_SPEC_PREFILL_SPARSE; }
};

struct common_spec_prefill;

// what one request asks for (defaults: the parameters the scorer was made with)
struct common_spec_prefill_request {
    common_spec_prefill_select_params select;
    int32_t min_tokens = 0; // fewer new tokens than this are prefilled in full
    int32_t window     = 0; // score in windows of this many tokens (0: automatic, windows of 8192 for more than
                            // 16384 new tokens or where the draft context is too small; >= the prompt: whole)
    // query rows: the prompt's last token and lookahead - 1 greedy draft tokens, each a draft decode; at most
    // common_spec_prefill_lookahead_max(the scorer's), which its draft context has room for (0: the scorer's)
    int32_t lookahead  = 0;

    // score with the scorer's first n_layers layers only: the rest of its graph is not computed, and with no logits
    // the query rows are the prompt's last `lookahead` tokens instead of greedy lookahead tokens (0: the scorer's
    // default; >= its layer count: all of them, with lookahead tokens)
    int32_t n_layers   = 0;

    // prompt[0, n_past) is already in the target's KV: only [n_past, N) is scored and selected. The draft still sees
    // the prompt's first tokens and as much of the context before n_past as its context holds
    int32_t n_past = 0;

    // prompt spans kept whatever they score (a chat's system message and tool definitions, a client's own spans);
    // added to what the selection keeps without them. Only their parts at or after n_past count
    std::vector<common_spec_prefill_span> protect;

    // set from another thread: the scoring stops before its next ubatch (CPU: within one) and the result is CANCELLED
    const std::atomic<bool> * cancel = nullptr;
};

// Load the draft (params.spec_prefill.mparams, else the speculative draft model) and check that its vocabulary is
// the target's; for -mpd self (COMMON_SPEC_PREFILL_SELF) the scorer is model_tgt itself, in a context of its own.
// model_spec_draft: the speculative-decoding draft the caller already loaded, if any; when the prefill draft is the
// same file placed on the same devices, it is used instead of a second copy (and not freed here).
// On failure: nullptr, and `error` says why.
struct common_spec_prefill * common_spec_prefill_init(const common_params & params, const struct llama_model * model_tgt,
        struct llama_model * model_spec_draft, std::string & error);

void common_spec_prefill_free(struct common_spec_prefill * sp);

// where the draft runs: its devices, named as ggml names them, with their descriptions (for RPC, the server's address)
std::string common_spec_prefill_devices(const struct common_spec_prefill * sp);

// Create, ahead of time, the draft context for prompts of up to n_prompt tokens, and keep its KV cells: later prompts
// are planned to fit them (windows, sequences side by side) instead of growing them, so its memory stays what it is
// now. Prepared for full-prompt scoring, it also has room, where n_ctx allows, for such a prompt in windows of 8192
// tokens side by side (about 6% more cells). A request whose windows would take far more rounds than needed is
// scored in the same cells reshaped into more, shorter sequences (t_setup_ms says what that cost); a later request
// that needs the long sequence gets it back. Without this call common_spec_prefill_run sizes the context for each
// prompt. Returns false and logs if it cannot be created.
bool common_spec_prefill_prepare(struct common_spec_prefill * sp, int32_t n_prompt);

// the draft's memory, for startup logs, in bytes: its weights, and its context's KV cache and compute buffers
size_t common_spec_prefill_model_size(const struct common_spec_prefill * sp);
size_t common_spec_prefill_ctx_size(const struct common_spec_prefill * sp);

// the draft (for its name, devices, vocabulary): the target itself for COMMON_SPEC_PREFILL_SELF
const struct llama_model * common_spec_prefill_model(const struct common_spec_prefill * sp);

// whether the scorer is the target's own weights (-mpd self)
bool common_spec_prefill_is_self(const struct common_spec_prefill * sp);

// the layers a request scores with by default (--spec-prefill-layers, or all), and the scorer's layer count
int32_t common_spec_prefill_n_layers(const struct common_spec_prefill * sp);
int32_t common_spec_prefill_n_layer(const struct common_spec_prefill * sp);

struct common_spec_prefill_request common_spec_prefill_default_request(const struct common_spec_prefill * sp);

// how many tokens before the new ones (req.n_past) the draft would prefill to score them: the context its first
// window re-reads, less what its KV will hold of the prompt scored before this one (`before`, one queued ahead of
// it; nullptr: the last scored). Callable from another thread than the one that runs the scorer (a server's
// planning), while it scores
int32_t common_spec_prefill_n_draft_past(struct common_spec_prefill * sp, const llama_tokens & prompt,
        const struct common_spec_prefill_request & req, const llama_tokens * before = nullptr);

// Score the prompt and select the tokens to prefill. Never fails: a problem gives a full-prefill result that says why.
struct common_spec_prefill_result common_spec_prefill_run(struct common_spec_prefill * sp, const llama_tokens & prompt,
        const struct common_spec_prefill_request & req);

// Decode prompt[kept[i]] at position kept[i] into sequence `seq` of `ctx`, n_batch tokens per call; the last kept
// token outputs logits (batch index: its index in the last call). Gaps need llama_set_allow_pos_gaps(ctx, true).
// Returns 0, or the failing llama_decode result.
int32_t common_spec_prefill_decode(struct llama_context * ctx, llama_seq_id seq, const llama_tokens & prompt,
        const std::vector<int32_t> & kept, int32_t n_batch);
