// Numeric flag bounds (value_bounds.h).
#include "train/value_bounds.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "fsdp/comm/backend_registry.h"

namespace apps::train {
namespace {

std::string g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// Parses a whole real number; false for text, trailing characters, nan and inf.
bool parse_real(const std::string& s, double* v) {
  try {
    size_t used = 0;
    *v = std::stod(s, &used);
    return used == s.size() && std::isfinite(*v);
  } catch (const std::exception&) {
    return false;
  }
}

CLI::Validator real_check(double lo, double hi, bool lo_open, bool hi_open) {
  const std::string range = std::string(lo_open ? "(" : "[") + g(lo) + ", " + g(hi) + (hi_open ? ")" : "]");
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v = 0;
        if (!parse_real(s, &v)) return "'" + s + "' is not a finite number (expected one in " + range + ")";
        const bool ok = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
        return ok ? std::string() : s + " is outside " + range;
      },
      "in " + range);
}

}  // namespace

CLI::Validator int_in(int64_t lo, int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        try {
          size_t used = 0;
          const long long v = std::stoll(s, &used);
          if (used != s.size()) throw std::invalid_argument(s);
          return v >= lo && v <= hi ? std::string() : s + " is outside " + range;
        } catch (const std::exception&) {
          return "'" + s + "' is not an integer in " + range;
        }
      },
      "in " + range);
}

CLI::Validator ranks_or_host(bool zero_allowed) {
  return CLI::Validator(
      [zero_allowed](std::string& v) -> std::string {
        if (v == "host") return std::string();
        if (!v.empty() && v.size() < 9 && v.find_first_not_of("0123456789") == std::string::npos &&
            (zero_allowed || std::stoi(v) > 0)) {
          return std::string();
        }
        return std::string("expected a ") + (zero_allowed ? "non-negative" : "positive") + " integer or host, got '" + v + "'";
      },
      "INT|host");
}

CLI::Validator boolean_word() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::string w;
        for (char ch : s) w += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        for (const char* ok : {"true", "false", "1", "0", "yes", "no", "on", "off"}) {
          if (w == ok) return std::string();
        }
        return "'" + s + "' is not true or false (accepted: true|false, 1|0, yes|no, on|off)";
      },
      "true|false");
}

CLI::Validator world_backend_name(const std::string& program) {
  std::string names;
  for (const std::string& n : fsdp::comm::buildable_backend_names()) {
    const fsdp::comm::WorldBackend* b = fsdp::comm::find_world_backend(n);
    if (b == nullptr || b->tensors_on == "cpu") names += (names.empty() ? "" : "|") + n;
  }
  return CLI::Validator(
      [program](std::string& s) { return fsdp::comm::backend_refusal_for_cpu_program(s, program); }, names);
}

CLI::Validator real_in(double lo, double hi, bool lo_open) { return real_check(lo, hi, lo_open, false); }

CLI::Validator real_below(double lo, double hi) { return real_check(lo, hi, false, true); }

void add_lora_flags(CLI::App& app, int64_t* rank, std::string* targets, const std::string& group) {
  app.add_option("--lora-rank", *rank,
                 "A LoRA fine-tune: adapters of this rank on the --lora-target-modules layers, every other "
                 "parameter frozen (no gradients, no optimizer state); 0: a full fine-tune")
      ->check(int_in(0, 1 << 16))->group(group);
  app.add_option("--lora-target-modules", *targets,
                 "Comma-separated layer names that get an adapter, as PEFT's target_modules (c_attn; q_proj,v_proj; "
                 "all-linear: every Linear of the blocks); default: PEFT's for the family (GPT-2 c_attn, Llama "
                 "q_proj,v_proj)")
      ->group(group);
}

void reject_empty_values(const CLI::App& app, const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") return;  // help wins
  }
  // The option named `name` if it is one of app's that takes a value (not a flag, not unknown).
  auto refuse_if_option = [&](const std::string& name) {
    const CLI::Option* o = app.get_option_no_throw(name);
    if (o != nullptr && o->get_expected_max() > 0) {
      throw CLI::ValidationError(name, "is empty (an unset shell variable?): give a value or leave the option out");
    }
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos && eq + 1 == a.size()) {
      // --save= : CLI11 would take the next argument as the value. An unknown name or a flag is
      // left to CLI11's own message.
      refuse_if_option(a.substr(0, eq));
    } else if (a.empty()) {
      const std::string before = i > 0 ? args[i - 1] : "";
      refuse_if_option(before);
      throw CLI::ValidationError("an empty argument" + (i > 0 ? " after '" + before + "'" : std::string()),
                                 "is not expected (an unset shell variable?)");
    }
  }
}

}  // namespace apps::train
