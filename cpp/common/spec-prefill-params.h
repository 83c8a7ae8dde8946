#pragma once

// The settings of speculative prefill, alone in a header of their own: common.h holds them in common_params, so this is
// all that every file including common.h sees of the feature (spec-prefill-select.h has the functions), and a new
// setting changes this file and a row of spec-prefill-settings.cpp's table, not the patch to common.h.

#include <cstdint>

// what -mpd names to score with the target's own weights (its first --spec-prefill-layers layers) instead of a draft
#define COMMON_SPEC_PREFILL_SELF "self"

// the most query rows a request may ask for: the default (--spec-prefill-lookahead) or 8, the paper's, whichever is
// more; the draft context keeps room for them (a few KV cells), so a request can choose 8 under a shorter default
inline int32_t common_spec_prefill_lookahead_max(int32_t lookahead) {
    return lookahead > 8 ? lookahead : 8;
}

enum common_spec_prefill_select_mode {
    COMMON_SPEC_PREFILL_SELECT_KEEP = 0, // the top fraction `keep` of the chunks
    COMMON_SPEC_PREFILL_SELECT_MASS = 1, // the highest chunks until they hold `mass` of the total score
};

struct common_spec_prefill_select_params {
    enum common_spec_prefill_select_mode mode = COMMON_SPEC_PREFILL_SELECT_KEEP;

    float   keep       = 0.3f;  // keep mode: fraction of chunks, in (0, 1]; with question_lines 2 and lookahead 8,
                                // 0.3 kept 95-98% of the right answers of the real Qwen2.5-Coder 0.5B/1.5B pair at
                                // 8K-16K (docs/quality.md)
    float   mass       = 0.85f; // mass mode: share of the score mass, in (0, 1]
    int32_t chunk_size = 32;    // tokens per chunk; 0 or 1 selects single tokens
    bool    chunk_lines = false; // chunks end at line ends near their size (common_spec_prefill_chunks); it
                                 // changes the ranking, and cost answers at 8K-16K on Gemma 3 270M (docs/quality.md)
    bool    complete_lines = true; // each run of kept tokens that starts or ends inside a line grows to the line's
                                   // start or end, where at most half a chunk is missing (the ranking stays the
                                   // chunks'): a fact line cut by a chunk edge is kept whole
    int32_t keep_first = 4;     // always kept: the first tokens (BOS, attention sinks)
    int32_t keep_last  = 64;    // always kept: the last tokens, at least one chunk (template closers, the question)
    int32_t question_lines = 2; // > 0: also keep each line sharing a word with the question (the always-kept
                                // tail's lines) where that word is in at most this many lines before it
    int32_t max_keep   = 0;     // > 0: keep at most this many tokens (the always-kept ones even beyond it), taking
                                // the highest-scoring chunks that still fit (for small-memory targets)
};

// what llama-server does with a request that carries tools or a tool-call grammar
enum common_spec_prefill_tool_guard {
    COMMON_SPEC_PREFILL_TOOL_GUARD_OFF     = 0, // score it like any other request
    COMMON_SPEC_PREFILL_TOOL_GUARD_SKIP    = 1, // prefill it in full
    COMMON_SPEC_PREFILL_TOOL_GUARD_PROTECT = 2, // keep the chat's structure whole (the system message, the tool
                                                // definitions, the last user message, the latest tool call) and
                                                // score the rest: older turns and tool results
};

// what llama-server decides per request before it scores a prompt (server-specprefill.h)
struct common_spec_prefill_server_params {
    bool  reuse_exact = false; // a follow-up reuses a sparse KV only up to its first dropped position
    float break_even  = 1.1f;  // skip when the estimated speedup is below this (0: never skip): by default a lossy
                               // prefill must save at least a tenth of the time; the wait for the scorer counts
    enum common_spec_prefill_tool_guard tool_guard = COMMON_SPEC_PREFILL_TOOL_GUARD_SKIP;
    int32_t queue_max = -1;    // >= 0: at most this many requests wait for the scorer, the next is prefilled in full
                               // (-1: no bound but the slots and the break-even)
    int32_t window_min = 1024; // the smallest window a request may ask for: smaller ones cost more to score than no
                               // windows (each window scores its own sink, question and lookahead rows)
};

// every knob a flag sets, once: common_params_spec_prefill (the flags) and llama-server's per-request parameters both
// are one, and the table of spec-prefill-settings.h names, checks and documents each
struct common_spec_prefill_settings {
    common_spec_prefill_select_params select;

    int32_t lookahead   = 8;    // query rows: the prompt's last token and lookahead - 1 greedy draft tokens (the
                                // paper's 8); on the real Qwen2.5-Coder pair 8 rows kept more right answers than 1
                                // at the same p, each row a draft decode (docs/quality.md); requests may ask for up
                                // to common_spec_prefill_lookahead_max(lookahead)
    int32_t pool_kernel = 13;   // average-pool kernel along the prompt (0 or 1: none)
    int32_t min_tokens  = 1024; // shorter prompts are prefilled in full
    int32_t n_ctx       = 0;    // most KV cells of the draft context (0: the draft's trained context)
    int32_t window      = 0;    // score in windows of this many tokens (0: automatic, see spec-prefill.h)
    int32_t n_layers    = 0;    // score with the scorer's first n_layers layers (0: all; -mpd self: a quarter)

    common_spec_prefill_server_params server; // llama-server's own
};
