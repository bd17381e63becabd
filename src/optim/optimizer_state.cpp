// The optimizer-state adapter ([Note: optimizer state adapter] in optimizer_state.h): a codec per
// optimizer kind, and the only dynamic_casts to torch::optim's concrete types in the library.
#include "fsdp/optim/optimizer_state.h"

#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <memory>
#include <tuple>
#include <typeinfo>

namespace fsdp::optim {

namespace {

using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;
using torch::serialize::InputArchive;

ErrorContext context(const ErrorContext& where, const char* fn) {
  ErrorContext c = where;
  if (c.op.empty()) c.op = fn;
  return c;
}

std::string join(const std::vector<std::string>& names) {
  std::string s = "{";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "}";
}

// What the adapter needs to know about one optimizer kind.
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

void add_defined(ParamState& out, const char* name, const at::Tensor& t) {
  if (t.defined()) out.tensors.push_back({name, t});
}

// AdamW and Adam keep the same state and options under two unrelated types.
template <typename Options, typename State>
class AdamCodec final : public Codec {
 public:
  std::vector<std::string> tensor_names(const OptimizerOptions& o) const override {
    std::vector<std::string> n{"exp_avg", "exp_avg_sq"};
    auto* opts = dynamic_cast<const Options*>(&o);
    if (opts && opts->amsgrad()) n.push_back("max_exp_avg_sq");
    return n;
  }
  bool read(const OptimizerParamState& s, ParamState& out) const override {
    auto* st = dynamic_cast<const State*>(&s);
    if (!st) return false;
    out.step = st->step();
    add_defined(out, "exp_avg", st->exp_avg());
    add_defined(out, "exp_avg_sq", st->exp_avg_sq());
    add_defined(out, "max_exp_avg_sq", st->max_exp_avg_sq());
    return true;
  }
  std::unique_ptr<OptimizerParamState> make(const ParamState& s) const override {
    auto st = std::make_unique<State>();
    st->step(s.step);
    st->exp_avg(s.find("exp_avg"));
    st->exp_avg_sq(s.find("exp_avg_sq"));
    st->max_exp_avg_sq(s.find("max_exp_avg_sq"));
    return st;
  }
  std::vector<std::string> option_names() const override {
    return {"amsgrad", "beta1", "beta2", "eps", "lr", "weight_decay"};
  }
  std::optional<GroupOptions> options(const OptimizerOptions& o) const override {
    auto* p = dynamic_cast<const Options*>(&o);
    if (!p) return std::nullopt;
    return GroupOptions{{"lr", p->lr()},
                        {"beta1", std::get<0>(p->betas())},
                        {"beta2", std::get<1>(p->betas())},
                        {"eps", p->eps()},
                        {"weight_decay", p->weight_decay()},
                        {"amsgrad", p->amsgrad() ? 1.0 : 0.0}};
  }
  bool set_option(OptimizerOptions& o, const std::string& name, double v) const override {
    auto* p = dynamic_cast<Options*>(&o);
    if (!p) return false;
    if (name == "lr") p->lr(v);
    if (name == "beta1") p->betas(std::make_tuple(v, std::get<1>(p->betas())));
    if (name == "beta2") p->betas(std::make_tuple(std::get<0>(p->betas()), v));
    if (name == "eps") p->eps(v);
    if (name == "weight_decay") p->weight_decay(v);
    if (name == "amsgrad") p->amsgrad(v != 0.0);
    return true;
  }
  std::vector<std::string> tensor_names(const GroupOptions& o) const override {
    std::vector<std::string> n{"exp_avg", "exp_avg_sq"};
    auto it = o.find("amsgrad");
    if (it != o.end() && it->second != 0.0) n.push_back("max_exp_avg_sq");
    return n;
  }
  std::vector<std::string> archive_option_keys() const override {
    return {"lr", "betas", "eps", "weight_decay", "amsgrad"};
  }
  GroupOptions read_archived_options(InputArchive& a) const override {
    Options o(0);
    o.serialize(a);
    return *options(o);
  }
  ParamState read_archived_state(InputArchive& a) const override {
    State st;
    st.serialize(a);
    ParamState out;
    read(st, out);
    return out;
  }
};

class SgdCodec final : public Codec {
 public:
  std::vector<std::string> tensor_names(const OptimizerOptions&) const override {
    return {"momentum_buffer"};
  }
  bool read(const OptimizerParamState& s, ParamState& out) const override {
    auto* st = dynamic_cast<const torch::optim::SGDParamState*>(&s);
    if (!st) return false;
    add_defined(out, "momentum_buffer", st->momentum_buffer());
    return true;
  }
  std::unique_ptr<OptimizerParamState> make(const ParamState& s) const override {
    auto st = std::make_unique<torch::optim::SGDParamState>();
    st->momentum_buffer(s.find("momentum_buffer"));
    return st;
  }
  std::vector<std::string> option_names() const override {
    return {"dampening", "lr", "momentum", "nesterov", "weight_decay"};
  }
  std::optional<GroupOptions> options(const OptimizerOptions& o) const override {
    auto* p = dynamic_cast<const torch::optim::SGDOptions*>(&o);
    if (!p) return std::nullopt;
    return GroupOptions{{"lr", p->lr()},
                        {"momentum", p->momentum()},
                        {"dampening", p->dampening()},
                        {"weight_decay", p->weight_decay()},
                        {"nesterov", p->nesterov() ? 1.0 : 0.0}};
  }
  bool set_option(OptimizerOptions& o, const std::string& name, double v) const override {
    auto* p = dynamic_cast<torch::optim::SGDOptions*>(&o);
    if (!p) return false;
    if (name == "lr") p->lr(v);
    if (name == "momentum") p->momentum(v);
    if (name == "dampening") p->dampening(v);
    if (name == "weight_decay") p->weight_decay(v);
    if (name == "nesterov") p->nesterov(v != 0.0);
    return true;
  }
  std::vector<std::string> tensor_names(const GroupOptions&) const override {
    return {"momentum_buffer"};
  }
  std::vector<std::string> archive_option_keys() const override {
    return {"lr", "momentum", "dampening", "weight_decay", "nesterov"};
  }
  GroupOptions read_archived_options(InputArchive& a) const override {
    torch::optim::SGDOptions o(0);
    o.serialize(a);
    return *options(o);
  }
  ParamState read_archived_state(InputArchive& a) const override {
    torch::optim::SGDParamState st;
    st.serialize(a);
    ParamState out;
    read(st, out);
    return out;
  }
};

const Codec& codec(OptimizerKind kind) {
  static const AdamCodec<torch::optim::AdamWOptions, torch::optim::AdamWParamState> adamw;
  static const AdamCodec<torch::optim::AdamOptions, torch::optim::AdamParamState> adam;
  static const SgdCodec sgd;
  switch (kind) {
    case OptimizerKind::kAdamW: return adamw;
    case OptimizerKind::kAdam: return adam;
    case OptimizerKind::kSGD: break;
  }
  return sgd;
}

// The dynamic type of x, e.g. "torch::optim::RMSprop".
template <typename T>
std::string type_name(const T& x) {
  return c10::demangle(typeid(x).name());
}

// The options of the group holding param, else the optimizer's defaults.
const OptimizerOptions& options_for(const torch::optim::Optimizer& o, const at::Tensor& param) {
  auto g = param_group_index(o, param);
  return g ? o.param_groups()[*g].options() : o.defaults();
}

void check_group(const torch::optim::Optimizer& o, size_t group, const ErrorContext& where) {
  FSDP_CHECK(group < o.param_groups().size(), ErrorKind::kInvalidArgument, where, "param group ",
             group, " does not exist: the optimizer has ", o.param_groups().size(), " groups");
}

bool has_entry(InputArchive& a, const std::string& key) {
  c10::IValue v;
  if (a.try_read(key, v)) return true;
  at::Tensor t;
  return a.try_read(key, t);
}

// The torch::optim type whose Options::serialize writes the entries of `options` (an archived
// param group's "options"), for messages.
std::string archived_type(InputArchive& options) {
  if (has_entry(options, "alpha")) return "torch::optim::RMSprop";
  if (has_entry(options, "lr_decay")) return "torch::optim::Adagrad";
  if (has_entry(options, "max_iter")) return "torch::optim::LBFGS";
  if (has_entry(options, "betas")) return "torch::optim::Adam or torch::optim::AdamW";
  if (has_entry(options, "nesterov")) return "torch::optim::SGD";
  return "an unknown optimizer";
}

const char* type_of(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "torch::optim::AdamW";
    case OptimizerKind::kAdam: return "torch::optim::Adam";
    case OptimizerKind::kSGD: break;
  }
  return "torch::optim::SGD";
}

// Runs fn (a read of archive entry `entry`), turning libtorch's c10::Error into kCorruptData.
template <typename Fn>
auto read_entry(const ErrorContext& where, const std::string& entry, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kCorruptData, where,
                str_cat("optimizer archive entry '", entry, "' is malformed: ",
                        e.what_without_backtrace()));
  }
}

}  // namespace

const char* to_string(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kSGD: return "sgd";
  }
  return "?";
}

const char* supported_optimizers() {
  return "torch::optim::AdamW, torch::optim::Adam, torch::optim::SGD";
}

OptimizerKind optimizer_kind(const torch::optim::Optimizer& optimizer, const ErrorContext& where) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return OptimizerKind::kAdamW;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return OptimizerKind::kAdam;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return OptimizerKind::kSGD;
  throw Error(ErrorKind::kUnsupported, context(where, "optimizer_kind"),
              str_cat("unsupported optimizer type ", type_name(optimizer),
                      " (supported: ", supported_optimizers(), ")"));
}

at::Tensor ParamState::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return t.tensor;
  }
  return at::Tensor();
}

int64_t ParamState::bytes() const {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.tensor.defined() ? static_cast<int64_t>(t.tensor.nbytes()) : 0;
  return n;
}

std::vector<std::string> state_tensor_names(const torch::optim::Optimizer& optimizer,
                                            const at::Tensor& param, const ErrorContext& where) {
  const OptimizerKind kind = optimizer_kind(optimizer, context(where, "state_tensor_names"));
  return codec(kind).tensor_names(options_for(optimizer, param));
}

std::optional<ParamState> get_param_state(const torch::optim::Optimizer& optimizer,
                                          const at::Tensor& param, const ErrorContext& where) {
  const ErrorContext ctx = context(where, "get_param_state");
  const OptimizerKind kind = optimizer_kind(optimizer, ctx);
  auto it = optimizer.state().find(param.unsafeGetTensorImpl());
  if (it == optimizer.state().end() || !it->second) return std::nullopt;
  ParamState out;
  FSDP_CHECK(codec(kind).read(*it->second, out), ErrorKind::kUnsupported, ctx, "the ",
             to_string(kind), " optimizer holds state of type ",
             type_name(*it->second));
  return out;
}

void set_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                     const ParamState& state, const ErrorContext& where) {
  const ErrorContext ctx = context(where, "set_param_state");
  const OptimizerKind kind = optimizer_kind(optimizer, ctx);
  std::vector<std::string> want = codec(kind).tensor_names(options_for(optimizer, param));
  std::vector<std::string> got;
  for (const auto& t : state.tensors) got.push_back(t.name);
  std::vector<std::string> want_sorted = want, got_sorted = got;
  std::sort(want_sorted.begin(), want_sorted.end());
  std::sort(got_sorted.begin(), got_sorted.end());
  FSDP_CHECK(want_sorted == got_sorted, ErrorKind::kInvalidArgument, ctx,
             expected_actual(str_cat(to_string(kind), " state tensors of a parameter of shape ",
                                     param.sizes()),
                             join(want), join(got)));
  for (const auto& t : state.tensors) {
    FSDP_CHECK(t.tensor.defined() && t.tensor.sizes() == param.sizes(), ErrorKind::kInvalidArgument,
               ctx,
               expected_actual("shape of state tensor '" + t.name + "'", param.sizes(),
                               t.tensor.defined() ? str_cat(t.tensor.sizes()) : "undefined"));
  }
  optimizer.state()[param.unsafeGetTensorImpl()] = codec(kind).make(state);
}

void clear_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ErrorContext& where) {
  optimizer_kind(optimizer, context(where, "clear_param_state"));
  optimizer.state().erase(param.unsafeGetTensorImpl());
}

int64_t state_bytes(const torch::optim::Optimizer& optimizer, const ErrorContext& where) {
  const ErrorContext ctx = context(where, "state_bytes");
  const OptimizerKind kind = optimizer_kind(optimizer, ctx);
  int64_t n = 0;
  for (const auto& kv : optimizer.state()) {
    if (!kv.second) continue;
    ParamState s;
    FSDP_CHECK(codec(kind).read(*kv.second, s), ErrorKind::kUnsupported, ctx, "the ", to_string(kind),
               " optimizer holds state of type ", type_name(*kv.second));
    n += s.bytes();
  }
  return n;
}

std::optional<size_t> param_group_index(const torch::optim::Optimizer& optimizer,
                                        const at::Tensor& param) {
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& q : groups[g].params()) {
      if (q.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return g;
    }
  }
  return std::nullopt;
}

std::vector<std::string> group_option_names(OptimizerKind kind) {
  return codec(kind).option_names();
}

std::vector<std::string> state_tensor_names(OptimizerKind kind, const GroupOptions& options) {
  return codec(kind).tensor_names(options);
}

GroupOptions group_options(const torch::optim::Optimizer& optimizer, size_t group,
                           const ErrorContext& where) {
  const ErrorContext ctx = context(where, "group_options");
  const OptimizerKind kind = optimizer_kind(optimizer, ctx);
  check_group(optimizer, group, ctx);
  const OptimizerOptions& o = optimizer.param_groups()[group].options();
  auto out = codec(kind).options(o);
  FSDP_CHECK(out.has_value(), ErrorKind::kUnsupported, ctx, "param group ", group, " of the ",
             to_string(kind), " optimizer has options of type ", type_name(o));
  return *out;
}

void set_group_options(torch::optim::Optimizer& optimizer, size_t group, const GroupOptions& options,
                       const ErrorContext& where) {
  const ErrorContext ctx = context(where, "set_group_options");
  const OptimizerKind kind = optimizer_kind(optimizer, ctx);
  check_group(optimizer, group, ctx);
  const std::vector<std::string> valid = codec(kind).option_names();
  for (const auto& kv : options) {
    FSDP_CHECK(std::find(valid.begin(), valid.end(), kv.first) != valid.end(),
               ErrorKind::kInvalidArgument, ctx, to_string(kind),
               " param groups have no option '", kv.first, "' (its options: ", join(valid), ")");
  }
  OptimizerOptions& o = optimizer.param_groups()[group].options();
  for (const auto& kv : options) {
    FSDP_CHECK(codec(kind).set_option(o, kv.first, kv.second), ErrorKind::kUnsupported, ctx,
               "param group ", group, " of the ", to_string(kind), " optimizer has options of type ",
               type_name(o));
  }
}

ArchivedOptimizer read_optimizer_archive(InputArchive& archive, OptimizerKind kind,
                                         const ErrorContext& where) {
  const ErrorContext ctx = context(where, "read_optimizer_archive");
  const Codec& c = codec(kind);
  InputArchive state, groups;
  {
    c10::IValue version;
    FSDP_CHECK(archive.try_read("pytorch_version", version) && archive.try_read("state", state) &&
                   archive.try_read("param_groups", groups),
               ErrorKind::kCorruptData, ctx,
               "not a torch::optim optimizer archive (torch::save(optimizer, path)): it has no "
               "'pytorch_version', 'state' and 'param_groups' entries (a saved module or tensor?)");
  }
  ArchivedOptimizer out;
  const int64_t n_groups = read_entry(ctx, "param_groups/size", [&] {
    at::Tensor t;
    groups.read("param_groups/size", t);
    return t.item<int64_t>();
  });
  FSDP_CHECK(n_groups >= 0, ErrorKind::kCorruptData, ctx,
             expected_actual("optimizer archive entry 'param_groups/size'", ">= 0", n_groups));
  for (int64_t i = 0; i < n_groups; ++i) {
    const std::string entry = "param_groups/" + std::to_string(i);
    InputArchive group, options;
    read_entry(ctx, entry, [&] {
      groups.read(entry, group);
      group.read("options", options);
    });
    for (const auto& key : c.archive_option_keys()) {
      FSDP_CHECK(has_entry(options, key), ErrorKind::kInvalidArgument, ctx,
                 expected_actual("the optimizer in the archive (judged by the options of its param "
                                 "group " + std::to_string(i) + ")",
                                 type_of(kind), archived_type(options)));
    }
    ArchivedParamGroup g;
    g.options = read_entry(ctx, entry + "/options", [&] { return c.read_archived_options(options); });
    read_entry(ctx, entry + "/params", [&] {
      at::Tensor size;
      group.read("params/size", size);
      for (int64_t j = 0; j < size.item<int64_t>(); ++j) {
        c10::IValue key;
        group.read("params/" + std::to_string(j), key);
        g.param_keys.push_back(key.toStringRef());
      }
    });
    out.groups.push_back(std::move(g));
  }
  for (const auto& key : read_entry(ctx, "state", [&] { return state.keys(); })) {
    const std::string entry = "state/" + key;
    out.state[key] = read_entry(ctx, entry, [&] {
      InputArchive s;
      state.read(key, s);
      return c.read_archived_state(s);
    });
  }
  return out;
}

}  // namespace fsdp::optim
