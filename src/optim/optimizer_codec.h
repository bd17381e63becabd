// The optimizer-state adapter's codec interface (internal): what the adapter needs to know about
// one torch::optim optimizer kind. One file per kind (adam_codec.cpp, sgd_codec.cpp); the adapter
// (optimizer_state.cpp) and the archive reader (optimizer_archive.cpp) reach a kind only through
// codec(kind). [Note: optimizer state adapter] in optimizer_state.h.
#pragma once

#include <c10/util/Type.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>

#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "fsdp/optim/optimizer_state.h"

namespace fsdp::optim::detail {

using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;
using torch::serialize::InputArchive;

/// What the adapter needs to know about one optimizer kind. Stateless; one static instance per
/// kind. The only code that names torch::optim's concrete option and state types.
class Codec {
 public:
  virtual ~Codec() = default;
  /// State tensor names for a parameter whose group has options `o` (see state_tensor_names).
  virtual std::vector<std::string> tensor_names(const OptimizerOptions& o) const = 0;
  /// Reads `s` into `out`; false when `s` is not this kind's state type.
  virtual bool read(const OptimizerParamState& s, ParamState& out) const = 0;
  virtual std::unique_ptr<OptimizerParamState> make(const ParamState& s) const = 0;
  virtual std::vector<std::string> option_names() const = 0;
  /// The options, or nullopt when `o` is not this kind's options type.
  virtual std::optional<GroupOptions> options(const OptimizerOptions& o) const = 0;
  /// Sets one option named in option_names(); false when `o` is not this kind's options type.
  virtual bool set_option(OptimizerOptions& o, const std::string& name, double v) const = 0;
  /// State tensor names for a group whose options are `o` (see state_tensor_names(kind, ...)).
  virtual std::vector<std::string> tensor_names(const GroupOptions& o) const = 0;
  /// Entries every archived options object of this kind has (libtorch's Options::serialize).
  virtual std::vector<std::string> archive_option_keys() const = 0;
  /// Reads an archived options object / parameter state with libtorch's own deserializers; they
  /// throw c10::Error on a malformed entry.
  virtual GroupOptions read_archived_options(InputArchive& a) const = 0;
  virtual ParamState read_archived_state(InputArchive& a) const = 0;
};

/// The codec of `kind` (adam_codec.cpp, sgd_codec.cpp).
const Codec& codec(OptimizerKind kind);
const Codec& adamw_codec();
const Codec& adam_codec();
const Codec& sgd_codec();

/// `where` with its op set to `fn` when it names none.
inline ErrorContext context(const ErrorContext& where, const char* fn) {
  ErrorContext c = where;
  if (c.op.empty()) c.op = fn;
  return c;
}

/// "{a, b, c}" for messages.
inline std::string join(const std::vector<std::string>& names) {
  std::string s = "{";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "}";
}

/// Appends `t` to out's tensors under `name` when it is defined.
inline void add_defined(ParamState& out, const char* name, const at::Tensor& t) {
  if (t.defined()) out.tensors.push_back({name, t});
}

/// The dynamic type of x, e.g. "torch::optim::RMSprop".
template <typename T>
std::string type_name(const T& x) {
  return c10::demangle(typeid(x).name());
}

}  // namespace fsdp::optim::detail
