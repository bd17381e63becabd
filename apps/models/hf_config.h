// Reading a Hugging Face config.json: the checks every model family's mapping shares
// (gpt_hf.cpp, llama_hf.cpp). Each failure throws std::invalid_argument naming the field, its
// value and what is supported.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace apps::models::hf {

/// Throws: "config.json: FIELD = VALUE is not supported here (SUPPORTED)".
[[noreturn]] inline void refuse(const std::string& field, const nlohmann::json& value, const std::string& supported) {
  throw std::invalid_argument("config.json: " + field + " = " + value.dump() + " is not supported here (" +
                              supported + ")");
}

/// The object's model_type must be `model_type`, and its architectures (when given) [architecture].
inline void expect_model(const nlohmann::json& c, const std::string& model_type, const std::string& architecture) {
  if (!c.is_object()) throw std::invalid_argument("config.json is not a JSON object");
  if (c.value("model_type", std::string()) != model_type) {
    refuse("model_type", c.contains("model_type") ? c["model_type"] : nlohmann::json(nullptr), model_type);
  }
  if (c.contains("architectures")) {
    const nlohmann::json& a = c["architectures"];
    if (!a.is_array() || a.size() != 1 || a[0] != architecture) refuse("architectures", a, "[\"" + architecture + "\"]");
  }
}

/// A required integer field > 0.
inline int64_t positive(const nlohmann::json& c, const std::string& field) {
  if (!c.contains(field)) throw std::invalid_argument("config.json: " + field + " is missing");
  const nlohmann::json& v = c[field];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0) refuse(field, v, "an integer > 0");
  return v.get<int64_t>();
}

/// An optional number field > 0 (`otherwise` when absent).
inline double positive_real(const nlohmann::json& c, const std::string& field, double otherwise) {
  if (!c.contains(field)) return otherwise;
  const nlohmann::json& v = c[field];
  if (!v.is_number() || !(v.get<double>() > 0)) refuse(field, v, "a number > 0");
  return v.get<double>();
}

/// A field that, when present, must hold `want` (a missing one takes transformers' default).
inline void expect_value(const nlohmann::json& c, const std::string& field, const nlohmann::json& want,
                         const std::string& supported) {
  if (c.contains(field) && c[field] != want) refuse(field, c[field], supported);
}

/// A field that, when present and not null, must hold `want`.
inline void expect_null_or(const nlohmann::json& c, const std::string& field, const nlohmann::json& want,
                           const std::string& supported) {
  if (c.contains(field) && !c[field].is_null() && c[field] != want) refuse(field, c[field], supported);
}

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace apps::models::hf
