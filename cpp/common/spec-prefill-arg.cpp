#include "spec-prefill-arg.h"

#include "arg.h"
#include "common.h"
#include "spec-prefill-select.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

//
// ranges
//

static std::string spec_prefill_number_text(double x) {
    if (x >= SPEC_PREFILL_INT_MAX) {
        return "";
    }
    return x == std::floor(x) && std::fabs(x) < 1e15 ? std::to_string((long long) x) : string_format("%g", x);
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

double common_spec_prefill_parse_number(const std::string & flag, const std::string & text,
        const common_spec_prefill_range & range) {
    const char * begin = text.c_str();
    char * end = nullptr;
    const double x = std::strtod(begin, &end);
    const bool whole = !text.empty() && end == begin + text.size() && !std::isspace((unsigned char) text[0]);
    if (!whole || !common_spec_prefill_in_range(range, x)) {
        throw std::invalid_argument(flag + " must be " + common_spec_prefill_range_text(range) + ", got '" + text + "'");
    }
    return x;
}

const char * common_spec_prefill_tool_guard_name(enum common_spec_prefill_tool_guard guard) {
    switch (guard) {
        case COMMON_SPEC_PREFILL_TOOL_GUARD_OFF:     return "off";
        case COMMON_SPEC_PREFILL_TOOL_GUARD_SKIP:    return "skip";
        case COMMON_SPEC_PREFILL_TOOL_GUARD_PROTECT: return "protect";
    }
    return nullptr;
}

bool common_spec_prefill_tool_guard_parse(const std::string & name, enum common_spec_prefill_tool_guard & guard) {
    for (const auto g : { COMMON_SPEC_PREFILL_TOOL_GUARD_OFF, COMMON_SPEC_PREFILL_TOOL_GUARD_SKIP,
                          COMMON_SPEC_PREFILL_TOOL_GUARD_PROTECT }) {
        if (name == common_spec_prefill_tool_guard_name(g)) {
            guard = g;
            return true;
        }
    }
    return false;
}

static int32_t spec_prefill_int(const char * flag, const std::string & text, const common_spec_prefill_range & range) {
    return (int32_t) common_spec_prefill_parse_number(flag, text, range);
}

static float spec_prefill_float(const char * flag, const std::string & text, const common_spec_prefill_range & range) {
    return (float) common_spec_prefill_parse_number(flag, text, range);
}

//
// flags (names compatible with PR #27692)
//

// arg.cpp's device-list parser (static there), for -devpd: a flag's handler is a plain function pointer, so it reads
// it from here; set when the flags are registered
static std::vector<ggml_backend_dev_t> (*spec_prefill_device_list_parser)(const std::string &) = nullptr;

static std::vector<ggml_backend_dev_t> spec_prefill_parse_device_list(const std::string & value) {
    return spec_prefill_device_list_parser(value);
}

void common_spec_prefill_add_args(const common_params & params, const std::function<void(common_arg)> & add_opt,
        std::vector<ggml_backend_dev_t> (*parse_device_list)(const std::string &)) {
    spec_prefill_device_list_parser = parse_device_list;

    add_opt(common_arg(
        {"--spec-prefill", "--speculative-prefill", "--specprefill"},
        {"--no-spec-prefill"},
        string_format("speculative prefill: a draft model scores the prompt's tokens and the target prefills only the "
            "important chunks, at their original positions (lossy; default: %s)", params.spec_prefill.enabled ? "enabled" : "disabled"),
        [](common_params & params, bool value) {
            params.spec_prefill.enabled = value;
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL"));
    add_opt(common_arg(
        {"-mpd", "--spec-prefill-model", "--spec-prefill-draft-model", "--speculative-prefill-model", "--speculative-prefill-draft-model", "--specprefill-draft-model"}, "FNAME",
        "draft model that scores the prompt for speculative prefill, or '" COMMON_SPEC_PREFILL_SELF "': the target's own "
        "first --spec-prefill-layers layers, no second model; enables it (default: the --spec-draft-model)",
        [](common_params & params, const std::string & value) {
            params.spec_prefill.mparams.path    = value;
            params.spec_prefill.mparams.hf_file = value; // used if --spec-prefill-hf is set
            params.spec_prefill.enabled = true;
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_MODEL"));
    add_opt(common_arg(
        {"--spec-prefill-layers"}, "K",
        "speculative prefill: score with the scorer's first K layers only; the rest of its graph is not computed, and "
        "the query rows are the prompt's last --spec-prefill-lookahead tokens instead of greedy draft tokens "
        "(default: 0 = all layers of a draft; a quarter of the target's with -mpd " COMMON_SPEC_PREFILL_SELF ")",
        [](common_params & params, const std::string & value) {
            params.spec_prefill.n_layers = spec_prefill_int("--spec-prefill-layers", value, SPEC_PREFILL_RANGE_COUNT);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_LAYERS"));
    add_opt(common_arg(
        {"-hfpd", "--spec-prefill-hf", "--spec-prefill-draft-hf", "--speculative-prefill-hf", "--speculative-prefill-draft-hf"}, "<user>/<model>[:quant]",
        "Hugging Face repository of the speculative prefill draft; enables it",
        [](common_params & params, const std::string & value) {
            params.spec_prefill.mparams.hf_repo = value;
            params.spec_prefill.enabled = true;
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_HF"));
    add_opt(common_arg(
        {"-nglpd", "--spec-prefill-ngl", "--spec-prefill-draft-ngl"}, "N",
        "max. number of speculative prefill draft layers in VRAM, an exact number, 'auto', or 'all' (default: auto)",
        [](common_params & params, const std::string & value) {
            if (value == "auto") {
                params.spec_prefill.n_gpu_layers = -1;
            } else if (value == "all") {
                params.spec_prefill.n_gpu_layers = -2;
            } else {
                params.spec_prefill.n_gpu_layers = spec_prefill_int("--spec-prefill-ngl (or 'auto', 'all')", value,
                        SPEC_PREFILL_RANGE_COUNT);
            }
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_N_GPU_LAYERS"));
    add_opt(common_arg(
        {"-devpd", "--spec-prefill-device", "--spec-prefill-draft-device"}, "<dev1,dev2,..>",
        "comma-separated devices for the speculative prefill draft (none = don't offload, default: follows --device)",
        [](common_params & params, const std::string & value) {
            params.spec_prefill.devices = spec_prefill_parse_device_list(value);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_DEVICE"));
    add_opt(common_arg(
        {"--spec-prefill-p", "--spec-prefill-percentage", "--specprefill-keep-pct"}, "P",
        string_format("speculative prefill, keep mode: fraction of chunks to prefill, in (0, 1]; enables it (default: %.2f)",
            (double) params.spec_prefill.select.keep),
        [](common_params & params, const std::string & value) {
            params.spec_prefill.select.keep = spec_prefill_float("--spec-prefill-p", value, SPEC_PREFILL_RANGE_P);
            params.spec_prefill.enabled = true;
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_P"));
    add_opt(common_arg(
        {"--spec-prefill-select"}, "keep|mass",
        string_format("speculative prefill selection: 'keep' the top --spec-prefill-p of chunks, or the highest chunks until "
            "they hold --spec-prefill-mass of the score ('mass') (default: %s)",
            common_spec_prefill_select_mode_name(params.spec_prefill.select.mode)),
        [](common_params & params, const std::string & value) {
            if (value == "keep") {
                params.spec_prefill.select.mode = COMMON_SPEC_PREFILL_SELECT_KEEP;
            } else if (value == "mass") {
                params.spec_prefill.select.mode = COMMON_SPEC_PREFILL_SELECT_MASS;
            } else {
                throw std::invalid_argument("--spec-prefill-select must be 'keep' or 'mass', got '" + value + "'");
            }
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_SELECT"));
    add_opt(common_arg(
        {"--spec-prefill-mass"}, "M",
        string_format("speculative prefill, mass mode: share of the score mass to keep, in (0, 1] (default: %.2f)",
            (double) params.spec_prefill.select.mass),
        [](common_params & params, const std::string & value) {
            params.spec_prefill.select.mass = spec_prefill_float("--spec-prefill-mass", value, SPEC_PREFILL_RANGE_MASS);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_MASS"));
    add_opt(common_arg(
        {"--spec-prefill-chunk", "--spec-prefill-chunk-size"}, "N",
        string_format("speculative prefill: tokens per selected chunk, 0 selects single tokens (default: %d)", params.spec_prefill.select.chunk_size),
        [](common_params & params, const std::string & value) {
            params.spec_prefill.select.chunk_size = spec_prefill_int("--spec-prefill-chunk", value, SPEC_PREFILL_RANGE_CHUNK_SIZE);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_CHUNK"));
    add_opt(common_arg(
        {"--spec-prefill-chunk-lines"},
        {"--no-spec-prefill-chunk-lines"},
        string_format("speculative prefill: chunks end at a line end near their size, so a short line is kept or "
            "dropped whole (default: %s)", params.spec_prefill.select.chunk_lines ? "enabled" : "disabled"),
        [](common_params & params, bool value) {
            params.spec_prefill.select.chunk_lines = value;
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_CHUNK_LINES"));
    add_opt(common_arg(
        {"--spec-prefill-complete-lines"},
        {"--no-spec-prefill-complete-lines"},
        string_format("speculative prefill: a kept run of tokens that starts or ends inside a line grows to the line's "
            "start or end, where at most half a chunk is missing (default: %s)",
            params.spec_prefill.select.complete_lines ? "enabled" : "disabled"),
        [](common_params & params, bool value) {
            params.spec_prefill.select.complete_lines = value;
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_COMPLETE_LINES"));
    add_opt(common_arg(
        {"--spec-prefill-question-lines"}, "N",
        string_format("speculative prefill: also keep each line that shares a word (4+ letters or digits) with the "
            "question (the always-kept last tokens' lines) where that word is in at most N lines before it; 0: off "
            "(default: %d)", params.spec_prefill.select.question_lines),
        [](common_params & params, const std::string & value) {
            params.spec_prefill.select.question_lines = spec_prefill_int("--spec-prefill-question-lines", value, SPEC_PREFILL_RANGE_COUNT);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_QUESTION_LINES"));
    add_opt(common_arg(
        {"--spec-prefill-lookahead", "--spec-prefill-lah"}, "N",
        string_format("speculative prefill: query rows, the prompt's last token plus N-1 greedy draft tokens; a request "
            "may ask for up to max(N, 8) (default: %d)", params.spec_prefill.lookahead),
        [](common_params & params, const std::string & value) {
            params.spec_prefill.lookahead = spec_prefill_int("--spec-prefill-lookahead", value, SPEC_PREFILL_RANGE_LOOKAHEAD);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_LOOKAHEAD"));
    add_opt(common_arg(
        {"--spec-prefill-pool-kernel"}, "N",
        string_format("speculative prefill: average-pool kernel along the prompt, 0 disables pooling (default: %d)", params.spec_prefill.pool_kernel),
        [](common_params & params, const std::string & value) {
            params.spec_prefill.pool_kernel = spec_prefill_int("--spec-prefill-pool-kernel", value, SPEC_PREFILL_RANGE_POOL_KERNEL);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_POOL_KERNEL"));
    add_opt(common_arg(
        {"--spec-prefill-min-tokens", "--specprefill-min-tokens", "--specprefill-threshold"}, "N",
        string_format("speculative prefill: prompts shorter than N tokens are prefilled in full (default: %d)", params.spec_prefill.min_tokens),
        [](common_params & params, const std::string & value) {
            params.spec_prefill.min_tokens = spec_prefill_int("--spec-prefill-min-tokens", value, SPEC_PREFILL_RANGE_COUNT);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_MIN_TOKENS"));
    add_opt(common_arg(
        {"--spec-prefill-ctx"}, "N",
        "speculative prefill: most KV cells of the draft context; longer prompts are scored in windows (default: 0 = the draft's trained context)",
        [](common_params & params, const std::string & value) {
            params.spec_prefill.n_ctx = spec_prefill_int("--spec-prefill-ctx", value, SPEC_PREFILL_RANGE_CTX);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_CTX"));
    add_opt(common_arg(
        {"--spec-prefill-window"}, "W",
        "speculative prefill: score the prompt in windows of W tokens, each also seeing the prompt's start and its question "
        "(default: 0 = automatic: windows of 8192 for more than 16384 new tokens or a prompt over --spec-prefill-ctx; "
        "a W at least the prompt's length scores it whole)",
        [](common_params & params, const std::string & value) {
            params.spec_prefill.window = spec_prefill_int("--spec-prefill-window", value, SPEC_PREFILL_RANGE_WINDOW);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_WINDOW"));
    add_opt(common_arg(
        {"--spec-prefill-keep-first"}, "N",
        string_format("speculative prefill: always prefill the first N tokens (BOS, attention sinks) (default: %d)", params.spec_prefill.select.keep_first),
        [](common_params & params, const std::string & value) {
            params.spec_prefill.select.keep_first = spec_prefill_int("--spec-prefill-keep-first", value, SPEC_PREFILL_RANGE_COUNT);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_KEEP_FIRST"));
    add_opt(common_arg(
        {"--spec-prefill-keep-last"}, "N",
        string_format("speculative prefill: always prefill the last N tokens, at least one chunk (template closers, the question) (default: %d)",
            params.spec_prefill.select.keep_last),
        [](common_params & params, const std::string & value) {
            params.spec_prefill.select.keep_last = spec_prefill_int("--spec-prefill-keep-last", value, SPEC_PREFILL_RANGE_COUNT);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_KEEP_LAST"));
    add_opt(common_arg(
        {"--spec-prefill-max-keep"}, "N",
        "speculative prefill: prefill at most N prompt tokens, the highest-scoring chunks that fit (the always-kept "
        "first and last tokens even beyond it) (default: 0 = no cap)",
        [](common_params & params, const std::string & value) {
            params.spec_prefill.select.max_keep = spec_prefill_int("--spec-prefill-max-keep", value, SPEC_PREFILL_RANGE_COUNT);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_SPEC_PREFILL_MAX_KEEP"));
    add_opt(common_arg(
        {"--spec-prefill-reuse"}, "sparse|exact",
        "speculative prefill in llama-server: a follow-up request reuses a slot's sparse KV as it is and scores only the "
        "new tokens ('sparse'), or reuses it only up to its first dropped position ('exact') (default: sparse)",
        [](common_params & params, const std::string & value) {
            if (value == "sparse") {
                params.spec_prefill.server.reuse_exact = false;
            } else if (value == "exact") {
                params.spec_prefill.server.reuse_exact = true;
            } else {
                throw std::invalid_argument("--spec-prefill-reuse must be 'sparse' or 'exact', got '" + value + "'");
            }
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SERVER}).set_env("LLAMA_ARG_SPEC_PREFILL_REUSE"));
    add_opt(common_arg(
        {"--spec-prefill-break-even"}, "FACTOR",
        "speculative prefill in llama-server: prefill in full when the estimated speedup is below FACTOR, from the "
        "throughputs measured on earlier requests or, before those, the models' shapes (default: 1.1; 0 = never)",
        [](common_params & params, const std::string & value) {
            params.spec_prefill.server.break_even = spec_prefill_float("--spec-prefill-break-even", value, SPEC_PREFILL_RANGE_BREAK_EVEN);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SERVER}).set_env("LLAMA_ARG_SPEC_PREFILL_BREAK_EVEN"));
    add_opt(common_arg(
        {"--spec-prefill-tool-guard"}, "skip|protect|off",
        string_format("speculative prefill in llama-server, for requests with tools or a tool-call grammar: skip "
            "prefills them in full; protect keeps the system message, the tool definitions, the last user message "
            "and the latest tool call whole and scores the rest (older turns, tool results); off scores them like "
            "any other (default: %s)", common_spec_prefill_tool_guard_name(params.spec_prefill.server.tool_guard)),
        [](common_params & params, const std::string & value) {
            // the boolean spellings of the earlier on/off flag, for its environment variable
            const std::string v = value == "1" || value == "true" ? "skip" : value == "0" || value == "false" ? "off" : value;
            if (!common_spec_prefill_tool_guard_parse(v, params.spec_prefill.server.tool_guard)) {
                throw std::invalid_argument("--spec-prefill-tool-guard must be skip, protect or off, got '" + value + "'");
            }
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SERVER}).set_env("LLAMA_ARG_SPEC_PREFILL_TOOL_GUARD"));
    add_opt(common_arg(
        {"--no-spec-prefill-tool-guard"},
        "speculative prefill in llama-server: the same as --spec-prefill-tool-guard off",
        [](common_params & params) {
            params.spec_prefill.server.tool_guard = COMMON_SPEC_PREFILL_TOOL_GUARD_OFF;
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--spec-prefill-queue-max"}, "N",
        "speculative prefill in llama-server: at most N requests wait for the prefill draft while it scores another; "
        "the next is prefilled in full (status skipped_queue), as is one whose expected wait would eat its expected "
        "saving (default: -1 = no bound but that; 0 = score only when the draft is idle)",
        [](common_params & params, const std::string & value) {
            params.spec_prefill.server.queue_max = spec_prefill_int("--spec-prefill-queue-max", value, SPEC_PREFILL_RANGE_QUEUE_MAX);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SERVER}).set_env("LLAMA_ARG_SPEC_PREFILL_QUEUE_MAX"));
    add_opt(common_arg(
        {"--spec-prefill-window-min"}, "N",
        "speculative prefill in llama-server: the smallest window a request may ask for (spec_prefill.window); a "
        "smaller one is refused, since its scoring costs more than scoring without windows (default: 1024)",
        [](common_params & params, const std::string & value) {
            params.spec_prefill.server.window_min = spec_prefill_int("--spec-prefill-window-min", value, SPEC_PREFILL_RANGE_WINDOW);
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SERVER}).set_env("LLAMA_ARG_SPEC_PREFILL_WINDOW_MIN"));
}
