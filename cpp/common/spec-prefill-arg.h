#pragma once

// The flags of speculative prefill, registered by common_params_parser_init through one call: those of the settings
// table (spec-prefill-settings.h) made from its rows, and the draft's own (-mpd, -hfpd, -nglpd, -devpd).

#include "ggml-backend.h"
#include "spec-prefill-settings.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

struct common_arg;
struct common_params;

// registers the flags with common_params_parser_init's add_opt (which filters them by example); parse_device_list is
// arg.cpp's, for -devpd
void common_spec_prefill_add_args(const common_params & params, const std::function<void(common_arg)> & add_opt,
        std::vector<ggml_backend_dev_t> (*parse_device_list)(const std::string &));
