// The Adam and AdamW codecs of the optimizer-state adapter (optimizer_codec.h): exp_avg,
// exp_avg_sq (max_exp_avg_sq with amsgrad) and step, and their group options.
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <tuple>

#include "optimizer_codec.h"

namespace fsdp::optim::detail {
namespace {

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

}  // namespace

const Codec& adamw_codec() {
  static const AdamCodec<torch::optim::AdamWOptions, torch::optim::AdamWParamState> c;
  return c;
}

const Codec& adam_codec() {
  static const AdamCodec<torch::optim::AdamOptions, torch::optim::AdamParamState> c;
  return c;
}

}  // namespace fsdp::optim::detail
