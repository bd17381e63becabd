#include "json_fields.h"

#include <algorithm>
#include <cmath>

#include "fsdp/common/check.h"

namespace fsdp::json_fields {

std::string shortened(const json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string path_of(const std::string& where, const char* key) {
  return where.empty() ? std::string(key) : where + "." + key;
}

std::string object_name(const std::string& where) { return where.empty() ? "the file" : where; }

const json& required(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) throw FieldError(object_name(where) + " must be a JSON object, got " + obj.type_name());
  if (!obj.contains(key)) throw FieldError(object_name(where) + " has no field '" + key + "'");
  return obj.at(key);
}

const json& object_field(const json& obj, const char* key, const std::string& where) {
  const json& v = required(obj, key, where);
  if (!v.is_object()) throw FieldError(path_of(where, key) + " must be a JSON object, got " + shortened(v));
  return v;
}

void only_known_keys(const json& obj, const std::string& where, std::initializer_list<const char*> known) {
  if (!obj.is_object()) return;
  for (const auto& item : obj.items()) {
    const bool ok = std::any_of(known.begin(), known.end(), [&](const char* k) { return item.key() == k; });
    if (ok) continue;
    std::string names;
    for (const char* k : known) names += (names.empty() ? "" : ", ") + std::string(k);
    throw FieldError(str_cat(object_name(where), " has an unknown field ", shortened(json(item.key())),
                             " (known: ", names, ")"));
  }
}

bool whole_number(const json& v, bool whole_floats, int64_t* out) {
  if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    *out = v.get<int64_t>();
    return true;
  }
  if (whole_floats && v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) <= static_cast<double>(int64_t{1} << 62)) {
      *out = static_cast<int64_t>(d);
      return true;
    }
  }
  return false;
}

int64_t whole_in_range(const json& obj, const char* key, const std::string& where, int64_t lo, int64_t hi,
                       const char* range) {
  const json& v = required(obj, key, where);
  int64_t out = 0;
  if (!whole_number(v, /*whole_floats=*/true, &out) || out < lo || out > hi) {
    throw FieldError(str_cat(path_of(where, key), " must be a whole number in ", range, ", got ", shortened(v)));
  }
  return out;
}

double number_in_range(const json& obj, const char* key, const std::string& where, double lo, double hi) {
  const double v = typed<double>(obj, key, where);
  if (!(v >= lo && v <= hi)) {
    throw FieldError(str_cat(path_of(where, key), " must be in [", lo, ", ", hi, "], got ", shortened(obj.at(key))));
  }
  return v;
}

int64_t integer_in_range(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    throw FieldError(str_cat("field '", name, "' is ", v.dump(), ", above ", hi));
  }
  if (!v.is_number_integer()) throw FieldError(str_cat("field '", name, "' is not an integer: ", v.dump()));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) throw FieldError(str_cat("field '", name, "' is ", x, ", outside [", lo, ", ", hi, "]"));
  return x;
}

int64_t integer_at(const json& obj, const std::string& key, int64_t lo, int64_t hi) {
  return integer_in_range(obj.at(key), key, lo, hi);
}

}  // namespace fsdp::json_fields
