// The SGD codec of the optimizer-state adapter (optimizer_codec.h): momentum_buffer and the
// group options.
#include <torch/optim/sgd.h>

#include <tuple>

#include "optimizer_codec.h"

namespace fsdp::optim::detail {
namespace {

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

}  // namespace

const Codec& sgd_codec() {
  static const SgdCodec c;
  return c;
}

}  // namespace fsdp::optim::detail
