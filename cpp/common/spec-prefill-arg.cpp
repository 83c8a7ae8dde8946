#include "spec-prefill-arg.h"

#include "arg.h"
#include "common.h"
#include "spec-prefill-select.h"

#include <array>
#include <cstdlib>
#include <stdexcept>
#include <utility>

//
// flags (names compatible with PR #27692)
//

// arg.cpp's device-list parser (static there), for -devpd: a flag's handler is a plain function pointer, so it reads
// it from here; set when the flags are registered
static std::vector<ggml_backend_dev_t> (*spec_prefill_device_list_parser)(const std::string &) = nullptr;

static std::vector<ggml_backend_dev_t> spec_prefill_parse_device_list(const std::string & value) {
    return spec_prefill_device_list_parser(value);
}

// a flag's handler is a plain function pointer: one per row of the settings table, made for each index
static constexpr size_t SPEC_PREFILL_MAX_SETTINGS = 40;

struct spec_prefill_handler {
    void (*on_value)(common_params & params, const std::string & value);
    void (*on_bool)(common_params & params, bool value);
};

template <size_t I>
static void spec_prefill_on_value(common_params & params, const std::string & value) {
    const common_spec_prefill_setting & setting = common_spec_prefill_settings_table()[I];
    common_spec_prefill_setting_parse(setting, params.spec_prefill, setting.flags[0], value);
    params.spec_prefill.enabled = params.spec_prefill.enabled || setting.enables;
}

template <size_t I>
static void spec_prefill_on_bool(common_params & params, bool value) {
    const common_spec_prefill_setting & setting = common_spec_prefill_settings_table()[I];
    setting.set(params.spec_prefill, value ? 1.0 : 0.0);
    params.spec_prefill.enabled = params.spec_prefill.enabled || setting.enables;
}

template <size_t... I>
static std::array<spec_prefill_handler, sizeof...(I)> spec_prefill_handlers(std::index_sequence<I...>) {
    return {{ { &spec_prefill_on_value<I>, &spec_prefill_on_bool<I> }... }};
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
                params.spec_prefill.n_gpu_layers = (int32_t) common_spec_prefill_parse_number(
                        "--spec-prefill-ngl (or 'auto', 'all')", value, SPEC_PREFILL_RANGE_COUNT);
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
    const std::vector<common_spec_prefill_setting> & table = common_spec_prefill_settings_table();
    GGML_ASSERT(table.size() <= SPEC_PREFILL_MAX_SETTINGS);
    static const auto handlers = spec_prefill_handlers(std::make_index_sequence<SPEC_PREFILL_MAX_SETTINGS>());
    for (size_t i = 0; i < table.size(); ++i) {
        const common_spec_prefill_setting & setting = table[i];
        std::string help = setting.help;
        help += setting.values_note ? std::string(" (") + setting.values_note + "; default: " : std::string(" (default: ");
        help += common_spec_prefill_setting_text(setting, params.spec_prefill) + ")";
        common_arg arg;
        arg.args       = setting.flags;
        arg.args_neg   = setting.flags_neg;
        arg.value_hint = setting.value_hint;
        arg.help       = help;
        if (setting.type == COMMON_SPEC_PREFILL_SETTING_BOOL) {
            arg.handler_bool = handlers[i].on_bool;
        } else {
            arg.handler_string = handlers[i].on_value;
        }
        // the seed tool's variable where the flag's own is unset: its users' settings keep working
        const bool seed = setting.env_seed && !std::getenv(setting.env) && std::getenv(setting.env_seed);
        arg.set_spec().set_env(seed ? setting.env_seed : setting.env);
        if (setting.server_only) {
            arg.set_examples({LLAMA_EXAMPLE_SERVER});
        } else {
            arg.set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI});
        }
        add_opt(arg);
    }
    add_opt(common_arg(
        {"--no-spec-prefill-tool-guard"},
        "speculative prefill in llama-server: the same as --spec-prefill-tool-guard off",
        [](common_params & params) {
            params.spec_prefill.server.tool_guard = COMMON_SPEC_PREFILL_TOOL_GUARD_OFF;
        }
    ).set_spec().set_examples({LLAMA_EXAMPLE_SERVER}));
}
