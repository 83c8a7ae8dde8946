#include "server-specprefill.h"

#include "chat.h"
#include "log.h"
#include "spec-prefill-settings.h"
#include "../../src/llama-ext.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#define SPP_INF(fmt, ...) LOG_INF("srv  spec-prefill: " fmt, __VA_ARGS__)
#define SPP_WRN(fmt, ...) LOG_WRN("srv  spec-prefill: " fmt, __VA_ARGS__)
#define SPP_DBG(fmt, ...) LOG_DBG("srv  spec-prefill: " fmt, __VA_ARGS__)

const char * server_spec_prefill_status_name(enum server_spec_prefill_status status) {
    switch (status) {
        case SERVER_SPEC_PREFILL_NONE:                 return "none";
        case SERVER_SPEC_PREFILL_DISABLED:             return "disabled";
        case SERVER_SPEC_PREFILL_ACTIVE:               return "active";
        case SERVER_SPEC_PREFILL_KEPT_ALL:             return "kept_all";
        case SERVER_SPEC_PREFILL_SKIPPED_MIN_TOKENS:   return "skipped_min_tokens";
        case SERVER_SPEC_PREFILL_SKIPPED_BREAK_EVEN:   return "skipped_break_even";
        case SERVER_SPEC_PREFILL_SKIPPED_TOOL_GUARD:   return "skipped_tool_guard";
        case SERVER_SPEC_PREFILL_SKIPPED_INCOMPATIBLE: return "skipped_incompatible";
        case SERVER_SPEC_PREFILL_SKIPPED_QUEUE:        return "skipped_queue";
        case SERVER_SPEC_PREFILL_ERROR_FALLBACK:       return "error_fallback";
        case SERVER_SPEC_PREFILL_REUSED:               return "reused";
        case SERVER_SPEC_PREFILL_STATUS_COUNT:         break;
    }
    return "unknown";
}

//
// per-request parameters
//

// a setting's value as JSON: a number, a boolean or the choice's name
static json spec_prefill_setting_json(const common_spec_prefill_setting & setting, const common_spec_prefill_settings & s) {
    const double x = setting.get(s);
    switch (setting.type) {
        case COMMON_SPEC_PREFILL_SETTING_INT:    return (int32_t) x;
        case COMMON_SPEC_PREFILL_SETTING_FLOAT:  return (float) x;
        case COMMON_SPEC_PREFILL_SETTING_BOOL:   return x != 0.0;
        case COMMON_SPEC_PREFILL_SETTING_CHOICE: return common_spec_prefill_setting_text(setting, s);
    }
    return nullptr;
}

json server_spec_prefill_params::to_json() const {
    json j = {{"enabled", enabled}};
    for (const auto & setting : common_spec_prefill_settings_table()) {
        if (setting.per_request) {
            j[setting.key] = spec_prefill_setting_json(setting, *this);
        }
    }
    return j;
}

[[noreturn]] static void spec_prefill_bad_field(const std::string & field, const std::string & what) {
    throw std::invalid_argument("Field '" + field + "': " + what);
}

static bool spec_prefill_has(const json & obj, const char * key) {
    return obj.contains(key) && !obj.at(key).is_null();
}

static bool spec_prefill_get_bool(const json & obj, const char * key, const std::string & field) {
    const json & v = obj.at(key);
    if (!v.is_boolean()) {
        spec_prefill_bad_field(field, "must be true or false, got " + v.dump());
    }
    return v.get<bool>();
}

// a request's obj[key] into the setting, checked against its values (spec-prefill-settings.h), the ones its flag takes
// but where the server narrows them (`range`), or a 400 naming `field` (the key's path in the request); a number is
// checked before any conversion, so that 1e-300 for p is a 400, not a p of 0
static void spec_prefill_get_setting(const json & obj, const char * key, const std::string & field,
        const common_spec_prefill_setting & setting, const common_spec_prefill_range & range,
        server_spec_prefill_params & params) {
    const json & v = obj.at(key);
    switch (setting.type) {
        case COMMON_SPEC_PREFILL_SETTING_INT:
        case COMMON_SPEC_PREFILL_SETTING_FLOAT: {
            const bool number = range.integer ? v.is_number_integer() : v.is_number();
            if (!number || !common_spec_prefill_in_range(range, v.get<double>())) {
                spec_prefill_bad_field(field, "must be " + common_spec_prefill_range_text(range) + ", got " + v.dump());
            }
            setting.set(params, v.get<double>());
            return;
        }
        case COMMON_SPEC_PREFILL_SETTING_BOOL:
            setting.set(params, spec_prefill_get_bool(obj, key, field));
            return;
        case COMMON_SPEC_PREFILL_SETTING_CHOICE: {
            const int32_t i = v.is_string() ? common_spec_prefill_setting_choice(setting, v.get<std::string>(), false) : -1;
            if (i < 0) {
                spec_prefill_bad_field(field, "must be " + common_spec_prefill_setting_values(setting) + ", got " + v.dump());
            }
            setting.set(params, i);
            return;
        }
    }
}

// the values a request may give a setting: its flag's, narrowed where the server prepared for less
static common_spec_prefill_range spec_prefill_request_range(const common_spec_prefill_setting & setting,
        const common_params_spec_prefill & spp) {
    common_spec_prefill_range range = setting.range;
    if (std::string(setting.key) == "window") {
        // no smaller than the server's floor (--spec-prefill-window-min): small windows cost more to score
        range.lo = std::max<double>(range.lo, spp.server.window_min);
    } else if (std::string(setting.key) == "lookahead") {
        // the draft context is prepared with room for this many rows, not more
        range.hi = common_spec_prefill_lookahead_max(spp.lookahead);
    }
    return range;
}

// how much of a string prompt's start is kept to find it in the tokens' text (a tokenizer's BOS or leading space)
static constexpr size_t SPEC_PREFILL_PROMPT_HEAD = 64;

// spec_prefill.keep: [[begin, end], ...] in characters (Unicode code points) of a string prompt, or in tokens of a
// token prompt; held as bytes of the string or as tokens
static void spec_prefill_client_spans(const json & data, const json & keep, server_spec_prefill_params & params) {
    const std::string field = "spec_prefill.keep";
    const json prompt = data.contains("prompt") ? data.at("prompt") : json();
    const bool text   = prompt.is_string();
    const bool tokens = prompt.is_array() && !prompt.empty() &&
            std::all_of(prompt.begin(), prompt.end(), [](const json & t) { return t.is_number_integer(); });
    if (!text && !tokens) {
        spec_prefill_bad_field(field, "needs one prompt, a string or an array of tokens, to index");
    }
    if (!keep.is_array()) {
        spec_prefill_bad_field(field, "must be an array of [begin, end] ranges, got " + keep.dump());
    }
    // byte offset of each code point, and one past the last
    std::vector<int32_t> byte_of;
    if (text) {
        const std::string s = prompt.get<std::string>();
        for (size_t i = 0; i < s.size(); ++i) {
            if (((unsigned char) s[i] & 0xC0) != 0x80) {
                byte_of.push_back((int32_t) i);
            }
        }
        byte_of.push_back((int32_t) s.size());
    }
    const int64_t n = text ? (int64_t) byte_of.size() - 1 : (int64_t) prompt.size();
    for (const json & r : keep) {
        const bool pair = r.is_array() && r.size() == 2 && r[0].is_number_integer() && r[1].is_number_integer();
        if (!pair || r[0].get<int64_t>() < 0 || r[0].get<int64_t>() > r[1].get<int64_t>() || r[1].get<int64_t>() > n) {
            spec_prefill_bad_field(field, string_format("each range must be [begin, end] with 0 <= begin <= end <= %lld "
                    "(the prompt's %s), got %s", (long long) n, text ? "characters" : "tokens", r.dump().c_str()));
        }
        server_spec_prefill_protect span;
        span.role      = "client";
        span.in_tokens = tokens;
        span.begin     = text ? byte_of[r[0].get<int64_t>()] : (int32_t) r[0].get<int64_t>();
        span.end       = text ? byte_of[r[1].get<int64_t>()] : (int32_t) r[1].get<int64_t>();
        params.protect.push_back(span);
    }
}

// what server_spec_prefill_chat_spans wrote: [{"role", "begin", "end"}] in bytes of the rendered prompt
static void spec_prefill_chat_spans_from_json(const json & spans, server_spec_prefill_params & params) {
    const std::string field = "spec_prefill_spans";
    if (!spans.is_array()) {
        spec_prefill_bad_field(field, "must be an array of {role, begin, end}, got " + spans.dump());
    }
    for (const json & r : spans) {
        const bool ok = r.is_object() && r.contains("role") && r.at("role").is_string() &&
                r.contains("begin") && r.at("begin").is_number_integer() &&
                r.contains("end") && r.at("end").is_number_integer() &&
                r.at("begin").get<int64_t>() >= 0 && r.at("begin").get<int64_t>() <= r.at("end").get<int64_t>() &&
                r.at("end").get<int64_t>() <= INT32_MAX;
        if (!ok) {
            spec_prefill_bad_field(field, "each span must be {\"role\": string, \"begin\": int, \"end\": int} with "
                    "0 <= begin <= end, got " + r.dump());
        }
        server_spec_prefill_protect span;
        span.role  = r.at("role").get<std::string>();
        span.begin = (int32_t) r.at("begin").get<int64_t>();
        span.end   = (int32_t) r.at("end").get<int64_t>();
        params.protect.push_back(span);
    }
}

server_spec_prefill_params server_spec_prefill_params_from_json(const common_params & params_base, const json & data) {
    const auto & spp = params_base.spec_prefill;

    server_spec_prefill_params params;
    static_cast<common_spec_prefill_settings &>(params) = spp;
    params.enabled = spp.enabled;

    // vllm-mlx's flat fields first, so that the object wins when a client sends both
    if (spec_prefill_has(data, "specprefill")) {
        params.enabled = spec_prefill_get_bool(data, "specprefill", "specprefill");
    }
    if (spec_prefill_has(data, "specprefill_keep_pct")) {
        // vllm-mlx's name of p: the p row, and keep mode as the fraction implies
        const auto & p = *common_spec_prefill_setting_find("p");
        spec_prefill_get_setting(data, "specprefill_keep_pct", "specprefill_keep_pct", p, p.range, params);
        params.select.mode = COMMON_SPEC_PREFILL_SELECT_KEEP;
    }

    if (spec_prefill_has(data, "spec_prefill")) {
        const json & obj = data.at("spec_prefill");
        if (obj.is_boolean()) {
            params.enabled = obj.get<bool>();
        } else if (!obj.is_object()) {
            spec_prefill_bad_field("spec_prefill", "must be an object or a boolean, got " + obj.dump());
        } else {
            // the table's per-request settings, and the request's own fields
            std::vector<std::string> known = { "enabled", "return_kept", "keep" };
            for (const auto & setting : common_spec_prefill_settings_table()) {
                if (setting.per_request) {
                    known.push_back(setting.key);
                }
            }
            for (const auto & item : obj.items()) {
                if (std::find(known.begin(), known.end(), item.key()) == known.end()) {
                    // the key as JSON writes it, without its quotes: a control character in it (a NUL ended the
                    // message there) is escaped
                    const std::string key = json(item.key()).dump();
                    spec_prefill_bad_field("spec_prefill." + key.substr(1, key.size() - 2),
                            "unknown field (known: " + string_join(known, ", ") + ")");
                }
            }
            if (spec_prefill_has(obj, "enabled")) {
                params.enabled = spec_prefill_get_bool(obj, "enabled", "spec_prefill.enabled");
            }
            for (const auto & setting : common_spec_prefill_settings_table()) {
                if (setting.per_request && spec_prefill_has(obj, setting.key)) {
                    spec_prefill_get_setting(obj, setting.key, std::string("spec_prefill.") + setting.key, setting,
                            spec_prefill_request_range(setting, spp), params);
                }
            }
            if (spec_prefill_has(obj, "return_kept")) {
                params.return_kept = spec_prefill_get_bool(obj, "return_kept", "spec_prefill.return_kept");
            }
            if (spec_prefill_has(obj, "keep")) {
                spec_prefill_client_spans(data, obj.at("keep"), params);
            }
        }
    }
    if (spec_prefill_has(data, "spec_prefill_spans")) {
        spec_prefill_chat_spans_from_json(data.at("spec_prefill_spans"), params);
    }
    if (data.contains("prompt") && data.at("prompt").is_string()) {
        params.prompt_head = data.at("prompt").get<std::string>().substr(0, SPEC_PREFILL_PROMPT_HEAD);
    }

    // tools: the chat endpoint leaves them in the request, and renders a lazy tool-call grammar
    const bool has_tools = data.contains("tools") && data.at("tools").is_array() && !data.at("tools").empty();
    const bool tool_grammar = (data.contains("grammar_type") && data.at("grammar_type") == "tool_calls") ||
            (data.contains("grammar_lazy") && data.at("grammar_lazy").is_boolean() && data.at("grammar_lazy").get<bool>());
    params.has_tools = has_tools || tool_grammar;

    return params;
}

//
// the chat's structure
//

// the lengths of the common prefix and the common suffix of a and b, which do not overlap
static void spec_prefill_common_ends(const std::string & a, const std::string & b, size_t & prefix, size_t & suffix) {
    const size_t n = std::min(a.size(), b.size());
    prefix = 0;
    while (prefix < n && a[prefix] == b[prefix]) {
        prefix++;
    }
    suffix = 0;
    while (suffix < n - prefix && a[a.size() - 1 - suffix] == b[b.size() - 1 - suffix]) {
        suffix++;
    }
}

// the request's own spec prefill switch and tool guard, read leniently (server_spec_prefill_params_from_json reports
// a bad value)
static bool spec_prefill_protects(const common_params_spec_prefill & spp, const json & body) {
    bool enabled = spp.enabled;
    auto guard   = spp.server.tool_guard;
    if (body.contains("specprefill") && body.at("specprefill").is_boolean()) {
        enabled = body.at("specprefill").get<bool>();
    }
    if (body.contains("spec_prefill")) {
        const json & obj = body.at("spec_prefill");
        if (obj.is_boolean()) {
            enabled = obj.get<bool>();
        } else if (obj.is_object()) {
            if (obj.contains("enabled") && obj.at("enabled").is_boolean()) {
                enabled = obj.at("enabled").get<bool>();
            }
            if (obj.contains("tool_guard") && obj.at("tool_guard").is_string()) {
                const int32_t i = common_spec_prefill_setting_choice(*common_spec_prefill_setting_find("tool_guard"),
                        obj.at("tool_guard").get<std::string>(), false);
                guard = i >= 0 ? (common_spec_prefill_tool_guard) i : guard;
            }
        }
    }
    return spp.enabled && enabled && guard == COMMON_SPEC_PREFILL_TOOL_GUARD_PROTECT;
}

void server_spec_prefill_chat_spans(const common_params_spec_prefill & spp, const common_chat_templates * tmpls,
        const common_chat_templates_inputs & inputs, const std::string & prompt, const json & body, json & llama_params) {
    if (inputs.tools.empty() || inputs.messages.empty() || !spec_prefill_protects(spp, body)) {
        return;
    }
    const int64_t t_start = ggml_time_us();
    int32_t n_renders = 0;
    auto render = [&](const common_chat_templates_inputs & in, std::string & out) {
        n_renders++;
        try {
            out = common_chat_templates_apply(tmpls, in).prompt;
            return true;
        } catch (const std::exception & e) {
            SPP_DBG("the chat template cannot render a marked copy of the request: %s\n", e.what());
            return false;
        }
    };
    const auto & msgs = inputs.messages;

    // where message i's text lies in the prompt: the template renders it again with that text marked at both ends
    // (a control character no text starts or ends with), and only the marked part differs
    std::map<size_t, std::pair<size_t, size_t>> text_of;
    auto find_text = [&](size_t i, std::pair<size_t, size_t> & out) {
        if (auto it = text_of.find(i); it != text_of.end()) {
            out = it->second;
            return true;
        }
        static const std::string mark = "\x01";
        common_chat_templates_inputs in = inputs;
        common_chat_msg & msg = in.messages[i];
        auto text_part = [](const common_chat_msg_content_part & part) { return part.type == "text"; };
        const auto first = std::find_if(msg.content_parts.begin(), msg.content_parts.end(), text_part);
        if (!msg.content.empty()) {
            msg.content = mark + msg.content + mark;
        } else if (first != msg.content_parts.end()) {
            first->text = mark + first->text;
            std::find_if(msg.content_parts.rbegin(), msg.content_parts.rend(), text_part)->text += mark;
        } else if (!msg.tool_calls.empty()) {
            msg.tool_calls.front().name = mark + msg.tool_calls.front().name;
            msg.tool_calls.back().name += mark;
        } else {
            msg.content = mark;
        }
        std::string marked;
        if (!render(in, marked)) {
            return false;
        }
        size_t prefix = 0;
        size_t suffix = 0;
        spec_prefill_common_ends(prompt, marked, prefix, suffix);
        if (prefix == prompt.size() && prefix == marked.size()) {
            return false; // the template does not render this message
        }
        out = text_of[i] = { prefix, prompt.size() - suffix };
        return true;
    };
    // message i whole: from the end of the previous message's text to the start of the next one's (its role's
    // header, its text, its closer, and the next one's header)
    auto find_message = [&](size_t i, std::pair<size_t, size_t> & out) {
        std::pair<size_t, size_t> prev = { 0, 0 };
        std::pair<size_t, size_t> next = { prompt.size(), prompt.size() };
        if ((i > 0 && !find_text(i - 1, prev)) || (i + 1 < msgs.size() && !find_text(i + 1, next))) {
            return false;
        }
        out = { prev.second, next.first };
        return out.first < out.second;
    };

    json spans = json::array();
    auto add = [&](const char * role, std::pair<size_t, size_t> span) {
        spans.push_back({ {"role", role}, {"begin", span.first}, {"end", span.second} });
    };
    // the tool definitions: where the prompt differs from the same request rendered without tools
    {
        common_chat_templates_inputs in = inputs;
        in.tools.clear();
        in.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
        std::string bare;
        if (render(in, bare) && bare != prompt) {
            size_t prefix = 0;
            size_t suffix = 0;
            spec_prefill_common_ends(prompt, bare, prefix, suffix);
            add("tools", { prefix, prompt.size() - suffix });
        }
    }
    // the leading system messages, up to the first other message's text
    size_t n_system = 0;
    while (n_system < msgs.size() && msgs[n_system].role == "system") {
        n_system++;
    }
    std::pair<size_t, size_t> span;
    if (n_system > 0) {
        if (n_system == msgs.size()) {
            add("system", { 0, prompt.size() });
        } else if (find_text(n_system, span)) {
            add("system", { 0, span.first });
        }
    }
    auto last_of = [&](const auto & pred) {
        for (size_t i = msgs.size(); i-- > 0; ) {
            if (pred(msgs[i])) {
                return (int64_t) i;
            }
        }
        return (int64_t) -1;
    };
    const int64_t i_user = last_of([](const common_chat_msg & m) { return m.role == "user"; });
    const int64_t i_call = last_of([](const common_chat_msg & m) { return m.role == "assistant" && !m.tool_calls.empty(); });
    if (i_user >= 0 && find_message(i_user, span)) {
        add("user", span);
    }
    if (i_call >= 0 && find_message(i_call, span)) {
        add("tool_call", span);
    }
    SPP_DBG("the chat's structure: %zu span(s) from %d renders in %.1f ms\n", spans.size(), n_renders,
            (ggml_time_us() - t_start) / 1000.0);
    llama_params["spec_prefill_spans"] = std::move(spans);
}

//
// timings and metrics
//

static json spec_prefill_protect_json(const std::vector<std::pair<std::string, common_spec_prefill_span>> & spans) {
    json out = json::array();
    for (const auto & [role, span] : spans) {
        out.push_back({ {"role", role}, {"begin", span.begin}, {"end", span.end} });
    }
    return out;
}

json server_spec_prefill_timings::to_json(double t_prompt_ms) const {
    const bool scored = status == SERVER_SPEC_PREFILL_ACTIVE;
    json j = {
        {"status",            server_spec_prefill_status_name(status)},
        {"n_prompt",          n_prompt},
        {"n_kept",            n_kept},
        {"n_reused",          n_reused},
        {"score_ms",          score_ms},
        {"queue_ms",          queue_ms},
        {"sparse_prefill_ms", scored ? std::max(0.0, t_prompt_ms - queue_ms - score_ms) : 0.0},
        {"score_draft_prefill_ms", score_draft_prefill_ms},
        {"score_query_ms",    score_query_ms},
        {"score_reduce_ms",   score_reduce_ms},
        {"score_setup_ms",    score_setup_ms},
        {"n_windows",         n_windows},
        {"n_parallel",        n_parallel},
        {"n_rows",            n_rows},
        {"n_layers",          n_layers},
        {"n_draft_reused",    n_draft_reused},
    };
    if (return_kept) {
        json ranges = json::array();
        for (const auto & r : kept) {
            ranges.push_back(json::array({ r.first, r.second }));
        }
        j["kept"] = std::move(ranges);
    }
    if (!protect.empty()) {
        j["protected"]   = spec_prefill_protect_json(protect);
        j["n_protected"] = n_protected;
    }
    if (!reason.empty()) {
        j["reason"] = reason;
    }
    if (!device.empty()) {
        j["device"] = device;
    }
    return j;
}

void server_spec_prefill_metrics::add(const server_spec_prefill_timings & t, int32_t n_scored, int32_t n_skipped) {
    n_requests[t.status]++;
    n_tokens_scored  += n_scored;
    n_tokens_skipped += n_skipped;
    t_score_ms       += t.score_ms;
    t_queue_ms       += t.queue_ms;
}

std::string server_spec_prefill_metrics::to_prometheus() const {
    if (!enabled) {
        return "";
    }
    std::stringstream out;
    out << "# HELP llamacpp:spec_prefill_requests_total Requests by speculative prefill status\n"
        << "# TYPE llamacpp:spec_prefill_requests_total counter\n";
    for (int s = SERVER_SPEC_PREFILL_DISABLED; s < SERVER_SPEC_PREFILL_STATUS_COUNT; ++s) {
        out << "llamacpp:spec_prefill_requests_total{status=\"" << server_spec_prefill_status_name((server_spec_prefill_status) s)
            << "\"} " << n_requests[s] << "\n";
    }
    auto counter = [&](const char * name, const char * help, double value) {
        out << "# HELP llamacpp:" << name << " " << help << "\n"
            << "# TYPE llamacpp:" << name << " counter\n"
            << "llamacpp:" << name << " " << value << "\n";
    };
    counter("spec_prefill_tokens_scored_total", "Prompt tokens the prefill draft scored", (double) n_tokens_scored);
    counter("spec_prefill_tokens_skipped_total", "Scored prompt tokens the target did not prefill", (double) n_tokens_skipped);
    counter("spec_prefill_score_seconds_total", "Time spent scoring prompts with the prefill draft", t_score_ms / 1e3);
    counter("spec_prefill_queue_seconds_total", "Time requests waited for the prefill draft while it scored others",
            t_queue_ms / 1e3);
    return out.str();
}

//
// the scorer: the draft and a worker thread that owns its context
//

struct server_spec_prefill_job {
    llama_tokens prompt;
    common_spec_prefill_request req;

    std::atomic<bool> cancel { false };
    std::atomic<bool> done   { false }; // `result` and the times are written before, read after

    common_spec_prefill_result result;
    int64_t t_submit_us = 0;
    int64_t t_start_us  = 0;
    int64_t t_end_us    = 0;
};

// what prefilling one token costs a model, in multiply-adds: `weights` for its matrices (the token embeddings are only
// looked up) and `attention` per earlier position it attends to (QK and AV over every layer's heads)
struct spec_prefill_model_cost {
    double weights   = 0.0;
    double attention = 0.0;

    // a batch of n tokens after n_past others, each attending to all before it
    double prefill(double n, double n_past) const {
        return n * (weights + attention * (n_past + 0.5 * n));
    }
};

static spec_prefill_model_cost spec_prefill_prefill_cost(const llama_model * model) {
    const double n_params = (double) llama_model_n_params(model);
    const double n_embd   = llama_model_n_embd(model);
    const double n_vocab  = llama_vocab_n_tokens(llama_model_get_vocab(model));
    spec_prefill_model_cost cost;
    cost.weights   = std::max(0.1 * n_params, n_params - n_vocab * n_embd);
    cost.attention = 2.0 * llama_model_n_layer(model) * n_embd;
    return cost;
}

struct server_spec_prefill {
    common_params_spec_prefill params;
    common_spec_prefill * core = nullptr;
    std::string devices; // where the draft runs, for the log and timings

    std::thread worker;
    std::mutex mutex;
    std::condition_variable cv;      // a job was queued, or stop
    std::condition_variable cv_done; // a job ended
    std::deque<std::shared_ptr<server_spec_prefill_job>> queue;
    std::shared_ptr<server_spec_prefill_job> running; // the job being scored, for the wait of the ones behind it
    uint64_t n_done = 0;
    uint64_t n_done_waited = 0; // n_done when server_spec_prefill_wait last returned
    bool stop = false;

    // throughputs the server measured itself, in tokens per ms (0: not yet known); loop thread only
    double r_target = 0.0; // the target's prefill
    double r_score  = 0.0; // scoring, per token the draft prefills

    // until both are measured, the estimate comes from the models' shapes (spec_prefill_prefill_cost)
    spec_prefill_model_cost cost_target;
    spec_prefill_model_cost cost_draft;
};

static void spec_prefill_worker_loop(server_spec_prefill * sp) {
    while (true) {
        std::shared_ptr<server_spec_prefill_job> job;
        {
            std::unique_lock<std::mutex> lock(sp->mutex);
            sp->cv.wait(lock, [&] { return sp->stop || !sp->queue.empty(); });
            if (sp->stop) {
                return;
            }
            job = std::move(sp->queue.front());
            sp->queue.pop_front();
            job->t_start_us = ggml_time_us();
            sp->running = job;
        }
        if (job->cancel.load()) {
            job->result.status = COMMON_SPEC_PREFILL_CANCELLED;
        } else {
            job->result = common_spec_prefill_run(sp->core, job->prompt, job->req);
        }
        job->t_end_us = ggml_time_us();
        job->done.store(true, std::memory_order_release);
        {
            std::unique_lock<std::mutex> lock(sp->mutex);
            sp->running.reset();
            sp->n_done++;
        }
        sp->cv_done.notify_all();
    }
}

void server_spec_prefill_wait(server_spec_prefill * sp, int32_t timeout_ms) {
    if (!sp) {
        return;
    }
    // against the count at the last return, not at this call: a scoring that ended between the caller's look at its
    // slots and this call must not leave the loop asleep for the whole timeout
    std::unique_lock<std::mutex> lock(sp->mutex);
    sp->cv_done.wait_for(lock, std::chrono::milliseconds(timeout_ms),
            [&] { return sp->n_done != sp->n_done_waited || sp->stop; });
    sp->n_done_waited = sp->n_done;
}

static std::string spec_prefill_devices_str(const std::vector<ggml_backend_dev_t> & devices) {
    std::string out;
    for (auto * dev : devices) {
        if (dev) {
            out += (out.empty() ? "" : ",") + std::string(ggml_backend_dev_name(dev));
        }
    }
    return out.empty() ? "default" : out;
}

server_spec_prefill * server_spec_prefill_init(const common_params & params, llama_context * ctx_tgt,
        llama_context * ctx_dft, int32_t n_ctx_slot, std::string & error) {
    auto * sp = new server_spec_prefill;
    sp->params = params.spec_prefill;

    // the draft-simple draft, when it is also the prefill draft, lends its weights (llama_init_from_model takes a
    // non-const model, but does not change it)
    auto * model_dft = ctx_dft ? const_cast<llama_model *>(llama_get_model(ctx_dft)) : nullptr;
    sp->core = common_spec_prefill_init(params, llama_get_model(ctx_tgt), model_dft, error);
    if (!sp->core) {
        delete sp;
        return nullptr;
    }
    // one context for every request, sized now for the largest prompt a slot can hold: its memory is the budget
    if (!common_spec_prefill_prepare(sp->core, n_ctx_slot)) {
        error = "speculative prefill: cannot create the prefill draft's context; lower --spec-prefill-ctx or use "
                "--spec-prefill-window";
        server_spec_prefill_free(sp);
        return nullptr;
    }
    sp->devices = common_spec_prefill_devices(sp->core);
    sp->cost_target = spec_prefill_prefill_cost(llama_get_model(ctx_tgt));
    sp->cost_draft  = spec_prefill_prefill_cost(common_spec_prefill_model(sp->core));
    llama_set_allow_pos_gaps(ctx_tgt, true);
    if (ctx_dft) {
        // draft-simple, MTP, EAGLE3, DFlash and DSpark write the target's (sparse) batch into their context
        llama_set_allow_pos_gaps(ctx_dft, true);
    }

    char desc[256];
    llama_model_desc(common_spec_prefill_model(sp->core), desc, sizeof(desc));
    SPP_INF("prefill draft '%s' (%s) on %s: %.1f MiB weights, %.1f MiB context; p = %.2f, select = %s, min tokens = %d, "
            "reuse = %s\n", sp->params.mparams.path.empty() ? params.speculative.draft.mparams.path.c_str() :
            sp->params.mparams.path.c_str(), desc, sp->devices.c_str(),
            common_spec_prefill_model_size(sp->core) / 1048576.0, common_spec_prefill_ctx_size(sp->core) / 1048576.0,
            sp->params.select.keep, common_spec_prefill_setting_text(*common_spec_prefill_setting_find("select"), sp->params).c_str(), sp->params.min_tokens,
            sp->params.server.reuse_exact ? "exact" : "sparse");
    if (params.fit_params) {
        SPP_WRN("%s", "--fit does not account for the prefill draft's memory above; leave room for it "
                "(-nglpd, --spec-prefill-ctx, or --fit-target)\n");
    }

    sp->worker = std::thread(spec_prefill_worker_loop, sp);
    return sp;
}

void server_spec_prefill_free(server_spec_prefill * sp) {
    if (!sp) {
        return;
    }
    if (sp->worker.joinable()) {
        {
            std::unique_lock<std::mutex> lock(sp->mutex);
            sp->stop = true;
            for (auto & job : sp->queue) {
                job->cancel = true;
            }
        }
        sp->cv.notify_all();
        sp->worker.join();
    }
    common_spec_prefill_free(sp->core);
    delete sp;
}

json server_spec_prefill_props(const common_params & params) {
    const auto & spp = params.spec_prefill;
    if (!spp.enabled) {
        return json {{"enabled", false}};
    }
    json j = {
        {"enabled", true},
        {"draft",   spp.mparams.path.empty() ? params.speculative.draft.mparams.path : spp.mparams.path},
        {"device",  spec_prefill_devices_str(spp.devices)},
    };
    for (const auto & setting : common_spec_prefill_settings_table()) {
        j[setting.key] = spec_prefill_setting_json(setting, spp);
    }
    return j;
}

//
// per-slot verbs
//

// the first position in [0, limit) that `held` (sorted) lacks, or `limit` if none is missing
static int32_t spec_prefill_first_gap(const std::vector<llama_pos> & held, int32_t limit) {
    int32_t pos = 0;
    while (pos < (int32_t) held.size() && pos < limit && held[pos] == pos) {
        pos++;
    }
    return std::min(pos, limit);
}

int32_t server_spec_prefill_reuse(server_spec_prefill_slot & slot, const server_spec_prefill_params & params,
        llama_context * ctx_tgt, llama_seq_id seq, int32_t n_past) {
    slot.held.clear();
    if (n_past <= 0 || !slot.sp) {
        return n_past;
    }
    // what the KV holds is the truth, whichever way it got there (this slot's last request, the RAM prompt cache,
    // a slot file, a cache-reuse shift)
    slot.held = llama_memory_seq_positions(llama_get_memory(ctx_tgt), seq);
    if (slot.held.empty()) {
        return n_past; // no attention positions (recurrent memory): nothing to tell
    }
    const int32_t first_gap = spec_prefill_first_gap(slot.held, n_past);
    if (first_gap < n_past && (!params.enabled || slot.sp->params.server.reuse_exact)) {
        // a full prefill must not stand on a sparse KV; exact reuse keeps only the dense part
        return first_gap;
    }
    return n_past;
}

// [begin, end) appended to sorted half-open ranges, merged with the last one where they touch
static void spec_prefill_append_range(std::vector<std::pair<int32_t, int32_t>> & ranges, int32_t begin, int32_t end) {
    if (begin >= end) {
        return;
    }
    if (!ranges.empty() && ranges.back().second == begin) {
        ranges.back().second = end;
    } else {
        ranges.emplace_back(begin, end);
    }
}

// the sorted positions below `limit` appended as half-open ranges
static void spec_prefill_append_positions(std::vector<std::pair<int32_t, int32_t>> & ranges,
        const std::vector<llama_pos> & positions, int32_t limit) {
    for (const llama_pos pos : positions) {
        if (pos >= limit) {
            break;
        }
        spec_prefill_append_range(ranges, pos, pos + 1);
    }
}

// how much of the prefix [0, n_past) the KV holds, once the server has settled n_past
static void spec_prefill_settle_past(server_spec_prefill_slot & slot, int32_t n_past) {
    slot.n_held_past = n_past;
    slot.past_sparse = false;
    if (n_past > 0 && !slot.held.empty()) {
        slot.n_held_past = (int32_t) (std::lower_bound(slot.held.begin(), slot.held.end(), n_past) - slot.held.begin());
        slot.past_sparse = slot.n_held_past < n_past;
    }
    slot.held.clear();
    slot.held.shrink_to_fit();
}

// what a request's prefill costs each way, in ms from the throughputs the server measured or, until both are known,
// in multiply-adds from the models' shapes: either way the three are in one unit, as is the wait for the scorer
struct spec_prefill_estimate {
    double t_full   = 0.0; // the target prefills the new tokens in full
    double t_score  = 0.0; // the draft scores them
    double t_sparse = 0.0; // the target prefills the kept ones
    bool   measured = false;
    std::string source; // where the throughputs came from: measured on earlier requests, or the models' shapes

    double speedup(double t_wait = 0.0) const {
        return t_full / (t_wait + t_score + t_sparse);
    }
};

// the share of the scorer's layers a request computes (spec_prefill.layers, else --spec-prefill-layers)
static double spec_prefill_depth(const server_spec_prefill * sp, int32_t layers) {
    const int32_t n_layer = common_spec_prefill_n_layer(sp->core);
    const int32_t n_run   = layers > 0 ? std::min(layers, n_layer) : common_spec_prefill_n_layers(sp->core);
    return (double) n_run / n_layer;
}

// scoring n_new tokens after n_past with the first `layers` layers (the same unit as spec_prefill_estimate_of's); the
// measured throughput is that of all layers, the cost of fewer their share of it
static double spec_prefill_score_cost(const server_spec_prefill * sp, bool measured, int32_t n_past, int32_t n_new,
        int32_t window, int32_t lookahead, int32_t layers, int32_t n_reread = 0) {
    // n_reread: tokens before the new ones the draft prefills again (its KV holds no more of them)
    const double depth = spec_prefill_depth(sp, layers);
    if (measured) {
        return depth * (n_new + n_reread) / sp->r_score;
    }
    // the draft attends within its window
    const double n_draft_past = window > 0 ? std::min<double>(n_past, std::max(0, window - n_new)) : n_past;
    const double n_draft_new  = window > 0 ? std::min<double>(n_new, window) : n_new;
    return depth * ((double) n_new / n_draft_new * sp->cost_draft.prefill(n_draft_new, n_draft_past) +
            sp->cost_draft.prefill(n_reread, 0) + sp->cost_draft.prefill(lookahead, n_past + n_new));
}

// whether both throughputs are measured (else the estimate comes from the models' shapes)
static bool spec_prefill_measured(const server_spec_prefill * sp) {
    return sp->r_target > 0.0 && sp->r_score > 0.0;
}

static spec_prefill_estimate spec_prefill_estimate_of(const server_spec_prefill * sp,
        const server_spec_prefill_params & params, int32_t n_past, int32_t n_new, int32_t n_protected,
        int32_t n_reread) {
    // the selection keeps its fraction of every token and the protected ones it did not pick are added: about
    // f_open of the prompt plus (1 - f_open) of the protected part
    const double f_open = params.select.mode == COMMON_SPEC_PREFILL_SELECT_KEEP ? params.select.keep : params.select.mass;
    const double f_protected = n_new > 0 ? std::min(1.0, (double) n_protected / n_new) : 0.0;
    const double f_kept = f_protected + (1.0 - f_protected) * f_open;
    spec_prefill_estimate e;
    e.measured = spec_prefill_measured(sp);
    e.t_score  = spec_prefill_score_cost(sp, e.measured, n_past, n_new, params.window, params.lookahead, params.n_layers,
            n_reread);
    if (e.measured) {
        e.source = string_format("measured: target prefill %.0f t/s, scoring %.0f t/s", sp->r_target * 1e3,
                sp->r_score * 1e3);
        e.t_full   = n_new / sp->r_target;
        e.t_sparse = f_kept * n_new / sp->r_target;
    } else {
        // the target's sparse prefill attends to the kept tokens only
        e.t_full   = sp->cost_target.prefill(n_new, n_past);
        e.t_sparse = sp->cost_target.prefill(f_kept * n_new, f_kept * n_past);
        e.source = string_format("estimated from the models' shapes: %.2f of the target's prefill to score, nothing "
                "measured yet", e.t_score / e.t_full);
    }
    return e;
}

// the scoring queued or running ahead of a new request (prompt, req), in the estimate's unit, how many wait, whether
// the draft is busy, and what the new request's draft would re-read: each job's draft holds the KV of the one before
// it, not of the last scored. A running job counts what is left of it where the throughput is measured, all of it
// where it is not
static double spec_prefill_queue_cost(server_spec_prefill * sp, bool measured, const llama_tokens & prompt,
        const common_spec_prefill_request & req, int32_t & n_reread, int32_t & n_waiting, bool & busy) {
    std::unique_lock<std::mutex> lock(sp->mutex);
    const llama_tokens * before = nullptr; // the prompt scored before the next job (nullptr: the last scored)
    auto cost = [&](const server_spec_prefill_job & job) {
        const int32_t n_job_reread = common_spec_prefill_n_draft_past(sp->core, job.prompt, job.req, before);
        before = &job.prompt;
        return spec_prefill_score_cost(sp, measured, job.req.n_past, (int32_t) job.prompt.size() - job.req.n_past,
                job.req.window, job.req.lookahead, job.req.n_layers, n_job_reread);
    };
    double t_wait = 0.0;
    const bool running = sp->running && !sp->running->cancel.load();
    if (running) {
        double left = cost(*sp->running);
        if (measured) {
            left = std::max(0.0, left - (ggml_time_us() - sp->running->t_start_us) / 1000.0);
        }
        t_wait += left;
    }
    n_waiting = 0;
    for (const auto & job : sp->queue) {
        if (!job->cancel.load()) {
            t_wait += cost(*job);
            n_waiting++;
        }
    }
    busy = running || n_waiting > 0;
    n_reread = common_spec_prefill_n_draft_past(sp->core, prompt, req, before);
    return t_wait;
}

// the protected spans in prompt tokens, sorted: a byte span covers the tokens whose text overlaps it (the tokens'
// text aligned with the string prompt's start, past a BOS or a leading space the tokenizer added), a token span is
// taken as it is; the chat's spans only where the request protects its structure
static std::vector<std::pair<std::string, common_spec_prefill_span>> spec_prefill_protect_tokens(
        const llama_vocab * vocab, const server_spec_prefill_params & params, const llama_tokens & prompt,
        bool chat_spans) {
    std::vector<std::pair<std::string, common_spec_prefill_span>> out;
    const int32_t n = (int32_t) prompt.size();
    std::vector<int64_t> start; // where token i's text starts in the string prompt; start[n]: the end of the last
    for (const auto & span : params.protect) {
        if (span.role != "client" && !chat_spans) {
            continue;
        }
        int32_t b = std::clamp(span.begin, 0, n);
        int32_t e = std::clamp(span.end,   0, n);
        if (!span.in_tokens) {
            if (start.empty()) {
                start.reserve(n + 1);
                std::string text;
                int64_t off = 0;
                for (int32_t i = 0; i < n; ++i) {
                    start.push_back(off);
                    const std::string piece = common_token_to_piece(vocab, prompt[i], true);
                    off += (int64_t) piece.size();
                    if (text.size() < params.prompt_head.size() + 256) {
                        text += piece;
                    }
                }
                start.push_back(off);
                const size_t shift = params.prompt_head.empty() ? 0 : text.find(params.prompt_head);
                if (shift != std::string::npos && shift > 0) {
                    for (auto & x : start) {
                        x -= (int64_t) shift;
                    }
                }
            }
            // the first token ending after span.begin, to the last one starting before span.end
            b = (int32_t) (std::upper_bound(start.begin() + 1, start.end(), (int64_t) span.begin) - (start.begin() + 1));
            e = (int32_t) (std::lower_bound(start.begin(), start.end() - 1, (int64_t) span.end) - start.begin());
        }
        if (b < e) {
            out.push_back({ span.role, { b, e } });
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const auto & x, const auto & y) { return x.second.begin < y.second.begin; });
    return out;
}

// tokens at or after n_past in at least one of the spans
static int32_t spec_prefill_n_protected(const std::vector<std::pair<std::string, common_spec_prefill_span>> & spans,
        int32_t n_past) {
    int32_t n = 0;
    int32_t covered = n_past; // spans are sorted by begin: count what each adds past the ones before
    for (const auto & [role, span] : spans) {
        const int32_t b = std::max(span.begin, covered);
        if (span.end > b) {
            n += span.end - b;
            covered = span.end;
        }
    }
    return n;
}

void server_spec_prefill_start(server_spec_prefill_slot & slot, const server_spec_prefill_params & params,
        const llama_tokens & prompt, int32_t n_past, bool compatible, server_spec_prefill_timings & timings,
        server_spec_prefill_metrics & metrics) {
    server_spec_prefill * sp = slot.sp;
    slot.job.reset();
    slot.sparse = false;
    slot.kept.clear();
    slot.i_kept = 0;
    if (!sp) {
        return;
    }
    std::vector<std::pair<int32_t, int32_t>> kept_prefix;
    if (params.return_kept && n_past > 0) {
        // the reused prefix as the KV holds it (dense where the memory keeps no positions)
        if (slot.held.empty()) {
            spec_prefill_append_range(kept_prefix, 0, n_past);
        } else {
            spec_prefill_append_positions(kept_prefix, slot.held, n_past);
        }
    }
    spec_prefill_settle_past(slot, n_past);

    const int32_t n_prompt = (int32_t) prompt.size();
    const int32_t n_new    = n_prompt - n_past;

    timings = {};
    timings.n_prompt    = n_prompt;
    timings.n_reused    = n_past;
    timings.n_kept      = slot.n_held_past + n_new;
    timings.return_kept = params.return_kept;
    if (params.return_kept) {
        // a sparse selection replaces the last range once the scores are back
        timings.kept = std::move(kept_prefix);
        spec_prefill_append_range(timings.kept, n_past, n_prompt);
    }

    auto decide = [&](enum server_spec_prefill_status status, std::string reason = "") {
        timings.status = status;
        timings.reason = std::move(reason);
        metrics.add(timings, 0, 0);
    };

    if (!params.enabled) {
        return decide(SERVER_SPEC_PREFILL_DISABLED);
    }
    if (!compatible) {
        return decide(SERVER_SPEC_PREFILL_SKIPPED_INCOMPATIBLE, "media in the prompt, or not a completion");
    }
    if (params.has_tools && params.server.tool_guard == COMMON_SPEC_PREFILL_TOOL_GUARD_SKIP) {
        return decide(SERVER_SPEC_PREFILL_SKIPPED_TOOL_GUARD, "the request has tools (--spec-prefill-tool-guard skip, "
                "spec_prefill.tool_guard; protect keeps the chat's structure whole and scores the rest)");
    }
    const bool chat_spans = params.has_tools && params.server.tool_guard == COMMON_SPEC_PREFILL_TOOL_GUARD_PROTECT;
    if (!params.protect.empty()) {
        timings.protect = spec_prefill_protect_tokens(llama_model_get_vocab(common_spec_prefill_model(sp->core)),
                params, prompt, chat_spans);
        timings.n_protected = spec_prefill_n_protected(timings.protect, n_past);
    }
    slot.protect = timings.protect;
    if (n_new < std::max(1, params.min_tokens)) {
        if (slot.past_sparse) {
            return decide(SERVER_SPEC_PREFILL_REUSED);
        }
        return decide(SERVER_SPEC_PREFILL_SKIPPED_MIN_TOKENS, string_format("%d new prompt tokens, below the minimum "
                "of %d", n_new, params.min_tokens));
    }
    if (params.server.break_even > 0.0f || sp->params.server.queue_max >= 0) {
        common_spec_prefill_request req = common_spec_prefill_default_request(sp->core);
        req.n_past = n_past;
        req.select = params.select;
        int32_t n_reread  = 0;
        int32_t n_waiting = 0;
        bool busy = false;
        const double t_wait = spec_prefill_queue_cost(sp, spec_prefill_measured(sp), prompt, req, n_reread, n_waiting,
                busy);
        const spec_prefill_estimate e = spec_prefill_estimate_of(sp, params, n_past, n_new, timings.n_protected,
                n_reread);
        if (params.server.break_even > 0.0f && e.speedup() < params.server.break_even) {
            return decide(SERVER_SPEC_PREFILL_SKIPPED_BREAK_EVEN, string_format("estimated speedup %.2fx, below "
                    "the break-even of %.2f (--spec-prefill-break-even, spec_prefill.break_even; %s)", e.speedup(),
                    params.server.break_even, e.source.c_str()));
        }
        const int32_t queue_max = sp->params.server.queue_max;
        if (queue_max >= 0 && busy && n_waiting >= queue_max) {
            return decide(SERVER_SPEC_PREFILL_SKIPPED_QUEUE, string_format("the prefill draft is busy and %d "
                    "request(s) already wait for it (--spec-prefill-queue-max %d)", n_waiting, queue_max));
        }
        if (params.server.break_even > 0.0f && t_wait > 0.0 && e.speedup(t_wait) < params.server.break_even) {
            // the draft is busy: waiting for it would eat what scoring saves
            const std::string wait = e.measured ? string_format("about %.0f ms", t_wait) :
                    string_format("%.2f of the target's full prefill", t_wait / e.t_full);
            return decide(SERVER_SPEC_PREFILL_SKIPPED_QUEUE, string_format("estimated speedup %.2fx after the wait "
                    "for the prefill draft (%s; %d request(s) queued before this one), below the break-even of %.2f; "
                    "%.2fx with an idle draft (%s)", e.speedup(t_wait), wait.c_str(), n_waiting, params.server.break_even,
                    e.speedup(), e.source.c_str()));
        }
    }

    auto job = std::make_shared<server_spec_prefill_job>();
    job->prompt = prompt;
    job->req.select     = params.select;
    job->req.min_tokens = params.min_tokens;
    job->req.window     = params.window;
    job->req.lookahead  = params.lookahead;
    job->req.n_layers   = params.n_layers;
    job->req.n_past     = n_past;
    job->req.cancel     = &job->cancel;
    for (const auto & [role, span] : timings.protect) {
        job->req.protect.push_back(span);
    }
    job->t_submit_us    = ggml_time_us();

    timings.status = SERVER_SPEC_PREFILL_ACTIVE; // until the scores say otherwise
    slot.job = job;
    {
        std::unique_lock<std::mutex> lock(sp->mutex);
        sp->queue.push_back(std::move(job));
    }
    sp->cv.notify_one();
}

bool server_spec_prefill_pending(const server_spec_prefill_slot & slot) {
    return slot.job && !slot.job->done.load(std::memory_order_acquire);
}

bool server_spec_prefill_ready(server_spec_prefill_slot & slot, server_spec_prefill_timings & timings,
        server_spec_prefill_metrics & metrics) {
    if (!slot.job) {
        return true;
    }
    if (!slot.job->done.load(std::memory_order_acquire)) {
        return false;
    }
    auto job = std::move(slot.job);
    const auto & res = job->result;

    timings.queue_ms  = (job->t_start_us - job->t_submit_us) / 1000.0;
    timings.score_ms  = (job->t_end_us - job->t_start_us) / 1000.0;
    timings.n_windows  = res.n_windows;
    timings.n_parallel = res.n_parallel;
    timings.n_rows     = res.n_rows;
    timings.n_layers   = res.n_layers_run;
    timings.n_draft_reused = res.n_draft_reused;
    timings.device    = slot.sp->devices;

    timings.score_draft_prefill_ms = res.t_draft_prefill_ms;
    timings.score_query_ms         = res.t_query_ms;
    timings.score_reduce_ms        = res.t_reduce_ms;
    timings.score_setup_ms         = res.t_setup_ms;

    const int32_t n_new = res.n_prompt - res.n_past;
    switch (res.status) {
        case COMMON_SPEC_PREFILL_SPARSE:
            timings.status = SERVER_SPEC_PREFILL_ACTIVE;
            slot.sparse = true;
            slot.kept   = res.kept;
            // the last prompt token must be decoded: its logits start the generation
            if (slot.kept.empty() || slot.kept.back() != res.n_prompt - 1) {
                slot.kept.push_back(res.n_prompt - 1);
            }
            slot.i_kept = 0;
            timings.n_kept = slot.n_held_past + (int32_t) slot.kept.size();
            if (timings.return_kept) {
                // the new tokens' range, set when the request started, gives way to the selection
                auto & kept = timings.kept;
                if (!kept.empty() && kept.back().second == res.n_prompt) {
                    kept.back().second = res.n_past;
                    if (kept.back().first >= kept.back().second) {
                        kept.pop_back();
                    }
                }
                spec_prefill_append_positions(kept, slot.kept, res.n_prompt);
            }
            break;
        case COMMON_SPEC_PREFILL_SHORT:
            timings.status = slot.past_sparse ? SERVER_SPEC_PREFILL_REUSED : SERVER_SPEC_PREFILL_SKIPPED_MIN_TOKENS;
            timings.reason = res.reason;
            break;
        case COMMON_SPEC_PREFILL_KEPT_ALL:
            timings.status = SERVER_SPEC_PREFILL_KEPT_ALL;
            break;
        case COMMON_SPEC_PREFILL_FAILED:
        case COMMON_SPEC_PREFILL_CANCELLED:
            timings.status = SERVER_SPEC_PREFILL_ERROR_FALLBACK;
            timings.reason = res.reason.empty() ? "scoring stopped" : res.reason;
            SPP_WRN("scoring failed, prefilling the prompt in full: %s\n", timings.reason.c_str());
            break;
    }
    const bool scored = res.status == COMMON_SPEC_PREFILL_SPARSE || res.status == COMMON_SPEC_PREFILL_KEPT_ALL;
    metrics.add(timings, scored ? n_new : 0, slot.sparse ? n_new - (int32_t) slot.kept.size() : 0);
    if (scored && timings.score_ms > 0.0 && res.n_layers_run > 0) {
        // as if all layers had scored (spec_prefill_score_cost)
        // per token the draft prefilled: a follow-up whose context the draft re-read costs more than its new tokens
        const double r = std::max(1, res.n_draft_prefilled) / timings.score_ms * res.n_layers_run /
                common_spec_prefill_n_layer(slot.sp->core);
        slot.sp->r_score = slot.sp->r_score > 0.0 ? 0.5*slot.sp->r_score + 0.5*r : r;
    }
    return true;
}

bool server_spec_prefill_keep(server_spec_prefill_slot & slot, int32_t pos) {
    if (!slot.sparse) {
        return true;
    }
    while (slot.i_kept < slot.kept.size() && slot.kept[slot.i_kept] < pos) {
        slot.i_kept++;
    }
    return slot.i_kept < slot.kept.size() && slot.kept[slot.i_kept] == pos;
}

void server_spec_prefill_release(server_spec_prefill_slot & slot, llama_context * ctx_tgt, llama_seq_id seq,
        const server_spec_prefill_timings & timings, double t_prompt_ms, uint64_t n_prompt_processed) {
    if (slot.job) {
        // a request cancelled or disconnected while queued or scored: its scoring stops before the next ubatch
        slot.job->cancel = true;
        slot.job.reset();
    }
    // the target's prefill throughput, from requests that prefilled enough tokens to say
    if (slot.sp && timings.is_set() && n_prompt_processed >= 256) {
        const double t_ms = t_prompt_ms - timings.queue_ms - timings.score_ms;
        if (t_ms > 0.0) {
            const double r = n_prompt_processed / t_ms;
            slot.sp->r_target = slot.sp->r_target > 0.0 ? 0.5*slot.sp->r_target + 0.5*r : r;
        }
    }
    slot.sparse = false;
    slot.kept.clear();
    slot.i_kept = 0;

    // for /slots, read here rather than there: /slots may be answered while the loop decodes into this KV
    const std::vector<llama_pos> pos = llama_memory_seq_positions(llama_get_memory(ctx_tgt), seq);
    const int32_t first_gap = pos.empty() ? 0 : spec_prefill_first_gap(pos, pos.back() + 1);
    slot.kv_n_pos     = (int32_t) pos.size();
    slot.kv_pos_max   = pos.empty() ? -1 : pos.back();
    slot.kv_first_gap = first_gap == (int32_t) pos.size() ? -1 : first_gap;
}

json server_spec_prefill_slot::to_json() const {
    json j = {
        {"state",          job ? (job->done.load() ? "scored" : "scoring") : (sparse ? "sparse_prefill" : "idle")},
        {"n_kv_positions", kv_n_pos},
        {"kv_pos_max",     kv_pos_max},
        {"kv_first_gap",   kv_first_gap},
    };
    if (sparse) {
        j["n_kept"] = (int32_t) kept.size();
    }
    if (!protect.empty()) {
        j["protected"] = spec_prefill_protect_json(protect);
    }
    return j;
}
