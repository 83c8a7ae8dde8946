#include "spec-prefill-plan.h"
#include "spec-prefill-select.h"

#include <algorithm>

// x rounded up to a multiple of n: llama.cpp's 256-cell grid (GGML_PAD, without ggml.h)
static int32_t spec_prefill_pad(int32_t x, int32_t n) {
    return (x + n - 1) / n * n;
}

int32_t common_spec_prefill_n_past(int32_t n_past, int32_t n_prompt) {
    return std::max(0, std::min(n_past, n_prompt - 1));
}

int32_t common_spec_prefill_window_size(int32_t window, int32_t n_new) {
    if (window <= 0 && n_new > COMMON_SPEC_PREFILL_WINDOW_AUTO_ABOVE) {
        return COMMON_SPEC_PREFILL_WINDOW_PREPARED;
    }
    return window;
}

int32_t common_spec_prefill_fixed_cells(const common_spec_prefill_shape & shape) {
    return shape.fixed_n_seq*shape.fixed_n_cells;
}

common_spec_prefill_plan common_spec_prefill_make_plan(const common_spec_prefill_shape & shape,
        const std::vector<int32_t> & prompt, const common_spec_prefill_plan_params & params) {
    const int32_t n_prompt   = (int32_t) prompt.size();
    const int32_t n_past     = common_spec_prefill_n_past(params.n_past, n_prompt);
    const int32_t n_new      = n_prompt - n_past;
    const int32_t n_look     = shape.n_look_max; // room, not use
    const int32_t n_question = std::max(COMMON_SPEC_PREFILL_N_QUESTION_MIN, params.keep_last);
    const int32_t n_sink0    = n_past > 0 ? std::min(COMMON_SPEC_PREFILL_N_SINK, n_past) : 0;
    const int32_t n_seq_max  = std::max(1, shape.n_seq_max);

    // cells one sequence may have
    const int32_t budget = shape.fixed_size ? shape.fixed_n_cells : shape.n_ctx_max;
    // the largest window whose sequence (sink + window + question + lookahead) fits
    const int32_t window_max = std::max(256, budget - COMMON_SPEC_PREFILL_N_SINK - n_question - n_look);

    int32_t window = common_spec_prefill_window_size(params.window, n_new);
    if (n_sink0 + n_new + n_look > budget) {
        window = window > 0 ? std::min(window, window_max) : window_max;
    }

    common_spec_prefill_plan plan;
    const auto spans = common_spec_prefill_plan_windows(n_new, window);
    for (size_t w = 0; w < spans.size(); ++w) {
        common_spec_prefill_window_seq seq;
        seq.begin = n_past + spans[w].begin;
        seq.end   = n_past + spans[w].end;
        const bool last = w + 1 == spans.size();

        const int32_t n_sink = seq.begin == 0 ? 0 : std::min(COMMON_SPEC_PREFILL_N_SINK, seq.begin);
        seq.tokens.assign(prompt.begin(), prompt.begin() + n_sink);
        if (w == 0 && seq.begin > n_sink) {
            // a continuation: the context just before the new tokens, as much as the sequence has room for, and in
            // a plan of several windows no more than one window of it (the header says why)
            const int32_t n_tail = last ? 0 : std::max(0, n_prompt - std::max(seq.end, n_prompt - n_question));
            const int32_t room   = budget - n_sink - (seq.end - seq.begin) - n_tail - n_look;
            const int32_t n_ctx  = spans.size() > 1 ? std::min(room, window) : room;
            const int32_t c0     = std::max(n_sink, seq.begin - std::max(0, n_ctx));
            seq.tokens.insert(seq.tokens.end(), prompt.begin() + c0, prompt.begin() + seq.begin);
        }
        seq.key0 = (int32_t) seq.tokens.size();
        seq.tokens.insert(seq.tokens.end(), prompt.begin() + seq.begin, prompt.begin() + seq.end);
        if (!last) {
            // the question continues the window where they meet, so no token appears twice
            const int32_t q0 = std::max(seq.end, n_prompt - n_question);
            seq.tokens.insert(seq.tokens.end(), prompt.begin() + q0, prompt.end());
        }
        plan.n_cells = std::max(plan.n_cells, (int32_t) seq.tokens.size() + n_look);
        plan.windows.push_back(std::move(seq));
    }
    const int32_t n_windows = (int32_t) plan.windows.size();
    if (!shape.fixed_size) {
        const int32_t n_fit = std::max(1, shape.n_ctx_max / std::max(1, plan.n_cells));
        plan.n_seq = std::min({ n_windows, n_fit, n_seq_max });
        return plan;
    }
    // the current shape, unless another one of the same cells scores the windows in at most half the rounds and at
    // least two fewer (a reshape costs about a context creation: 0.1 s for 128K cells of a 1.5B draft on an H200)
    const int32_t n_seq_now = shape.ctx_n_cells >= plan.n_cells ? std::min(n_windows, shape.ctx_n_seq) : 0;
    const int32_t n_fit     = common_spec_prefill_fixed_cells(shape) / spec_prefill_pad(std::max(1, plan.n_cells), 256);
    const int32_t n_seq_new = std::max(1, std::min({ n_windows, n_fit, n_seq_max }));
    const auto rounds = [n_windows](int32_t n_seq) { return (n_windows + n_seq - 1) / n_seq; };
    const bool reshape = n_seq_now == 0 ||
        (!shape.reshape_off && rounds(n_seq_now) >= 2*rounds(n_seq_new) && rounds(n_seq_now) - rounds(n_seq_new) >= 2);
    plan.n_seq = reshape ? n_seq_new : n_seq_now;
    return plan;
}
