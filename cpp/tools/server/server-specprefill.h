#pragma once

// llama-server side of speculative prefill (common/spec-prefill.h does the scoring and the selection).
//
// The server owns one server_spec_prefill: the prefill draft, its scoring context and a worker thread that scores
// prompts off the server loop, one at a time, so other slots keep generating. Each slot holds a
// server_spec_prefill_slot; the server calls, on its loop thread:
//
//   n_past = server_spec_prefill_reuse(slot_sp, params, ctx_tgt, seq, n_past);  // how much of a sparse KV to reuse
//   server_spec_prefill_start(slot_sp, params, prompt, n_past, timings, metrics); // decide, maybe queue the scoring
//   if (!server_spec_prefill_ready(slot_sp, timings, metrics)) { skip the slot }   // scores not back yet
//   if (server_spec_prefill_keep(slot_sp, pos)) { add the token to the batch }     // at its original position
//   server_spec_prefill_release(slot_sp, ...);                                     // cancels, learns throughputs
//
// The scoring context holds nothing between requests (it is cleared for every prompt), so no slot's draft KV can
// pile up in it. A slot whose KV is sparse is recognised from the KV itself (llama_memory_seq_positions), so the
// RAM prompt cache, slot files and --cache-reuse need no extra bookkeeping to stay truthful.

#include "common.h"
#include "json.h"
#include "spec-prefill.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

using json = common_json;

struct common_chat_templates;
struct common_chat_templates_inputs;

// a span of the prompt kept whole, as a request names it: in bytes of the prompt's text (the chat template's
// rendering, or a client's string prompt) or, for a client's token prompt, in tokens
struct server_spec_prefill_protect {
    std::string role;  // "system", "tools", "user", "tool_call" (the chat's structure) or "client" (spec_prefill.keep)
    int32_t begin = 0;
    int32_t end   = 0; // one past the last
    bool in_tokens = false;
};

// what a request asks for: the "spec_prefill" object of /completion, /v1/completions and /v1/chat/completions, or
// the flat "specprefill" / "specprefill_keep_pct" fields vllm-mlx clients send; the settings are the server's flags
// where the request sets none (those of the table's rows marked per_request it may set)
struct server_spec_prefill_params : common_spec_prefill_settings {
    bool enabled = false;

    bool has_tools   = false; // the request carries tools or a tool-call grammar
    bool return_kept = false; // report the kept prompt positions in the timings (spec_prefill.return_kept)

    // kept whole whatever they score: the chat's structure (with tools and tool_guard protect) and spec_prefill.keep
    std::vector<server_spec_prefill_protect> protect;
    std::string prompt_head; // the string prompt's first bytes, to align byte spans with the tokens' text

    json to_json() const;
};

// throws std::invalid_argument naming the field ("spec_prefill.p: ...") for a bad value
server_spec_prefill_params server_spec_prefill_params_from_json(const common_params & params_base, const json & data);

// The chat endpoint, once the template has rendered `prompt` from `inputs`: where the spans that
// --spec-prefill-tool-guard protect keeps whole lie in it (the system message and the tool definitions, the last user
// message, the latest tool call), found by rendering the messages again with one of them marked, or without the
// tools, and comparing. Written to llama_params for server_spec_prefill_params_from_json; nothing when spec prefill
// is off, the request has no tools, or its tool guard is not protect. Never throws: a span the template cannot
// render is left out.
void server_spec_prefill_chat_spans(const common_params_spec_prefill & spp, const common_chat_templates * tmpls,
        const common_chat_templates_inputs & inputs, const std::string & prompt, const json & body, json & llama_params);

enum server_spec_prefill_status {
    SERVER_SPEC_PREFILL_NONE,                 // not configured on this server: nothing is reported
    SERVER_SPEC_PREFILL_DISABLED,             // the request turned it off
    SERVER_SPEC_PREFILL_ACTIVE,               // scored: only the kept tokens were prefilled
    SERVER_SPEC_PREFILL_KEPT_ALL,             // scored, and the selection kept every token
    SERVER_SPEC_PREFILL_SKIPPED_MIN_TOKENS,   // fewer new tokens than min_tokens
    SERVER_SPEC_PREFILL_SKIPPED_BREAK_EVEN,   // the estimated saving is below --spec-prefill-break-even
    SERVER_SPEC_PREFILL_SKIPPED_TOOL_GUARD,   // a request with tools under --spec-prefill-tool-guard skip
    SERVER_SPEC_PREFILL_SKIPPED_INCOMPATIBLE, // a prompt or task it cannot handle (media, embeddings)
    SERVER_SPEC_PREFILL_SKIPPED_QUEUE,        // the draft is busy: --spec-prefill-queue-max requests already wait, or
                                              // the expected wait would eat the expected saving (`reason` says which)
    SERVER_SPEC_PREFILL_ERROR_FALLBACK,       // scoring failed: the prompt was prefilled in full, `reason` says why
    SERVER_SPEC_PREFILL_REUSED,               // a sparse prefix from an earlier request was reused, the rest in full
    SERVER_SPEC_PREFILL_STATUS_COUNT,
};

const char * server_spec_prefill_status_name(enum server_spec_prefill_status status);

// a response's timings.spec_prefill (a member of server_slot_stats, so every result carries it)
struct server_spec_prefill_timings {
    enum server_spec_prefill_status status = SERVER_SPEC_PREFILL_NONE;
    std::string reason;
    std::string device; // where the draft scored the prompt (its devices; for RPC, the server's address)

    int32_t n_prompt  = 0; // prompt tokens
    int32_t n_kept    = 0; // prompt positions in the target's KV once prefilled (reused ones included)
    int32_t n_reused  = 0; // prompt tokens reused from the slot's KV
    int32_t n_windows = 0; // windows the draft scored
    int32_t n_parallel = 0; // of them, scored side by side as sequences of one batch
    int32_t n_rows     = 0; // query rows used, over all windows: lookahead each, fewer where the draft ended early
    int32_t n_layers   = 0; // scorer layers computed
    int32_t n_draft_reused = 0; // prompt tokens whose draft KV the last scored prompt left (the same slot's last turn)

    double queue_ms = 0.0; // waiting for the scorer (other requests' scoring)
    double score_ms = 0.0; // the draft's prefill, query steps and selection

    double score_draft_prefill_ms = 0.0; // of score_ms: the draft's prefill of the prompt (every window)
    double score_query_ms         = 0.0; // of score_ms: the lookahead query steps
    double score_reduce_ms        = 0.0; // of score_query_ms: reducing their attention rows to scores
    double score_setup_ms         = 0.0; // of score_ms: reshaping the draft's context for this request's windows

    // with return_kept: the prompt positions the target prefilled, as half-open [begin, end) ranges
    bool return_kept = false;
    std::vector<std::pair<int32_t, int32_t>> kept;

    // the spans kept whole, in prompt tokens, with their roles (reported where there are any)
    std::vector<std::pair<std::string, common_spec_prefill_span>> protect;
    int32_t n_protected = 0; // new prompt tokens in them

    bool is_set() const { return status != SERVER_SPEC_PREFILL_NONE; }

    // t_prompt_ms: the request's whole prompt phase, from which the sparse prefill's share is derived
    json to_json(double t_prompt_ms) const;
};

// Prometheus counters (a member of server_metrics)
struct server_spec_prefill_metrics {
    bool enabled = false;

    uint64_t n_requests[SERVER_SPEC_PREFILL_STATUS_COUNT] = {};
    uint64_t n_tokens_scored  = 0; // new prompt tokens the draft scored
    uint64_t n_tokens_skipped = 0; // of those, the ones the target did not prefill
    double   t_score_ms       = 0.0;
    double   t_queue_ms       = 0.0;

    void add(const server_spec_prefill_timings & t, int32_t n_scored, int32_t n_skipped);

    std::string to_prometheus() const;
};

struct server_spec_prefill;
struct server_spec_prefill_job;

// one slot's state; it never holds KV
struct server_spec_prefill_slot {
    server_spec_prefill * sp = nullptr;

    std::shared_ptr<server_spec_prefill_job> job; // scoring queued or running

    bool    sparse      = false; // the new tokens are prefilled sparsely: only `kept`
    int32_t n_held_past = 0;     // positions below n_past the KV holds (fewer than n_past if the prefix is sparse)
    bool    past_sparse = false;
    std::vector<llama_pos> held; // the KV's positions when the request started, until it is decided
    std::vector<int32_t> kept;   // sorted positions >= n_past to prefill
    size_t i_kept = 0;
    std::vector<std::pair<std::string, common_spec_prefill_span>> protect; // the last request's protected spans

    // what the target's KV held for the slot's sequence when its last request was released
    int32_t kv_n_pos     = 0;
    int32_t kv_pos_max   = -1;
    int32_t kv_first_gap = -1; // -1: dense

    json to_json() const; // for /slots
};

// Loads the prefill draft and starts the scorer. Refuses what it cannot serve (a prefill draft of another vocabulary,
// or one that needs the target's hidden states to run). ctx_dft: the speculative-decoding draft context, if any; it
// mirrors the target's batch and so sees the sparse prompt, so it is allowed position gaps (the target verifies every
// drafted token: a draft that saw less can only lower acceptance, not change the output). nullptr on failure, `error`
// says why.
server_spec_prefill * server_spec_prefill_init(const common_params & params, llama_context * ctx_tgt,
        llama_context * ctx_dft, int32_t n_ctx_slot, std::string & error);

// when every busy slot waits for its scores: block up to timeout_ms, or until a scoring ends, so that the server loop
// neither spins nor looks idle (it must not fall asleep under a slot that is being scored)
void server_spec_prefill_wait(server_spec_prefill * sp, int32_t timeout_ms);

void server_spec_prefill_free(server_spec_prefill * sp);

// the settings, for /props (from the parameters only, so that it also answers while the server sleeps)
json server_spec_prefill_props(const common_params & params);

// before the slot's cached prefix is kept: returns n_past, lowered to the prefix's first dropped position when the
// request must not build on a sparse KV (spec prefill off for it, or --spec-prefill-reuse exact)
int32_t server_spec_prefill_reuse(server_spec_prefill_slot & slot, const server_spec_prefill_params & params,
        llama_context * ctx_tgt, llama_seq_id seq, int32_t n_past);

// once prompt[0, n_past) is kept: decides what this request does and, if it is to be scored, queues the scoring
void server_spec_prefill_start(server_spec_prefill_slot & slot, const server_spec_prefill_params & params,
        const llama_tokens & prompt, int32_t n_past, bool compatible, server_spec_prefill_timings & timings,
        server_spec_prefill_metrics & metrics);

// scoring queued or running
bool server_spec_prefill_pending(const server_spec_prefill_slot & slot);

// false while the slot's scores are not back; once they are, applies them and returns true
bool server_spec_prefill_ready(server_spec_prefill_slot & slot, server_spec_prefill_timings & timings,
        server_spec_prefill_metrics & metrics);

// whether the prompt token at `pos` goes into the target's KV (positions are asked in increasing order)
bool server_spec_prefill_keep(server_spec_prefill_slot & slot, int32_t pos);

// the slot is released: stops its scoring, and learns the target's prefill throughput from the finished request
void server_spec_prefill_release(server_spec_prefill_slot & slot, llama_context * ctx_tgt, llama_seq_id seq,
        const server_spec_prefill_timings & timings, double t_prompt_ms, uint64_t n_prompt_processed);
