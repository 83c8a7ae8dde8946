#pragma once

// Speculative prefill, the pure part: from a draft model's attention rows to the prompt tokens the target prefills.
// No llama.cpp types here, so the same file builds into the spbuild Python extension for testing.
//
//   rows  -> common_spec_prefill_scores (renormalise, average-pool, max over heads and layers, mean over rows)
//   score -> common_spec_prefill_select (chunks, keep or mass mode, always-kept head and tail)

#include "spec-prefill-params.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

//
// scoring
//

// Accumulates per-key importance for one span of n_keys consecutive keys (a window of the prompt) from query rows.
// For each query row and each (layer, head), the attention probabilities are renormalised over the row's prompt keys,
// average-pooled along the span (edge windows divided by their real size), and max-reduced over heads and layers;
// the span's score is the mean of those maxima over the rows.
struct common_spec_prefill_scores;

// A fixed set of worker threads, made once and reused, so that scoring a query step starts no threads of its own.
// One run at a time: f must not run the pool again.
struct common_spec_prefill_pool;

struct common_spec_prefill_pool * common_spec_prefill_pool_init(int32_t n_threads);

void common_spec_prefill_pool_free(struct common_spec_prefill_pool * pool);

// f(i) for every i in [0, n), on the pool's threads and the caller's; returns when all are done
void common_spec_prefill_pool_run(struct common_spec_prefill_pool * pool, int32_t n, const std::function<void(int32_t)> & f);

// pool_kernel <= 1 disables pooling; n_threads > 1 splits long spans across threads
struct common_spec_prefill_scores * common_spec_prefill_scores_init(int32_t n_keys, int32_t pool_kernel, int32_t n_threads);


void common_spec_prefill_scores_free(struct common_spec_prefill_scores * sc);

// start a new query row
void common_spec_prefill_scores_begin_row(struct common_spec_prefill_scores * sc);

// fold one layer's heads into the current row:
//   head h's probabilities are probs[h*row_stride + i] for key cell i;
//   they are renormalised over cells [0, n_norm), and cells [key0, key0 + n_keys) are the span's keys
void common_spec_prefill_scores_add_heads(
        struct common_spec_prefill_scores * sc,
        const float * probs,
        int64_t n_head,
        int64_t row_stride,
        int64_t key0,
        int64_t n_norm);

// common_spec_prefill_scores_add_heads in parts that may run at the same time (on a common_spec_prefill_pool, beside
// other scorers' parts): how many parts the scorer splits these heads into, and part `part` of them
int32_t common_spec_prefill_scores_n_parts(const struct common_spec_prefill_scores * sc, int64_t n_head, int64_t n_norm);

void common_spec_prefill_scores_add_heads_part(
        struct common_spec_prefill_scores * sc,
        const float * probs,
        int64_t n_head,
        int64_t row_stride,
        int64_t key0,
        int64_t n_norm,
        int32_t part,
        int32_t n_parts);

// fold values already renormalised, pooled and max-reduced elsewhere (spec-prefill-graph.h) into the current row:
// values[j] for the span's key j
void common_spec_prefill_scores_add_max(struct common_spec_prefill_scores * sc, const float * values);

void common_spec_prefill_scores_end_row(struct common_spec_prefill_scores * sc);

int32_t common_spec_prefill_scores_n_rows(const struct common_spec_prefill_scores * sc);

// mean over the finished rows, multiplied by `scale`, into out[0, n_keys); zeros when no row finished
void common_spec_prefill_scores_get(const struct common_spec_prefill_scores * sc, float scale, float * out);

// the pooled, renormalised probabilities of one head, for testing: out[j] for key0 <= j < key0 + n_keys
void common_spec_prefill_pool_row(const float * probs, int64_t key0, int64_t n_keys, int64_t n_norm,
        int32_t pool_kernel, float * out);

//
// windows
//

// a span of prompt tokens: a scored window, a protected message
struct common_spec_prefill_span {
    int32_t begin; // first prompt token of the span
    int32_t end;   // one past the last
};

using common_spec_prefill_window = common_spec_prefill_span;

// split [0, n_tokens) into ceil(n_tokens / window) windows of near-equal size (differing by at most one token),
// covering every token exactly once; window <= 0 or >= n_tokens gives one window
std::vector<common_spec_prefill_window> common_spec_prefill_plan_windows(int32_t n_tokens, int32_t window);

//
// selection
//

// The chunks of n_tokens tokens, as their bounds: chunk c is [bounds[c], bounds[c + 1]). Without line_ends, fixed
// chunks of chunk_size. With line_ends (line_ends[i] != 0: token i ends a line), each cut moves to the line end
// nearest to it that leaves the chunk between half and one and a half chunk_size long, so that short lines, such as a
// fact on a line of its own, are not split between a kept chunk and a dropped one; where no line ends in that range,
// the cut stays where it was.
std::vector<int32_t> common_spec_prefill_chunks(int32_t n_tokens, int32_t chunk_size, const uint8_t * line_ends);

// The lines that share a rare word with the question, as a flag per token. The question is the lines holding the
// last n_question tokens; a word is a run of at least 4 ASCII letters or digits, or bytes of multi-byte UTF-8
// characters, ASCII case folded. A question word found in 1 to max_lines of the lines before the question adds those
// lines (so words common in the prompt add nothing). pieces: each token's text; line_ends as below.
std::vector<uint8_t> common_spec_prefill_question_lines(const std::string * pieces, const uint8_t * line_ends,
        int32_t n_tokens, int32_t n_question, int32_t max_lines);

// the sorted prompt positions to prefill; every position when the selection keeps everything. line_ends (may be
// null): which tokens end a line, for params.chunk_lines, params.complete_lines and params.question_lines; pieces
// (may be null): each token's text, for params.question_lines, whose lines are always kept like the head and tail;
// protect (may be null): tokens kept whatever they score (protect[i] != 0), such as a chat's system message and tool
// definitions; they are added to what the selection keeps without them, so they never take the rest's share
std::vector<int32_t> common_spec_prefill_select(
        const float * scores,
        int32_t n_tokens,
        const struct common_spec_prefill_select_params & params,
        const uint8_t * line_ends = nullptr,
        const std::string * pieces = nullptr,
        const uint8_t * protect = nullptr);
