#pragma once

// Speculative prefill's planning, the pure part: the windows a prompt is scored in, each window's draft sequence, and
// the shape of the draft context (sequences side by side, cells each) that they need. No llama.cpp types or calls
// here, so the same file builds into the spbuild Python extension for testing; spec-prefill.cpp describes its draft
// context as a common_spec_prefill_shape and plans with common_spec_prefill_make_plan.

#include <cstdint>
#include <vector>

// every window after the first also starts with the prompt's first tokens: they take the attention-sink role BOS
// plays for the first window, so the window's own first tokens are not mistaken for important ones
inline constexpr int32_t COMMON_SPEC_PREFILL_N_SINK = 4;
// every window but the last also ends with the prompt's last tokens (the question), so its lookahead rows look for
// what the question needs
inline constexpr int32_t COMMON_SPEC_PREFILL_N_QUESTION_MIN = 256;
// a context prepared for full-prompt scoring also has room for a request's windows of this size in one round
// (docs/benchmarks.md: 8K windows are the fastest at 128K): every window adds a sink, the question and the lookahead,
// on llama.cpp's 256-cell grid, about 6% more cells (a 128K slot's 17 windows side by side instead of 16)
inline constexpr int32_t COMMON_SPEC_PREFILL_WINDOW_PREPARED = 8192;
// window 0 (automatic) scores prompts of more new tokens than this in windows of COMMON_SPEC_PREFILL_WINDOW_PREPARED:
// on the real Qwen2.5-Coder 0.5B -> 1.5B pair at 30K, 8K windows kept as many right answers as full-prompt scoring
// (38 of 39) and on the H200 gave 2.62x TTFT at 32K and 5.17x at 128K, against 2.06x and 2.31x (docs/quality.md); at
// 16K they kept one fewer (40 of 42) for a small saving. A window at least as long as the prompt scores it whole.
inline constexpr int32_t COMMON_SPEC_PREFILL_WINDOW_AUTO_ABOVE = 16384;

// the draft context a plan must fit: its limits, and the shape it has now
struct common_spec_prefill_shape {
    int32_t n_ctx_max = 0; // the most KV cells the draft context may have, all its sequences together

    // a prepared context (common_spec_prefill_prepare): its fixed_n_seq*fixed_n_cells cells are all there is, and no
    // sequence is longer than fixed_n_cells; plans share them out instead of growing them
    bool    fixed_size    = false;
    int32_t fixed_n_seq   = 0;
    int32_t fixed_n_cells = 0;

    int32_t ctx_n_seq   = 0;     // the current context's sequences (0: none yet)
    int32_t ctx_n_cells = 0;     // and its cells per sequence
    bool    reshape_off = false; // a reshape failed once: plans keep the current shape

    int32_t n_seq_max  = 1; // the most windows side by side: a query step holds one token per window in one ubatch
    int32_t n_look_max = 8; // query rows every sequence keeps room for (common_spec_prefill_lookahead_max)
};

// what a request asks of its plan (common_spec_prefill_request's part that planning reads)
struct common_spec_prefill_plan_params {
    int32_t n_past    = 0; // prompt[0, n_past) is already prefilled: only the rest is scored
    int32_t window    = 0; // score in windows of this many tokens (0: automatic; >= the new tokens: whole)
    int32_t keep_last = 0; // the selection's always-kept tail: the question is at least this long
};

// one window of the prompt, as the draft sequence that scores it
struct common_spec_prefill_window_seq {
    int32_t begin; // the window's own tokens: prompt[begin, end)
    int32_t end;
    std::vector<int32_t> tokens; // sink prefix + own tokens + question
    int32_t key0;  // index of the first own token in `tokens`
};

struct common_spec_prefill_plan {
    std::vector<common_spec_prefill_window_seq> windows;
    int32_t n_seq   = 1; // windows per round
    int32_t n_cells = 0; // cells per sequence
};

// the reused prefix a request names, within a prompt of n_prompt tokens: at least its last token is scored
int32_t common_spec_prefill_n_past(int32_t n_past, int32_t n_prompt);

// the window size a plan of n_new new tokens asks for under the request's `window`: its own, or under 0 (automatic)
// COMMON_SPEC_PREFILL_WINDOW_PREPARED above COMMON_SPEC_PREFILL_WINDOW_AUTO_ABOVE new tokens (0: the whole prompt);
// the plan narrows it further where a sequence cannot hold it
int32_t common_spec_prefill_window_size(int32_t window, int32_t n_new);

// the cells of a prepared context, all its sequences together: what a reshape shares out
int32_t common_spec_prefill_fixed_cells(const struct common_spec_prefill_shape & shape);

// The windows of prompt[params.n_past, N): each window's sequence is the prompt's first tokens (a sink), for the first
// window of a continuation as much of the context before n_past as fits, the window's own tokens, and for all but the
// last window the prompt's end (the question). Planned to fit the prepared context when there is one (fixed_size).
// A continuation scored in several windows reads at most one window of context before n_past: the windows after the
// first see none, and the draft cannot start on its own KV with several windows, so all of the context would be
// prefilled again on every turn of an agent's conversation (at 30K, the third turn's scoring cost as much as a
// whole prompt's, docs/quality.md)
struct common_spec_prefill_plan common_spec_prefill_make_plan(const struct common_spec_prefill_shape & shape,
        const std::vector<int32_t> & prompt, const struct common_spec_prefill_plan_params & params);
