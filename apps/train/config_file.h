// fsdp-train's --config FILE.toml: its top-level keys are the long flag names ('-' or '_').
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace apps::train {

/// The TOML file's top-level keys as "--key=value" arguments, one argument each ('_' in a key
/// becomes '-'), for placing before the real command line so that a flag given there wins (every
/// option keeps its last value). Reads the file; not collective. Throws CLI::ValidationError
/// naming --config when the file is missing, not a regular file, not TOML (with the line), holds a
/// key that is no long flag of `app` (or config / help), or a value that is not a string, number
/// or boolean.
std::vector<std::string> config_file_args(const std::string& path, CLI::App& app);

/// The value of the last --config PATH or --config=PATH in argv ("" when absent).
std::string find_config_flag(int argc, char** argv);

}  // namespace apps::train
