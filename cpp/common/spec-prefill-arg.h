#pragma once

// The flags of speculative prefill (registered by common_params_parser_init through one call) and the ranges of its
// numeric settings, which a flag, its environment variable and the server's request field share: a value is checked
// once, against one range, with one message.

#include "ggml-backend.h"
#include "spec-prefill-params.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

struct common_arg;
struct common_params;

// the values a numeric setting takes: [lo, hi] (or (lo, hi]), and 0 too where 0 means automatic or off
struct common_spec_prefill_range {
    double lo;
    double hi;
    bool   lo_open;  // (lo, hi]
    bool   integer;  // an int32_t setting; else a float one
    bool   zero_too; // 0 beside [lo, hi]
};

inline constexpr double SPEC_PREFILL_INT_MAX = 2147483647.0;

inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_P              = { 0.0, 1.0,     true,  false, false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_MASS           = { 0.0, 1.0,     true,  false, false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_BREAK_EVEN     = { 0.0, 1e6,     false, false, false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_CHUNK_SIZE     = { 0.0, 65536.0, false, true,  false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_LOOKAHEAD      = { 1.0, 128.0,   false, true,  false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_POOL_KERNEL    = { 0.0, 4096.0,  false, true,  false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_WINDOW         = { 256.0, SPEC_PREFILL_INT_MAX, false, true, true };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_CTX            = { 512.0, SPEC_PREFILL_INT_MAX, false, true, true };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_COUNT          = { 0.0, SPEC_PREFILL_INT_MAX, false, true, false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_QUEUE_MAX      = { -1.0, SPEC_PREFILL_INT_MAX, false, true, false };

// "off", "skip" or "protect"; nullptr for an unknown value
const char * common_spec_prefill_tool_guard_name(enum common_spec_prefill_tool_guard guard);

// the guard a flag, an environment variable or a request names; false for an unknown name
bool common_spec_prefill_tool_guard_parse(const std::string & name, enum common_spec_prefill_tool_guard & guard);

// "in (0, 1]", "an integer in [0, 65536]", "0 or an integer >= 256", ...
std::string common_spec_prefill_range_text(const common_spec_prefill_range & range);

// whether x is one of the range's values, as the setting stores it (a float that rounds to 0 is not in (0, 1])
bool common_spec_prefill_in_range(const common_spec_prefill_range & range, double x);

// a flag's or an environment variable's text as a number of the range, whole or not at all ("0.5abc", "abc" and
// "1e-50" for p are errors); throws std::invalid_argument naming the flag, the value and the range
double common_spec_prefill_parse_number(const std::string & flag, const std::string & text,
        const common_spec_prefill_range & range);

// registers the flags with common_params_parser_init's add_opt (which filters them by example); parse_device_list is
// arg.cpp's, for -devpd
void common_spec_prefill_add_args(const common_params & params, const std::function<void(common_arg)> & add_opt,
        std::vector<ggml_backend_dev_t> (*parse_device_list)(const std::string &));
