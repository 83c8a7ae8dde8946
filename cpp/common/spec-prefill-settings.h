#pragma once

// The table of speculative prefill's settings: for each knob of common_spec_prefill_settings its request and /props
// key, its flag spellings, its environment variables (LLAMA_ARG_* and the seed tool's SP_*), its type and range, and
// its help. The flags (spec-prefill-arg.cpp), llama-server's request fields and /props, and the Python binding are made
// from it, and the README's flag table is checked against it (tests/unit/test_settings.py): a new knob is one row here
// plus its use.

#include "spec-prefill-params.h"

#include <cstdint>
#include <string>
#include <vector>

// the values a numeric setting takes: [lo, hi] (or (lo, hi]), and 0 too where 0 means automatic or off
struct common_spec_prefill_range {
    double lo;
    double hi;
    bool   lo_open;  // (lo, hi]
    bool   integer;  // an int32_t setting; else a float one
    bool   zero_too; // 0 beside [lo, hi]
};

inline constexpr double SPEC_PREFILL_INT_MAX = 2147483647.0;

inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_P          = { 0.0, 1.0,     true,  false, false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_BREAK_EVEN = { 0.0, 1e6,     false, false, false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_CHUNK_SIZE = { 0.0, 65536.0, false, true,  false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_LOOKAHEAD  = { 1.0, 128.0,   false, true,  false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_KERNEL     = { 0.0, 4096.0,  false, true,  false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_WINDOW     = { 256.0, SPEC_PREFILL_INT_MAX, false, true, true };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_CTX        = { 512.0, SPEC_PREFILL_INT_MAX, false, true, true };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_COUNT      = { 0.0, SPEC_PREFILL_INT_MAX, false, true, false };
inline constexpr common_spec_prefill_range SPEC_PREFILL_RANGE_QUEUE_MAX  = { -1.0, SPEC_PREFILL_INT_MAX, false, true, false };

// "in (0, 1]", "an integer in [0, 65536]", "0 or an integer >= 256", ...
std::string common_spec_prefill_range_text(const common_spec_prefill_range & range);

// whether x is one of the range's values, as the setting stores it (a float that rounds to 0 is not in (0, 1])
bool common_spec_prefill_in_range(const common_spec_prefill_range & range, double x);

// a flag's or an environment variable's text as a number of the range, whole or not at all ("0.5abc", "abc" and
// "1e-50" for p are errors); throws std::invalid_argument naming `name`, the value and the range
double common_spec_prefill_parse_number(const std::string & name, const std::string & text,
        const common_spec_prefill_range & range);

enum common_spec_prefill_setting_type {
    COMMON_SPEC_PREFILL_SETTING_INT,
    COMMON_SPEC_PREFILL_SETTING_FLOAT,
    COMMON_SPEC_PREFILL_SETTING_BOOL,   // a flag and its --no- spelling; true or false in a request
    COMMON_SPEC_PREFILL_SETTING_CHOICE, // one of `choices`, held as its index
};

// a name a flag or an environment variable may give a choice beside the choices themselves
struct common_spec_prefill_choice_alias {
    const char * name;
    int32_t      index;
};

struct common_spec_prefill_setting {
    const char * key;                       // the request's spec_prefill.<key> and /props' spec_prefill.<key>
    std::vector<const char *> flags;        // the first is the flag's name; then PR #27692's and vllm-mlx's spellings
    std::vector<const char *> flags_neg;    // a boolean's --no- spellings
    const char * env;                       // LLAMA_ARG_SPEC_PREFILL_*
    const char * env_seed;                  // the seed tool's SP_* name, read where `env` is unset (or nullptr)
    enum common_spec_prefill_setting_type type;
    const char * value_hint;                // "P", "N", "keep|mass"
    common_spec_prefill_range range;        // INT and FLOAT
    std::vector<const char *> choices;      // CHOICE: the names, by index
    std::vector<common_spec_prefill_choice_alias> aliases; // CHOICE: other names of a flag's or a variable's value
    const char * help;                      // without the default, which is appended
    const char * values_note;               // what special values mean ("0 = no cap"), or nullptr
    bool server_only;                       // a flag of llama-server only
    bool per_request;                       // a request may set spec_prefill.<key>
    bool enables;                           // the flag turns speculative prefill on
    double (*get)(const common_spec_prefill_settings & s); // a number, 0/1 or the choice's index
    void   (*set)(common_spec_prefill_settings & s, double x);
};

// every setting, in the order the help lists them
const std::vector<common_spec_prefill_setting> & common_spec_prefill_settings_table();

// the setting with this key, or nullptr
const common_spec_prefill_setting * common_spec_prefill_setting_find(const std::string & key);

// the setting's value as the help writes its default: "0.3", "8", "keep", "enabled"
std::string common_spec_prefill_setting_text(const common_spec_prefill_setting & setting,
        const common_spec_prefill_settings & s);

// what the setting takes, for messages: "in (0, 1]", "keep or mass", "true or false"
std::string common_spec_prefill_setting_values(const common_spec_prefill_setting & setting);

// the index of a choice named `name` (its aliases too where `aliases`), or -1
int32_t common_spec_prefill_setting_choice(const common_spec_prefill_setting & setting, const std::string & name,
        bool aliases);

// sets it from a flag's or an environment variable's text (a boolean's: true/false, 1/0, on/off, enabled/disabled);
// throws std::invalid_argument naming `name`, the values it takes and the text
void common_spec_prefill_setting_parse(const common_spec_prefill_setting & setting, common_spec_prefill_settings & s,
        const std::string & name, const std::string & text);

// every setting of s against its values: the first that is out of them, as "p must be in (0, 1], got 2"; empty if
// none is
std::string common_spec_prefill_settings_check(const common_spec_prefill_settings & s);
