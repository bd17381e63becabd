#include "plan/report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

namespace apps::plan {
namespace fp = fsdp::planner;

namespace {

std::string b(double bytes) { return fp::format_bytes(bytes); }

std::string num(double v, const char* fmt) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string count(int64_t n) { return fp::format_count(n); }

std::string seconds(double s) {
  if (s == 0) return "0";
  if (s < 1e-3) return num(s * 1e6, "%.0f us");
  if (s < 1) return num(s * 1e3, "%.1f ms");
  if (s < 1e5) return num(s, "%.2f s");
  return num(s, "%.3g s");
}

// A table with right-aligned columns (the first left-aligned).
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const {
    std::vector<size_t> w(rows_[0].size(), 0);
    for (const auto& r : rows_) {
      for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    }
    std::ostringstream os;
    for (size_t k = 0; k < rows_.size(); ++k) {
      const auto& r = rows_[k];
      for (size_t i = 0; i < r.size(); ++i) {
        const std::string pad(w[i] - r[i].size(), ' ');
        os << (i == 0 ? r[i] + pad : "  " + pad + r[i]);
      }
      os << "\n";
      if (k == 0) {
        size_t total = 0;
        for (size_t i = 0; i < w.size(); ++i) total += w[i] + (i ? 2 : 0);
        os << std::string(total, '-') << "\n";
      }
    }
    return os.str();
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// 2nd, 3rd, 4th, 11th, 21st, ...
std::string ordinal(int64_t k) {
  const int64_t last = k % 10, tens = k % 100;
  const char* suffix = (tens >= 11 && tens <= 13) ? "th"
                       : last == 1                ? "st"
                       : last == 2                ? "nd"
                       : last == 3                ? "rd"
                                                  : "th";
  return std::to_string(k) + suffix;
}

// Which rate a step's compute is priced at and where it comes from (profile.h
// DeviceProfile::flops_per_s): the measured model rate, the user's --compute-efficiency, the
// profile's achieved-efficiency figure for the model's width (its own point, between two, or the
// nearest end's), the profile's compute_efficiency, or the bare peak.
std::string compute_line(const fp::DeviceProfile& prof, fp::Precision pr, int64_t n_embd,
                         bool compute_efficiency_given) {
  const std::string lp = fp::to_string(pr);
  if (const double measured = prof.model_flops_per_s(pr); measured > 0) {
    return lp + " at the profile's measured model rate, " + num(measured / 1e12, "%.4g") +
           " TFLOP/s per rank (a training pass measured by --calibrate)";
  }
  const double peak = prof.peak_flops_per_s(pr);
  if (peak <= 0) return "no " + lp + " rate in the profile";
  const double e = prof.efficiency(pr, n_embd);
  std::string why;
  const fp::EfficiencyCurve& c = prof.achieved_efficiency(pr);
  if (compute_efficiency_given) {
    why = "--compute-efficiency";
  } else if (!c.empty()) {
    const auto& pts = c.points;
    const int64_t lo = pts.front().n_embd, hi = pts.back().n_embd;
    const std::string width = ", this model's " + std::to_string(n_embd);
    if (lo == 0) {
      why = "the profile's achieved efficiency";
    } else if (n_embd <= 0) {
      why = "model width unknown: the profile's achieved efficiency for width " + std::to_string(lo) +
            ", the narrowest it states";
    } else if (n_embd < lo) {
      why = "the profile's achieved efficiency for width " + std::to_string(lo) + ", the narrowest it states" + width;
    } else if (n_embd > hi) {
      why = "the profile's achieved efficiency for width " + std::to_string(hi) + ", the widest it states" + width;
    } else {
      size_t i = 0;
      while (pts[i].n_embd < n_embd) ++i;
      why = pts[i].n_embd == n_embd
                ? "the profile's achieved efficiency for width " + std::to_string(n_embd)
                : "width " + std::to_string(n_embd) + ", between the profile's achieved efficiencies for widths " +
                      std::to_string(pts[i - 1].n_embd) + " and " + std::to_string(pts[i].n_embd);
    }
    why += "; --compute-efficiency replaces it";
  } else if (prof.compute_efficiency < 1) {
    why = "the profile's compute_efficiency";
  } else {
    why = "the peak: the profile states no efficiency for " + lp;
  }
  return lp + " matmuls at " + num(100 * e, "%.1f") + "% of the " + num(peak / 1e12, "%.4g") + " TFLOP/s peak (" +
         why + ")";
}

std::string split_line(const fp::Plan& p) {
  const fp::StepSetup& st = p.inputs.step;
  const fp::BytesPerParam& e = p.engine_split;
  const fp::BytesPerParam& z = p.zero_paper_split;
  const std::string opt = fp::to_string(st.optimizer);
  const std::string lp = fp::to_string(st.precision);
  std::ostringstream os;
  int64_t trainable = 0;
  for (const auto& u : p.inputs.model.units) trainable += u.trainable_numel();
  const bool frozen = trainable < p.inputs.model.num_params();
  os << "Model state per " << (frozen ? "trainable " : "") << "parameter (unsharded"
     << (frozen ? "; a frozen one: its params' 4 B only" : "") << "): " << num(e.total(), "%.0f") << " B = params "
     << num(e.params, "%.0f")
     << " (fp32 master rows) + grads " << num(e.grads, "%.0f") << " (fp32) + optimizer " << num(e.optimizer, "%.0f")
     << " (" << opt << (st.optimizer == fp::OptimizerKind::kAdamW ? " m, v" : "") << ", fp32)";
  if (st.precision != fp::Precision::kFp32) {
    os << "; " << lp << " unsharded params and grads are transient (peak columns)\n";
    os << "  ZeRO paper's split of the same " << num(z.total(), "%.0f") << " B: " << lp << " params "
       << num(z.params, "%.0f") << " + " << lp << " grads " << num(z.grads, "%.0f") << " + fp32 master, optimizer state "
       << num(z.optimizer, "%.0f") << "\n";
  } else {
    os << "\n  (ZeRO paper's fp32 split: " << num(z.params, "%.0f") << " + " << num(z.grads, "%.0f") << " + "
       << num(z.optimizer, "%.0f") << ")\n";
  }
  return os.str();
}

}  // namespace

std::string wrap_lines(const std::string& text, size_t width) {
  std::istringstream in(text);
  std::ostringstream out;
  std::string line;
  while (std::getline(in, line)) {
    const size_t indent = line.find_first_not_of(' ') == std::string::npos ? 0 : line.find_first_not_of(' ');
    if (line.find("  ", indent) != std::string::npos) {  // a table row (columns two spaces apart): kept whole
      out << line << "\n";
      continue;
    }
    std::string rest = line;
    bool first = true;
    while (rest.size() > width) {
      size_t cut = rest.rfind(' ', width);
      const size_t lead = first ? indent : indent + 2;
      if (cut == std::string::npos || cut <= lead) cut = rest.find(' ', width);  // a long word stays whole
      if (cut == std::string::npos) break;
      out << rest.substr(0, cut) << "\n";
      rest = std::string(indent + 2, ' ') + rest.substr(rest.find_first_not_of(' ', cut) == std::string::npos
                                                             ? rest.size()
                                                             : rest.find_first_not_of(' ', cut));
      first = false;
    }
    out << rest << "\n";
  }
  std::string s = out.str();
  if (!text.empty() && text.back() != '\n' && !s.empty()) s.pop_back();
  return s;
}

std::string format_plan(const fp::Plan& p, const GivenInputs& given) {
  const bool compute_efficiency_given = given.compute_efficiency;
  const fp::PlanInputs& in = p.inputs;
  const fp::ModelSpec& m = in.model;
  const fp::StepSetup& st = in.step;
  std::ostringstream os;
  const int64_t L = m.num_blocks();
  int64_t block = 0;
  for (int64_t u = 1; u <= L; ++u) block = std::max(block, m.units[u].numel());
  os << "fsdp-plan: " << m.name << ", " << count(m.num_params()) << " params (" << L << " block units of "
     << count(block) << " + root " << count(m.units.empty() ? 0 : m.units[0].numel()) << "), "
     << fp::to_string(st.optimizer) << ", " << fp::to_string(st.precision) << "\n";
  int64_t trainable = 0;
  for (const auto& u : m.units) trainable += u.trainable_numel();
  if (trainable < m.num_params()) {
    os << "  trainable: " << count(trainable) << " params ("
       << num(100.0 * static_cast<double>(trainable) / static_cast<double>(m.num_params()), "%.3g")
       << "%; adapters over a frozen base); a frozen param holds its fp32 master rows only (4 B), no grads or "
          "optimizer state\n";
  }
  const int64_t N = in.world_size, rpn = p.ranks_per_node;
  os << "  N = " << N << " ranks";
  if (N > rpn) os << " (" << (N + rpn - 1) / rpn << " nodes x " << rpn << ")";
  os << "; micro-batch " << st.micro_batch_size << " x " << st.seq_len << " tokens, accumulation "
     << st.accumulation_steps << " (global batch " << N * st.accumulation_steps * st.micro_batch_size
     << " sequences, " << count(N * st.accumulation_steps * st.micro_batch_size * st.seq_len) << " tokens/step)"
     << (st.activation_checkpointing ? ", activation checkpointing" : "")
     << (st.checkpoint_every > 1 ? " of every " + ordinal(st.checkpoint_every) + " block" : "")
     << (st.all_gather_codec == fsdp::WireCodec::kInt8 ? ", int8 all-gathers" : "")
     << (st.reduce_scatter_codec == fsdp::WireCodec::kInt8 ? ", int8 reduce-scatters" : "") << "\n";
  os << "  profile " << in.profile.name << (in.profile.description.empty() ? "" : ": " + in.profile.description) << "\n";
  for (const std::string& source : in.profile.sources) {  // the user's link replaces the profile's
    if (source.find("--inter-node-bandwidth") != std::string::npos) os << "  " << source << "\n";
  }
  if (!given.profile) {
    os << "  note: no --profile given, so this plans GPUs of the built-in " << in.profile.name
       << "; for CPU ranks measure your machine (mpirun -n 2 build/bin/fsdp-plan --calibrate --out cpu.json) and plan "
          "with --profile cpu.json\n";
  }
  if (!given.ranks_per_node && N > rpn) {
    os << "  note: " << N << " ranks span " << (N + rpn - 1) / rpn << " nodes because the profile's node holds " << rpn
       << " ranks; --ranks-per-node says how many run on one host of yours\n";
  }
  os << "  compute: " << compute_line(in.profile, st.precision, m.arch.n_embd, compute_efficiency_given) << "\n";
  os << "  memory per rank " << b(static_cast<double>(p.memory_per_rank_bytes)) << ", usable "
     << b(static_cast<double>(p.usable_bytes)) << " (" << num(in.headroom * 100, "%.0f") << "% headroom); bytes of rank "
     << in.rank << "\n";
  os << "  reduce-scatter: "
     << (st.reduce_scatter_route == fp::ReduceScatterRoute::kInPlace
             ? "in place (NCCL's ring; --reduce-scatter-route all_to_all for fsdp-train over MPI or Gloo)"
             : "all-to-all and a local sum (fsdp-train over MPI or Gloo): the received blocks count while it runs")
     << "\n\n";
  os << split_line(p) << "\n";

  // Four tables of at most 100 columns: model state, peak, traffic, time.
  Table state({"strategy", "params", "grads", "optimizer", "full params", "state"});
  Table peak({"strategy", "full params", "full grads", "activations", "logits", "peak", "fits"});
  std::vector<std::pair<std::string, std::string>> moments;  // (moment, the strategies peaking then)
  for (const auto& s : p.strategies) {
    const fp::PeakBytes& k = s.peak;
    state.add({s.parallelism.label(), b(s.state.sharded_param_bytes), b(s.state.sharded_grad_bytes),
               b(s.state.optim_state_bytes), b(s.state.resident_unsharded_param_bytes), b(s.state.total_bytes())});
    peak.add({s.parallelism.label(), b(k.unsharded_param_bytes), b(k.unsharded_grad_bytes),
              k.activations_known ? b(k.activation_bytes) : "n/a", k.activations_known ? b(k.loss_transient_bytes) : "n/a",
              b(k.peak_bytes), s.fits ? "yes" : "no"});
    auto it = std::find_if(moments.begin(), moments.end(), [&](const auto& m) { return m.first == k.moment; });
    if (it == moments.end()) moments.emplace_back(k.moment, s.parallelism.label());
    else it->second += ", " + s.parallelism.label();
  }
  os << "Memory per rank. Model state after an optimizer step (params: fp32 master rows incl. padding; full params: "
        "kept between steps):\n"
     << state.str() << "\n"
     << "Peak: the largest moment of a step (state + transient full params and grads + activations + logits "
        "gradients), and when it comes:\n"
     << peak.str();
  os << "  at:";
  for (size_t i = 0; i < moments.size(); ++i) {
    os << (i ? ";" : "") << " " << moments[i].first << " (" << moments[i].second << ")";
  }
  os << "\n\n";

  bool any_all_to_all = false;  // int8 reduce-scatters move as all-to-alls: a column only then
  for (const auto& s : p.strategies) any_all_to_all = any_all_to_all || s.traffic.all_to_all.calls > 0;
  std::vector<std::string> traffic_head{"strategy", "all-gather", "reduce-scatter", "all-reduce", "sent/rank",
                                       "across nodes/rank"};
  if (any_all_to_all) traffic_head.insert(traffic_head.begin() + 4, "all-to-all (int8)");
  Table traffic(traffic_head);
  Table t({"strategy", "compute", "update", "copies", "comm", "exposed", "step"});
  Table rate({"strategy", "step", "tokens/s", "per rank", "MFU", "HFU"});
  auto kind = [](const fp::KindTotals& k) {
    return k.calls == 0 ? std::string("-") : std::to_string(k.calls) + " x, " + fp::format_bytes(static_cast<double>(k.logical_bytes));
  };
  for (const auto& s : p.strategies) {
    std::vector<std::string> row{s.parallelism.label(), kind(s.traffic.all_gather), kind(s.traffic.reduce_scatter),
                                 kind(s.traffic.all_reduce), b(s.traffic.wire_bytes()),
                                 b(s.traffic.inter_node_bytes())};
    if (any_all_to_all) row.insert(row.begin() + 4, kind(s.traffic.all_to_all));
    traffic.add(row);
    t.add({s.parallelism.label(), seconds(s.time.compute_s), seconds(s.time.update_s), seconds(s.time.copy_s),
           seconds(s.time.comm_s), seconds(s.time.exposed_comm_s), seconds(s.time.step_s)});
    rate.add({s.parallelism.label(), seconds(s.time.step_s), num(s.time.tokens_per_s, "%.3g"),
              num(s.time.tokens_per_s / static_cast<double>(N), "%.4g"), num(100 * s.time.mfu, "%.1f%%"),
              num(100 * s.time.hfu, "%.1f%%")});
  }
  os << "Traffic per step (calls, logical bytes as CommStats counts them; sent/rank: ring bytes each rank sends):\n"
     << traffic.str() << "\n"
     << "Estimated time per step (compute: forward + backward; update: grad norm and clip, optimizer step, zeroing; "
        "copies: the engine's casts, unshard and gradient copies; comm: busy, and exposed: not hidden by compute):\n"
     << t.str() << "\n"
     << "Throughput (MFU, HFU: model FLOPs (no recompute) and hardware FLOPs (recompute included) per second over "
        "the profile's matmul peak):\n"
     << rate.str();
  if (!p.strategies.empty() && !p.strategies.front().peak.activations_known) {
    os << "(a parameter-count model: no activations; FLOPs 6 x params x tokens)\n";
  }
  const fp::Recommendation& r = p.recommendation;
  os << "\nRecommendation: ";
  switch (r.kind) {
    case fp::RecommendationKind::kDataParallel: os << r.choice.label() << " at N = " << N; break;
    case fp::RecommendationKind::kMoreRanks: os << "full_shard at N >= " << r.min_world_size; break;
    case fp::RecommendationKind::kModelParallel: os << "tensor or pipeline parallelism"; break;
  }
  if (r.activation_checkpointing) os << ", with activation checkpointing";
  os << "\n  why: " << r.reason << ".\n";
  for (const std::string& note : p.notes) os << "Note: " << note << ".\n";
  return wrap_lines(os.str());
}

}  // namespace apps::plan
