// spbuild._selection: Python bindings of cpp/common/spec-prefill-select.cpp, the selection code llama.cpp builds,
// so the algorithm can be checked against a NumPy reference without building llama.cpp, of the window planning
// (spec-prefill-plan.cpp), and of the settings table (spec-prefill-settings.cpp) that the flags, the server's request
// fields and the README's flag table follow.

#include "spec-prefill-plan.h"
#include "spec-prefill-select.h"
#include "spec-prefill-settings.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <stdexcept>
#include <string>

namespace nb = nanobind;

using f32_array = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;

static common_spec_prefill_select_params make_params(const std::string & mode, float keep, float mass,
        int32_t chunk_size, int32_t keep_first, int32_t keep_last) {
    common_spec_prefill_settings s;
    common_spec_prefill_setting_parse(*common_spec_prefill_setting_find("select"), s, "mode", mode);
    s.select.keep       = keep;
    s.select.mass       = mass;
    s.select.chunk_size = chunk_size;
    s.select.keep_first = keep_first;
    s.select.keep_last  = keep_last;
    return s.select;
}

// what is wrong with the selection parameters, or an empty string
static std::string check(const common_spec_prefill_select_params & params) {
    common_spec_prefill_settings s;
    s.select = params;
    return common_spec_prefill_settings_check(s);
}

static const char * type_name(enum common_spec_prefill_setting_type type) {
    switch (type) {
        case COMMON_SPEC_PREFILL_SETTING_INT:    return "int";
        case COMMON_SPEC_PREFILL_SETTING_FLOAT:  return "float";
        case COMMON_SPEC_PREFILL_SETTING_BOOL:   return "bool";
        case COMMON_SPEC_PREFILL_SETTING_CHOICE: return "choice";
    }
    return "?";
}

NB_MODULE(_selection, m) {
    m.doc() = "Speculative prefill selection (the C++ code llama.cpp uses)";

    m.def("pool_row", [](f32_array probs, int64_t key0, int64_t n_keys, int64_t n_norm, int32_t kernel) {
        if (probs.ndim() != 1 || key0 < 0 || n_keys <= 0 || key0 + n_keys > (int64_t) probs.shape(0) ||
                n_norm < 0 || n_norm > (int64_t) probs.shape(0)) {
            throw std::invalid_argument("pool_row: need a 1-D row with key0 + n_keys <= len and n_norm <= len");
        }
        auto * out = new float[n_keys];
        common_spec_prefill_pool_row(probs.data(), key0, n_keys, n_norm, kernel, out);
        nb::capsule owner(out, [](void * p) noexcept { delete[] (float *) p; });
        return nb::ndarray<nb::numpy, float, nb::ndim<1>>(out, {(size_t) n_keys}, owner);
    }, nb::arg("probs"), nb::arg("key0"), nb::arg("n_keys"), nb::arg("n_norm"), nb::arg("kernel"),
       "One head's row renormalised over [0, n_norm) and average-pooled over [key0, key0 + n_keys).");

    m.def("score", [](f32_array attn, int64_t key0, int64_t n_keys, int64_t n_norm, int32_t kernel, float scale,
                      int32_t n_threads) {
        if (attn.ndim() != 4) {
            throw std::invalid_argument("score: attn must be [n_rows, n_layers, n_head, n_cells]");
        }
        const int64_t n_rows = attn.shape(0), n_layers = attn.shape(1), n_head = attn.shape(2), n_cells = attn.shape(3);
        if (key0 < 0 || n_keys <= 0 || key0 + n_keys > n_cells || n_norm < 0 || n_norm > n_cells) {
            throw std::invalid_argument("score: need key0 + n_keys <= n_cells and n_norm <= n_cells");
        }
        common_spec_prefill_scores * sc = common_spec_prefill_scores_init((int32_t) n_keys, kernel, n_threads);
        const float * data = attn.data();
        for (int64_t r = 0; r < n_rows; ++r) {
            common_spec_prefill_scores_begin_row(sc);
            for (int64_t l = 0; l < n_layers; ++l) {
                common_spec_prefill_scores_add_heads(sc, data + (r*n_layers + l)*n_head*n_cells, n_head, n_cells, key0, n_norm);
            }
            common_spec_prefill_scores_end_row(sc);
        }
        auto * out = new float[n_keys];
        common_spec_prefill_scores_get(sc, scale, out);
        common_spec_prefill_scores_free(sc);
        nb::capsule owner(out, [](void * p) noexcept { delete[] (float *) p; });
        return nb::ndarray<nb::numpy, float, nb::ndim<1>>(out, {(size_t) n_keys}, owner);
    }, nb::arg("attn"), nb::arg("key0"), nb::arg("n_keys"), nb::arg("n_norm"), nb::arg("kernel"),
       nb::arg("scale") = 1.0f, nb::arg("n_threads") = 1,
       "Per-key scores of a span: mean over rows of the max over (layer, head) of the pooled, renormalised rows.");

    m.def("plan_windows", [](int32_t n_tokens, int32_t window) {
        std::vector<std::pair<int32_t, int32_t>> out;
        for (const auto & w : common_spec_prefill_plan_windows(n_tokens, window)) {
            out.emplace_back(w.begin, w.end);
        }
        return out;
    }, nb::arg("n_tokens"), nb::arg("window"));

    m.def("plan", [](const std::vector<int32_t> & prompt, int32_t n_past, int32_t window, int32_t keep_last,
                     int32_t n_ctx_max, bool fixed_size, int32_t fixed_n_seq, int32_t fixed_n_cells, int32_t ctx_n_seq,
                     int32_t ctx_n_cells, bool reshape_off, int32_t n_seq_max, int32_t n_look_max) {
        // what llama.cpp's driver guarantees (a scored prompt has a token, a context has cells): beyond it the plan
        // means nothing
        if (prompt.empty() || n_ctx_max < 1 || n_seq_max < 1 || n_look_max < 0 || keep_last < 0 || ctx_n_seq < 0 ||
                ctx_n_cells < 0 || (fixed_size && (fixed_n_seq < 1 || fixed_n_cells < 1))) {
            throw std::invalid_argument("plan: need a non-empty prompt, n_ctx_max >= 1, n_seq_max >= 1, no negative "
                    "sizes, and a prepared shape of at least one cell with fixed_size");
        }
        common_spec_prefill_shape shape;
        shape.n_ctx_max     = n_ctx_max;
        shape.fixed_size    = fixed_size;
        shape.fixed_n_seq   = fixed_n_seq;
        shape.fixed_n_cells = fixed_n_cells;
        shape.ctx_n_seq     = ctx_n_seq;
        shape.ctx_n_cells   = ctx_n_cells;
        shape.reshape_off   = reshape_off;
        shape.n_seq_max     = n_seq_max;
        shape.n_look_max    = n_look_max;
        const common_spec_prefill_plan_params params = { n_past, window, keep_last };
        const common_spec_prefill_plan plan = common_spec_prefill_make_plan(shape, prompt, params);
        nb::list windows;
        for (const auto & w : plan.windows) {
            nb::dict row;
            row["begin"]  = w.begin;
            row["end"]    = w.end;
            row["key0"]   = w.key0;
            row["tokens"] = w.tokens;
            windows.append(row);
        }
        nb::dict out;
        out["windows"] = windows;
        out["n_seq"]   = plan.n_seq;
        out["n_cells"] = plan.n_cells;
        return out;
    }, nb::arg("prompt"), nb::kw_only(), nb::arg("n_past") = 0, nb::arg("window") = 0, nb::arg("keep_last") = 64,
       nb::arg("n_ctx_max"), nb::arg("fixed_size") = false, nb::arg("fixed_n_seq") = 0, nb::arg("fixed_n_cells") = 0,
       nb::arg("ctx_n_seq") = 0, nb::arg("ctx_n_cells") = 0, nb::arg("reshape_off") = false,
       nb::arg("n_seq_max") = 256, nb::arg("n_look_max") = 8,
       "The draft's plan for prompt[n_past:]: windows (begin, end: the window's own tokens; tokens: its sequence, sink "
       "+ context + own tokens + question; key0: where its own tokens start in it), n_seq (windows per round) and "
       "n_cells (cells per sequence), for a draft context of at most n_ctx_max cells, or, with fixed_size, a prepared "
       "one of fixed_n_seq x fixed_n_cells now shaped ctx_n_seq x ctx_n_cells. The module's N_SINK, N_QUESTION_MIN, "
       "WINDOW_PREPARED and WINDOW_AUTO_ABOVE are the constants it plans with.");
    m.attr("N_SINK")            = COMMON_SPEC_PREFILL_N_SINK;
    m.attr("N_QUESTION_MIN")    = COMMON_SPEC_PREFILL_N_QUESTION_MIN;
    m.attr("WINDOW_PREPARED")   = COMMON_SPEC_PREFILL_WINDOW_PREPARED;
    m.attr("WINDOW_AUTO_ABOVE") = COMMON_SPEC_PREFILL_WINDOW_AUTO_ABOVE;

    m.def("check_params", [](const std::string & mode, float keep, float mass, int32_t chunk_size, int32_t keep_first,
                             int32_t keep_last) -> std::optional<std::string> {
        common_spec_prefill_select_params params;
        try {
            params = make_params(mode, keep, mass, chunk_size, keep_first, keep_last);
        } catch (const std::invalid_argument & err) {
            return std::string(err.what());
        }
        const std::string problem = check(params);
        return problem.empty() ? std::nullopt : std::optional<std::string>(problem);
    }, nb::arg("mode"), nb::arg("keep"), nb::arg("mass"), nb::arg("chunk_size"), nb::arg("keep_first"),
       nb::arg("keep_last"));

    m.def("chunks", [](int32_t n_tokens, int32_t chunk_size, std::optional<std::vector<uint8_t>> line_ends) {
        if (n_tokens < 0 || (line_ends && (int32_t) line_ends->size() != n_tokens)) {
            throw std::invalid_argument("chunks: need n_tokens >= 0 and one line_ends flag per token");
        }
        return common_spec_prefill_chunks(n_tokens, chunk_size, line_ends ? line_ends->data() : nullptr);
    }, nb::arg("n_tokens"), nb::arg("chunk_size"), nb::arg("line_ends") = nb::none(),
       "The chunks' bounds: chunk c is [bounds[c], bounds[c + 1]).");

    m.def("select", [](f32_array scores, const std::string & mode, float keep, float mass, int32_t chunk_size,
                       int32_t keep_first, int32_t keep_last, std::optional<std::vector<uint8_t>> line_ends,
                       bool chunk_lines, bool complete_lines, std::optional<std::vector<std::string>> pieces,
                       int32_t question_lines, std::optional<std::vector<uint8_t>> protect) {
        if (scores.ndim() != 1) {
            throw std::invalid_argument("select: scores must be 1-D");
        }
        if (line_ends && line_ends->size() != scores.shape(0)) {
            throw std::invalid_argument("select: need one line_ends flag per score");
        }
        if (pieces && pieces->size() != scores.shape(0)) {
            throw std::invalid_argument("select: need one piece per score");
        }
        if (protect && protect->size() != scores.shape(0)) {
            throw std::invalid_argument("select: need one protect flag per score");
        }
        auto params = make_params(mode, keep, mass, chunk_size, keep_first, keep_last);
        params.chunk_lines    = chunk_lines;
        params.complete_lines = complete_lines;
        params.question_lines = question_lines;
        if (const std::string problem = check(params); !problem.empty()) {
            throw std::invalid_argument(problem);
        }
        return common_spec_prefill_select(scores.data(), (int32_t) scores.shape(0), params,
                line_ends ? line_ends->data() : nullptr, pieces ? pieces->data() : nullptr,
                protect ? protect->data() : nullptr);
    }, nb::arg("scores"), nb::arg("mode") = "keep", nb::arg("keep") = 0.3f, nb::arg("mass") = 0.85f,
       nb::arg("chunk_size") = 32, nb::arg("keep_first") = 4, nb::arg("keep_last") = 64,
       nb::arg("line_ends") = nb::none(), nb::arg("chunk_lines") = true, nb::arg("complete_lines") = false,
       nb::arg("pieces") = nb::none(), nb::arg("question_lines") = 0, nb::arg("protect") = nb::none(),
       "Sorted positions to prefill; with line_ends (a flag per token: it ends a line), chunks follow lines "
       "(chunk_lines) and kept runs grow to whole lines (complete_lines); with pieces (each token's text) too, the "
       "lines sharing a word with the question are kept (question_lines > 0: the most lines such a word may be in); "
       "protect (a flag per token): tokens always kept, added to what the selection keeps without them.");

    m.def("question_lines", [](std::vector<std::string> pieces, std::vector<uint8_t> line_ends, int32_t n_question,
                               int32_t max_lines) {
        if (line_ends.size() != pieces.size()) {
            throw std::invalid_argument("question_lines: need one line_ends flag per piece");
        }
        return common_spec_prefill_question_lines(pieces.data(), line_ends.data(), (int32_t) pieces.size(),
                n_question, max_lines);
    }, nb::arg("pieces"), nb::arg("line_ends"), nb::arg("n_question"), nb::arg("max_lines"),
       "A flag per token: its line shares a word with the question's lines (those of the last n_question tokens), "
       "a word in 1 to max_lines lines before them.");

    m.def("settings", []() {
        const common_spec_prefill_settings defaults;
        nb::list out;
        for (const auto & setting : common_spec_prefill_settings_table()) {
            nb::dict row;
            row["key"]         = setting.key;
            row["flags"]       = std::vector<std::string>(setting.flags.begin(), setting.flags.end());
            row["flags_neg"]   = std::vector<std::string>(setting.flags_neg.begin(), setting.flags_neg.end());
            row["env"]         = setting.env;
            row["env_seed"]    = setting.env_seed ? nb::object(nb::str(setting.env_seed)) : nb::none();
            row["type"]        = type_name(setting.type);
            row["values"]      = common_spec_prefill_setting_values(setting);
            row["default"]     = common_spec_prefill_setting_text(setting, defaults);
            row["choices"]     = std::vector<std::string>(setting.choices.begin(), setting.choices.end());
            row["help"]        = setting.help;
            row["server_only"] = setting.server_only;
            row["per_request"] = setting.per_request;
            out.append(row);
        }
        return out;
    }, "The settings table, one dict per setting: key, flags, flags_neg, env, env_seed, type, values, default (as the "
       "help writes it), choices, help, server_only, per_request.");
}
