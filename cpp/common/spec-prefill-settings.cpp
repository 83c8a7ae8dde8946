#include "spec-prefill-settings.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

//
// ranges
//

static std::string spec_prefill_number_text(double x) {
    if (x >= SPEC_PREFILL_INT_MAX) {
        return "";
    }
    if (x == std::floor(x) && std::fabs(x) < 1e15) {
        return std::to_string((long long) x);
    }
    char buf[32];
    snprintf(buf, sizeof(buf), "%g", x);
    return buf;
}

std::string common_spec_prefill_range_text(const common_spec_prefill_range & range) {
    const std::string what = range.integer ? "an integer " : "";
    const std::string lo = spec_prefill_number_text(range.lo);
    const std::string hi = spec_prefill_number_text(range.hi);
    const std::string span = hi.empty() ? (range.lo_open ? "> " : ">= ") + lo :
            "in " + std::string(range.lo_open ? "(" : "[") + lo + ", " + hi + "]";
    return (range.zero_too ? "0 or " : "") + what + span;
}

bool common_spec_prefill_in_range(const common_spec_prefill_range & range, double x) {
    if (!std::isfinite(x)) {
        return false;
    }
    if (range.integer && x != std::floor(x)) {
        return false;
    }
    if (!range.integer) {
        x = (double) (float) x; // what the setting will hold
    }
    if (range.zero_too && x == 0.0) {
        return true;
    }
    return (range.lo_open ? x > range.lo : x >= range.lo) && x <= range.hi;
}

double common_spec_prefill_parse_number(const std::string & name, const std::string & text,
        const common_spec_prefill_range & range) {
    const char * begin = text.c_str();
    char * end = nullptr;
    const double x = std::strtod(begin, &end);
    const bool whole = !text.empty() && end == begin + text.size() && !std::isspace((unsigned char) text[0]);
    if (!whole || !common_spec_prefill_in_range(range, x)) {
        throw std::invalid_argument(name + " must be " + common_spec_prefill_range_text(range) + ", got '" + text + "'");
    }
    return x;
}

//
// the table
//

// a row's get and set, for a member of common_spec_prefill_settings (an enum's or a bool's value as a number)
#define SPEC_PREFILL_FIELD(member) \
    [](const common_spec_prefill_settings & s) { return (double) s.member; }, \
    [](common_spec_prefill_settings & s, double x) { s.member = (decltype(s.member)) x; }

// the choices of an enum's setting are its names by value
static_assert(COMMON_SPEC_PREFILL_SELECT_KEEP == 0 && COMMON_SPEC_PREFILL_SELECT_MASS == 1, "select choices");
static_assert(COMMON_SPEC_PREFILL_TOOL_GUARD_OFF == 0 && COMMON_SPEC_PREFILL_TOOL_GUARD_SKIP == 1 &&
              COMMON_SPEC_PREFILL_TOOL_GUARD_PROTECT == 2, "tool_guard choices");

using setting = common_spec_prefill_setting;
static constexpr common_spec_prefill_range NO_RANGE = { 0.0, 0.0, false, false, false };
static constexpr auto INT    = COMMON_SPEC_PREFILL_SETTING_INT;
static constexpr auto FLOAT  = COMMON_SPEC_PREFILL_SETTING_FLOAT;
static constexpr auto BOOL   = COMMON_SPEC_PREFILL_SETTING_BOOL;
static constexpr auto CHOICE = COMMON_SPEC_PREFILL_SETTING_CHOICE;

const std::vector<common_spec_prefill_setting> & common_spec_prefill_settings_table() {
    // key, flags, --no- flags, env, seed env, type, hint, range, choices, aliases, help, values note,
    // server only, per request, enables, get and set
    static const std::vector<setting> table = {
        { "p", {"--spec-prefill-p", "--spec-prefill-percentage", "--specprefill-keep-pct"}, {},
          "LLAMA_ARG_SPEC_PREFILL_P", "SP_KEEP_PCT", FLOAT, "P", SPEC_PREFILL_RANGE_P, {}, {},
          "keep mode: fraction of chunks to prefill, in (0, 1]; enables it", nullptr,
          false, true, true, SPEC_PREFILL_FIELD(select.keep) },
        { "select", {"--spec-prefill-select"}, {},
          "LLAMA_ARG_SPEC_PREFILL_SELECT", "SP_SELECT_MODE", CHOICE, "keep|mass", NO_RANGE, {"keep", "mass"},
          {{"chunk", COMMON_SPEC_PREFILL_SELECT_KEEP}}, // the seed tool's name of keep mode
          "selection: 'keep' the top --spec-prefill-p of chunks, or the highest chunks until they hold "
          "--spec-prefill-mass of the score ('mass')", nullptr,
          false, true, false, SPEC_PREFILL_FIELD(select.mode) },
        { "mass", {"--spec-prefill-mass"}, {},
          "LLAMA_ARG_SPEC_PREFILL_MASS", "SP_CUMULATIVE_MASS", FLOAT, "M", SPEC_PREFILL_RANGE_P, {}, {},
          "mass mode: share of the score mass to keep, in (0, 1]", nullptr,
          false, true, false, SPEC_PREFILL_FIELD(select.mass) },
        { "chunk_size", {"--spec-prefill-chunk", "--spec-prefill-chunk-size"}, {},
          "LLAMA_ARG_SPEC_PREFILL_CHUNK", "SP_CHUNK", INT, "N", SPEC_PREFILL_RANGE_CHUNK_SIZE, {}, {},
          "tokens per selected chunk, 0 selects single tokens", nullptr,
          false, true, false, SPEC_PREFILL_FIELD(select.chunk_size) },
        { "chunk_lines", {"--spec-prefill-chunk-lines"}, {"--no-spec-prefill-chunk-lines"},
          "LLAMA_ARG_SPEC_PREFILL_CHUNK_LINES", nullptr, BOOL, nullptr, NO_RANGE, {}, {},
          "chunks end at a line end near their size, so a short line is kept or dropped whole", nullptr,
          false, true, false, SPEC_PREFILL_FIELD(select.chunk_lines) },
        { "complete_lines", {"--spec-prefill-complete-lines"}, {"--no-spec-prefill-complete-lines"},
          "LLAMA_ARG_SPEC_PREFILL_COMPLETE_LINES", nullptr, BOOL, nullptr, NO_RANGE, {}, {},
          "a kept run of tokens that starts or ends inside a line grows to the line's start or end, where at most "
          "half a chunk is missing", nullptr,
          false, true, false, SPEC_PREFILL_FIELD(select.complete_lines) },
        { "question_lines", {"--spec-prefill-question-lines"}, {},
          "LLAMA_ARG_SPEC_PREFILL_QUESTION_LINES", nullptr, INT, "N", SPEC_PREFILL_RANGE_COUNT, {}, {},
          "also keep each line that shares a word (4+ letters or digits) with the question (the always-kept last "
          "tokens' lines) where that word is in at most N lines before it", "0 = off",
          false, true, false, SPEC_PREFILL_FIELD(select.question_lines) },
        { "keep_first", {"--spec-prefill-keep-first"}, {},
          "LLAMA_ARG_SPEC_PREFILL_KEEP_FIRST", nullptr, INT, "N", SPEC_PREFILL_RANGE_COUNT, {}, {},
          "always prefill the first N tokens (BOS, attention sinks)", nullptr,
          false, true, false, SPEC_PREFILL_FIELD(select.keep_first) },
        { "keep_last", {"--spec-prefill-keep-last"}, {},
          "LLAMA_ARG_SPEC_PREFILL_KEEP_LAST", nullptr, INT, "N", SPEC_PREFILL_RANGE_COUNT, {}, {},
          "always prefill the last N tokens, at least one chunk (template closers, the question)", nullptr,
          false, true, false, SPEC_PREFILL_FIELD(select.keep_last) },
        { "max_keep", {"--spec-prefill-max-keep"}, {},
          "LLAMA_ARG_SPEC_PREFILL_MAX_KEEP", "SP_MAX_KEEP", INT, "N", SPEC_PREFILL_RANGE_COUNT, {}, {},
          "prefill at most N prompt tokens, the highest-scoring chunks that fit (the always-kept first and last "
          "tokens even beyond it)", "0 = no cap",
          false, true, false, SPEC_PREFILL_FIELD(select.max_keep) },
        { "lookahead", {"--spec-prefill-lookahead", "--spec-prefill-lah"}, {},
          "LLAMA_ARG_SPEC_PREFILL_LOOKAHEAD", "SP_LOOKAHEAD", INT, "N", SPEC_PREFILL_RANGE_LOOKAHEAD, {}, {},
          "query rows, the prompt's last token plus N-1 greedy draft tokens; a request may ask for up to max(N, 8)",
          nullptr, false, true, false, SPEC_PREFILL_FIELD(lookahead) },
        { "layers", {"--spec-prefill-layers"}, {},
          "LLAMA_ARG_SPEC_PREFILL_LAYERS", nullptr, INT, "K", SPEC_PREFILL_RANGE_COUNT, {}, {},
          "score with the scorer's first K layers only; the rest of its graph is not computed, and the query rows "
          "are the prompt's last --spec-prefill-lookahead tokens instead of greedy draft tokens",
          "0 = all layers of a draft; a quarter of the target's with -mpd " COMMON_SPEC_PREFILL_SELF,
          false, true, false, SPEC_PREFILL_FIELD(n_layers) },
        { "pool_kernel", {"--spec-prefill-pool-kernel"}, {},
          "LLAMA_ARG_SPEC_PREFILL_POOL_KERNEL", nullptr, INT, "N", SPEC_PREFILL_RANGE_KERNEL, {}, {},
          "average-pool kernel along the prompt, 0 disables pooling", nullptr,
          false, false, false, SPEC_PREFILL_FIELD(pool_kernel) },
        { "min_tokens", {"--spec-prefill-min-tokens", "--specprefill-min-tokens", "--specprefill-threshold"}, {},
          "LLAMA_ARG_SPEC_PREFILL_MIN_TOKENS", nullptr, INT, "N", SPEC_PREFILL_RANGE_COUNT, {}, {},
          "prompts shorter than N tokens are prefilled in full", nullptr,
          false, true, false, SPEC_PREFILL_FIELD(min_tokens) },
        { "ctx", {"--spec-prefill-ctx"}, {},
          "LLAMA_ARG_SPEC_PREFILL_CTX", "SP_SPEC_CTX", INT, "N", SPEC_PREFILL_RANGE_CTX, {}, {},
          "most KV cells of the draft context; longer prompts are scored in windows", "0 = the draft's trained context",
          false, false, false, SPEC_PREFILL_FIELD(n_ctx) },
        { "window", {"--spec-prefill-window"}, {},
          "LLAMA_ARG_SPEC_PREFILL_WINDOW", "SP_WINDOW", INT, "W", SPEC_PREFILL_RANGE_WINDOW, {}, {},
          "score the prompt in windows of W tokens, each also seeing the prompt's start and its question",
          "0 = automatic: windows of 8192 for more than 16384 new tokens or a prompt over --spec-prefill-ctx; a W at "
          "least the prompt's length scores it whole",
          false, true, false, SPEC_PREFILL_FIELD(window) },
        { "reuse", {"--spec-prefill-reuse"}, {},
          "LLAMA_ARG_SPEC_PREFILL_REUSE", nullptr, CHOICE, "sparse|exact", NO_RANGE, {"sparse", "exact"}, {},
          "in llama-server: a follow-up request reuses a slot's sparse KV as it is and scores only the new tokens "
          "('sparse'), or reuses it only up to its first dropped position ('exact')", nullptr,
          true, false, false, SPEC_PREFILL_FIELD(server.reuse_exact) },
        { "break_even", {"--spec-prefill-break-even"}, {},
          "LLAMA_ARG_SPEC_PREFILL_BREAK_EVEN", nullptr, FLOAT, "FACTOR", SPEC_PREFILL_RANGE_BREAK_EVEN, {}, {},
          "in llama-server: prefill in full when the estimated speedup is below FACTOR, from the throughputs "
          "measured on earlier requests or, before those, the models' shapes", "0 = never",
          true, true, false, SPEC_PREFILL_FIELD(server.break_even) },
        { "tool_guard", {"--spec-prefill-tool-guard"}, {},
          "LLAMA_ARG_SPEC_PREFILL_TOOL_GUARD", nullptr, CHOICE, "skip|protect|off", NO_RANGE,
          {"off", "skip", "protect"},
          // the boolean spellings of the earlier on/off flag, for its environment variable
          {{"1", COMMON_SPEC_PREFILL_TOOL_GUARD_SKIP}, {"true", COMMON_SPEC_PREFILL_TOOL_GUARD_SKIP},
           {"0", COMMON_SPEC_PREFILL_TOOL_GUARD_OFF}, {"false", COMMON_SPEC_PREFILL_TOOL_GUARD_OFF}},
          "in llama-server, for requests with tools or a tool-call grammar: skip prefills them in full; protect keeps "
          "the system message, the tool definitions, the last user message and the latest tool call whole and adds "
          "them to what the scoring keeps of the rest (older turns, tool results); off scores them like any other",
          nullptr, true, true, false, SPEC_PREFILL_FIELD(server.tool_guard) },
        { "queue_max", {"--spec-prefill-queue-max"}, {},
          "LLAMA_ARG_SPEC_PREFILL_QUEUE_MAX", nullptr, INT, "N", SPEC_PREFILL_RANGE_QUEUE_MAX, {}, {},
          "in llama-server: at most N requests wait for the prefill draft while it scores another; the next is "
          "prefilled in full (status skipped_queue), as is one whose expected wait would eat its expected saving",
          "-1 = no bound but that; 0 = score only when the draft is idle",
          true, false, false, SPEC_PREFILL_FIELD(server.queue_max) },
        { "window_min", {"--spec-prefill-window-min"}, {},
          "LLAMA_ARG_SPEC_PREFILL_WINDOW_MIN", nullptr, INT, "N", SPEC_PREFILL_RANGE_WINDOW, {}, {},
          "in llama-server: the smallest window a request may ask for (spec_prefill.window); a smaller one is "
          "refused, since its scoring costs more than scoring without windows", nullptr,
          true, false, false, SPEC_PREFILL_FIELD(server.window_min) },
    };
    return table;
}

#undef SPEC_PREFILL_FIELD

const common_spec_prefill_setting * common_spec_prefill_setting_find(const std::string & key) {
    for (const auto & s : common_spec_prefill_settings_table()) {
        if (key == s.key) {
            return &s;
        }
    }
    return nullptr;
}

std::string common_spec_prefill_setting_text(const common_spec_prefill_setting & setting,
        const common_spec_prefill_settings & s) {
    const double x = setting.get(s);
    switch (setting.type) {
        case COMMON_SPEC_PREFILL_SETTING_INT:    return std::to_string((long long) x);
        case COMMON_SPEC_PREFILL_SETTING_FLOAT:  {
            char buf[32];
            snprintf(buf, sizeof(buf), "%g", x);
            return buf;
        }
        case COMMON_SPEC_PREFILL_SETTING_BOOL:   return x != 0.0 ? "enabled" : "disabled";
        case COMMON_SPEC_PREFILL_SETTING_CHOICE: {
            const size_t i = (size_t) x;
            return i < setting.choices.size() ? setting.choices[i] : "?";
        }
    }
    return "";
}

std::string common_spec_prefill_setting_values(const common_spec_prefill_setting & setting) {
    switch (setting.type) {
        case COMMON_SPEC_PREFILL_SETTING_INT:
        case COMMON_SPEC_PREFILL_SETTING_FLOAT:
            return common_spec_prefill_range_text(setting.range);
        case COMMON_SPEC_PREFILL_SETTING_BOOL:
            return "true or false";
        case COMMON_SPEC_PREFILL_SETTING_CHOICE: {
            std::string out;
            for (size_t i = 0; i < setting.choices.size(); ++i) {
                out += i == 0 ? "" : i + 1 == setting.choices.size() ? " or " : ", ";
                out += setting.choices[i];
            }
            return out;
        }
    }
    return "";
}

int32_t common_spec_prefill_setting_choice(const common_spec_prefill_setting & setting, const std::string & name,
        bool aliases) {
    for (size_t i = 0; i < setting.choices.size(); ++i) {
        if (name == setting.choices[i]) {
            return (int32_t) i;
        }
    }
    for (const auto & alias : setting.aliases) {
        if (aliases && name == alias.name) {
            return alias.index;
        }
    }
    return -1;
}

void common_spec_prefill_setting_parse(const common_spec_prefill_setting & setting, common_spec_prefill_settings & s,
        const std::string & name, const std::string & text) {
    switch (setting.type) {
        case COMMON_SPEC_PREFILL_SETTING_INT:
        case COMMON_SPEC_PREFILL_SETTING_FLOAT:
            setting.set(s, common_spec_prefill_parse_number(name, text, setting.range));
            return;
        case COMMON_SPEC_PREFILL_SETTING_BOOL:
            for (const char * t : {"true", "1", "on", "enabled"}) {
                if (text == t) {
                    setting.set(s, 1.0);
                    return;
                }
            }
            for (const char * f : {"false", "0", "off", "disabled"}) {
                if (text == f) {
                    setting.set(s, 0.0);
                    return;
                }
            }
            break;
        case COMMON_SPEC_PREFILL_SETTING_CHOICE: {
            const int32_t i = common_spec_prefill_setting_choice(setting, text, true);
            if (i >= 0) {
                setting.set(s, i);
                return;
            }
            break;
        }
    }
    throw std::invalid_argument(name + " must be " + common_spec_prefill_setting_values(setting) + ", got '" +
            text + "'");
}

std::string common_spec_prefill_settings_check(const common_spec_prefill_settings & s) {
    for (const auto & setting : common_spec_prefill_settings_table()) {
        const double x = setting.get(s);
        bool ok = true;
        switch (setting.type) {
            case COMMON_SPEC_PREFILL_SETTING_INT:
            case COMMON_SPEC_PREFILL_SETTING_FLOAT:  ok = common_spec_prefill_in_range(setting.range, x); break;
            case COMMON_SPEC_PREFILL_SETTING_BOOL:   ok = true; break;
            case COMMON_SPEC_PREFILL_SETTING_CHOICE: ok = x >= 0 && x < (double) setting.choices.size(); break;
        }
        if (!ok) {
            return std::string(setting.key) + " must be " + common_spec_prefill_setting_values(setting) + ", got " +
                    spec_prefill_number_text(x);
        }
    }
    return "";
}
