// fsdp-train's TOML config file (config_file.h).
#include "train/config_file.h"

#include <toml++/toml.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>

namespace apps::train {

std::vector<std::string> config_file_args(const std::string& path, CLI::App& app) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    const char* what = !std::filesystem::exists(path, ec)         ? "does not exist"
                       : std::filesystem::is_directory(path, ec) ? "is a directory"
                                                                 : "is not a regular file";
    throw CLI::ValidationError("--config", "'" + path + "' " + what + ": give a TOML file");
  }
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "config file '" << path << "': " << e.description() << " at line "
       << e.source().begin.line;
    throw CLI::ValidationError("--config", os.str());
  }
  if (table.empty()) {
    throw CLI::ValidationError("--config", "config file '" + path + "' sets no key (an empty file, or comments "
                                           "only): give the settings, e.g. global_batch_size = 32");
  }
  std::vector<std::string> args;
  std::map<std::string, std::string> seen;  // flag name -> the key that set it
  for (auto&& [key, node] : table) {
    std::string name(key.str());
    for (char& c : name) {
      if (c == '_') c = '-';
    }
    if (auto [it, fresh] = seen.emplace(name, std::string(key.str())); !fresh) {
      throw CLI::ValidationError("--config", "config file '" + path + "': keys '" + it->second + "' and '" +
                                                 std::string(key.str()) + "' both set --" + name + ": keep one");
    }
    CLI::Option* opt = app.get_option_no_throw("--" + name);
    if (opt == nullptr || name == "config" || name == "help") {
      throw CLI::ValidationError("--config", "config file '" + path + "': unknown key '" +
                                                 std::string(key.str()) +
                                                 "' (keys are the long flag names)");
    }
    std::string value;
    if (auto s = node.value<std::string>(); s && node.is_string()) {
      value = *s;
      if (value.empty()) {  // "--save=" would take the next argument as its value
        throw CLI::ValidationError("--config", "config file '" + path + "': key '" + std::string(key.str()) +
                                                   "' is empty: give a value or leave the key out");
      }
    } else if (node.is_integer()) {
      value = std::to_string(*node.value<int64_t>());
    } else if (node.is_floating_point()) {
      std::ostringstream os;
      os.precision(17);
      os << *node.value<double>();
      value = os.str();
    } else if (node.is_boolean()) {
      value = *node.value<bool>() ? "true" : "false";
    } else {
      throw CLI::ValidationError("--config", "config file '" + path + "': key '" +
                                                 std::string(key.str()) +
                                                 "' must be a string, number or boolean");
    }
    args.push_back("--" + name + "=" + value);  // one argument: flags take their value after '=' only
  }
  return args;
}

std::string find_config_flag(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) path = argv[i + 1];
    if (a.rfind("--config=", 0) == 0) path = a.substr(9);
  }
  return path;
}

}  // namespace apps::train
