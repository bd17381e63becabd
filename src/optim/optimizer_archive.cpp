// Reading libtorch's optimizer archive (torch::save(optimizer, path)) through the optimizer-state
// adapter's codecs (optimizer_codec.h): param groups, their options and the per-param state.
#include <c10/util/Exception.h>

#include "fsdp/optim/optimizer_state.h"
#include "optimizer_codec.h"

namespace fsdp::optim {
namespace {

using detail::InputArchive;

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

ArchivedOptimizer read_optimizer_archive(InputArchive& archive, OptimizerKind kind,
                                         const ErrorContext& where) {
  const ErrorContext ctx = detail::context(where, "read_optimizer_archive");
  const detail::Codec& c = detail::codec(kind);
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
