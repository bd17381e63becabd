// Bounds of fsdp-train's numeric flags, as CLI11 validators with readable messages: CLI11's own
// Range / PositiveNumber print their limits with std::to_string (a 309-digit number for the largest
// double), so every numeric flag uses one of these instead.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace apps::train {

/// An integer in [lo, hi]. Rejects other text ("not an integer") and values outside with
/// "VALUE is outside [lo, hi]".
CLI::Validator int_in(int64_t lo, int64_t hi);

/// A finite real number in [lo, hi], or (lo, hi] with lo_open. Rejects nan, inf and text
/// with a message giving the bounds in %g form.
CLI::Validator real_in(double lo, double hi, bool lo_open = false);

/// A real number in [lo, hi) (upper bound excluded, e.g. an Adam beta below 1).
CLI::Validator real_below(double lo, double hi);

/// The LoRA flags fsdp-train and fsdp-plan share, defined once: --lora-rank (into *rank, in
/// [0, 65536]) and --lora-target-modules (into *targets, a comma-separated list), in `group`.
void add_lora_flags(CLI::App& app, int64_t* rank, std::string* targets, const std::string& group);

/// A boolean flag value: true|false, 1|0, yes|no, on|off (any case). Rejects other text with
/// "'VALUE' is not true or false (...)" instead of CLI11's "Could not convert".
CLI::Validator boolean_word();

/// A number of ranks or "host" (the ranks of each host, resolved from the process group's host
/// layout): "host", or a decimal integer of at most 8 digits, >= 1 (>= 0 when `zero_allowed`).
/// Rejects other text with "expected a positive (non-negative) integer or host, got 'VALUE'".
CLI::Validator ranks_or_host(bool zero_allowed);

/// A --backend value as the library's registry has it (fsdp::comm::world_backends): "auto" or a
/// backend this build has. Rejects a known backend this build lacks with the line saying so
/// ("backend 'nccl' is not in this build (it needs a CUDA build ...)"), an unknown name with the
/// known names, and one whose collectives move device tensors (nccl, in a CUDA build) because
/// `program` runs on the CPU (fsdp::comm::backend_refusal_for_cpu_program). Its description
/// lists the accepted names (auto|mpi|gloo).
CLI::Validator world_backend_name(const std::string& program);

/// Throws CLI::ValidationError naming the option of the first empty value among the command-line
/// arguments `args` (argv without the program name): `--save ""` or `--save=`, most often an unset
/// shell variable (`--save "$CKPT_DIR"`). CLI11 would read the first as the option left out and the
/// second as "the value is the next argument" (`--save= --steps 5` saves into a directory named
/// "--steps"). Only options of `app` that take a value are named; an empty argument elsewhere is
/// refused as not expected; unknown names and flags are left to CLI11. Nothing is checked when
/// -h or --help is among the arguments. Call before parse().
void reject_empty_values(const CLI::App& app, const std::vector<std::string>& args);

}  // namespace apps::train
