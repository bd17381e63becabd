// Reading the fields of a JSON document (internal): required fields, their types, whole numbers and
// numbers within a range, the keys an object may hold. One set of readers for every file the
// library reads as JSON (device profiles, checkpoint manifests and the ranks' shard reports).
//
// Each reader throws FieldError, whose message names the field (its path in the document), what was
// expected and what it holds; the document's own reader turns it into an fsdp::Error of its kind
// with the document's name in front (a profile: "profile: ", a manifest: "manifest 'PATH' is
// malformed: "). The readers know no document, so one field reader serves them all.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace fsdp::json_fields {

using json = nlohmann::json;

/// A field that is missing, of another type or outside its range. what(): the field's path, what
/// was expected and what the document holds (without the document's name).
struct FieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A JSON value as an error shows it: its text, cut to 60 characters ("..." at the end).
std::string shortened(const json& v);

/// A field's path in its document: "collectives.all_gather.alpha_s"; a top-level field (`where`
/// "") by its key.
std::string path_of(const std::string& where, const char* key);

/// `where` as a message names it: "the file" for the top level ("").
std::string object_name(const std::string& where);

/// obj[key], where `where` is the path of `obj` ("" for the top level). Throws FieldError
/// "<where> must be a JSON object, got <type>" or "<where> has no field '<key>'".
const json& required(const json& obj, const char* key, const std::string& where);

/// obj[key] (required), which must itself be a JSON object. Throws FieldError "<path> must be a
/// JSON object, got <value>" (a number where an object of optional fields belongs would otherwise
/// read as an object without them), or required's errors.
const json& object_field(const json& obj, const char* key, const std::string& where);

/// What a typed field must be, as a message says it: "true or false", "a number", "a string", ...
template <typename T>
constexpr const char* expected_type() {
  return std::is_same_v<T, bool>                        ? "true or false"
         : std::is_arithmetic_v<T>                      ? "a number"
         : std::is_same_v<T, std::string>               ? "a string"
         : std::is_same_v<T, std::vector<std::string>>  ? "an array of strings"
                                                        : "a JSON value of another type";
}

/// obj[key] as a T (bool, a floating-point number, a string, an array of strings or a JSON value)
/// (required). Throws FieldError "<path> must be <expected_type>, got <value>". Whole numbers:
/// whole_in_range or integer_in_range (the JSON library's conversion would cut 2.5 to 2).
template <typename T>
T typed(const json& obj, const char* key, const std::string& where) {
  static_assert(!std::is_integral_v<T> || std::is_same_v<T, bool>, "whole numbers: whole_in_range");
  const json& v = required(obj, key, where);
  try {
    return v.get<T>();
  } catch (const json::exception&) {
    throw FieldError(path_of(where, key) + " must be " + expected_type<T>() + ", got " + shortened(v));
  }
}

/// The keys `obj` may hold: any other is a typo or a field of another program, and is refused by
/// name (ignoring it would use the default it was meant to replace). Throws FieldError
/// "<where> has an unknown field "<key>" (known: a, b, ...)". A value that is not an object passes
/// (its own field check names the wrong type).
void only_known_keys(const json& obj, const std::string& where, std::initializer_list<const char*> known);

/// `v` as an int64 when it is a whole number: a JSON integer within int64, or (with
/// `whole_floats`) a finite float without a fraction within +-2^62 (8e10 is the whole number
/// 80,000,000,000). False for anything else (a fraction, a string, past int64).
bool whole_number(const json& v, bool whole_floats, int64_t* out);

/// obj[key] (required) as a whole number in [lo, hi], floats without a fraction accepted; `range`
/// is how the message writes the range ("[0, 2^60] (bytes; 0: not known)"). Throws FieldError
/// "<path> must be a whole number in <range>, got <value>", one message for every value outside it.
int64_t whole_in_range(const json& obj, const char* key, const std::string& where, int64_t lo, int64_t hi,
                       const char* range);

/// obj[key] (required) as a number in [lo, hi]. Throws FieldError "<path> must be in [lo, hi], got
/// <value>" (or must be a number).
double number_in_range(const json& obj, const char* key, const std::string& where, double lo, double hi);

/// `v` (the value of the field `name`, e.g. "rows" or an array index) as a JSON integer in [lo, hi]:
/// floats, strings and out-of-range values are refused. Throws FieldError "field '<name>' is not an
/// integer: <value>", "field '<name>' is <value>, above <hi>" or "field '<name>' is <value>,
/// outside [lo, hi]".
int64_t integer_in_range(const json& v, const std::string& name, int64_t lo = std::numeric_limits<int64_t>::min(),
                         int64_t hi = std::numeric_limits<int64_t>::max());

/// obj[key] (which must exist: json::at throws json::exception otherwise) as integer_in_range.
int64_t integer_at(const json& obj, const std::string& key, int64_t lo = std::numeric_limits<int64_t>::min(),
                   int64_t hi = std::numeric_limits<int64_t>::max());

}  // namespace fsdp::json_fields
