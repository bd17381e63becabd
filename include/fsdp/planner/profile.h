// Device and network profiles for the time model (pure math plus a JSON file format): matmul
// FLOP rates per dtype, memory per rank, and latency-bandwidth parameters per collective kind for
// links within a node and between nodes. docs/planner.md, "Profiles".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/comm/comm_stats.h"
#include "fsdp/planner/setup.h"

namespace fsdp::planner {

/// The smallest shared_core_factor a profile holds where compute oversubscribes the cores: the
/// calibration's collectives take about half a training pass alone, and a difference below a tenth
/// of that is within the pass's own spread, so smaller measured factors are taken as this.
constexpr double kMinOversubscribedFactor = 0.1;

/// The largest rate per second a profile holds (bytes or FLOPs): well past any machine, so that an
/// edited file or a flag cannot make the time model overflow. A profile file's rates and
/// fsdp-plan's --inter-node-bandwidth are refused above it (and below 1 per second).
constexpr double kMaxProfileRatePerS = 1e18;

/// alpha-beta parameters of one ring step: a collective over n ranks costs (n-1) x alpha_s plus
/// its ring wire bytes (traffic.h) / bandwidth_bytes_per_s.
struct LinkProfile {
  double alpha_s = 0.0;                ///< latency of one ring step, seconds
  double bandwidth_bytes_per_s = 0.0;  ///< bytes per second one rank sends (and receives) at once
};

/// Links of one collective kind within a node and between nodes.
struct CollectiveLinks {
  LinkProfile intra_node;
  LinkProfile inter_node;
  /// Where communication shares the compute cores (DeviceProfile::comm_overlaps_compute false):
  /// the seconds a collective of this kind adds to a training step's compute per second it takes
  /// alone (the links' figures), measured with the collectives running beside the model's
  /// forward + backward ([Note: collectives beside compute] in the calibration). Both threads
  /// slow down when they share cores, and a rank whose communication thread waits for its peer's
  /// keeps a core busy: the factor is often above 1. At least 1 where the ranks' compute threads
  /// fit the cores (the engine waits for every collective: what runs beside a pass without such
  /// waits a step does not hide); in [kMinOversubscribedFactor, 1000] where they oversubscribe them
  /// (DeviceProfile::compute_oversubscribed: while a communication thread waits for its peers the
  /// other ranks' compute threads use the core, so a collective running beside compute costs it
  /// only its share of the cores; the replay charges that share and, separately, the waits where
  /// compute needs the result: [Note: time-shared cores]); 1 where not measured; unused where
  /// communication overlaps compute.
  double shared_core_factor = 1.0;
  /// Where compute oversubscribes the cores (DeviceProfile::compute_oversubscribed): how many times
  /// slower a collective of this kind runs on its communication thread while the compute threads
  /// compute beside it than alone (alone, the ranks' communication threads share the cores among
  /// themselves; beside compute, with the compute threads too). While the compute thread waits
  /// for a collective it runs at its speed alone ([Note: processor sharing]). Measured with
  /// shared_core_factor: the collectives' seconds on their thread beside a training pass over their
  /// time alone (reduce-scatters 2.1-3.8, all-gathers 1.4-3.4, all-reduces 1.9-2.7 at N = 4 on 2
  /// cores). In [1, 1000]; 1 where not measured; unused unless compute oversubscribes the cores.
  double duration_factor = 1.0;
};

/// One point of a calibration: a collective of `logical_bytes` took `seconds` (median).
struct CalibrationPoint {
  int64_t logical_bytes = 0;
  double seconds = 0.0;
};

/// Raw fit of one collective kind at the calibration's world size: t = alpha_s + beta_s_per_byte x
/// logical bytes (least squares over the points). The points themselves (logical bytes strictly
/// ascending; none, or at least 2) are what the time model uses within a node (collective_time_s,
/// DeviceProfile::has_measured_points): a machine's
/// collectives are not one line (Open MPI's reduce-scatter on 4 ranks of 2 cores ran 1.4 GB/s at
/// 12 MiB and 0.5 GB/s at 16 MiB, where it changes algorithm).
struct CalibrationFit {
  double alpha_s = 0.0;
  double beta_s_per_byte = 0.0;
  std::vector<CalibrationPoint> points;
};

/// One point of the step-update calibration: the update of one fp32 tensor of `numel` elements
/// (its gradient's norm and clip, the optimizer's step, zero_grad) took `seconds`
/// (median, slowest rank).
struct UpdatePoint {
  int64_t numel = 0;
  double seconds = 0.0;
};

/// The smallest compute_efficiency a profile file or fsdp-plan's --compute-efficiency accepts
/// (a step at 1% of the matmul peak; below it a typo, such as 0.001 for 0.1, is likelier).
inline constexpr double kMinComputeEfficiency = 0.01;

/// One published achieved-efficiency figure: the fraction of a GPU's matmul peak that training a
/// dense transformer of width `n_embd` reached, in the planner's hardware FLOPs (time_model.h
/// step_flops: recompute included, causal attention).
struct EfficiencyPoint {
  int64_t n_embd = 0;       ///< model width C of the measurement; 0: one figure for every width
  double efficiency = 0.0;  ///< in [kMinComputeEfficiency, 1]
};

/// A GPU's achieved efficiency by model width, for one precision. Published FSDP training of Llama
/// shapes reaches more of the peak the wider the model (A100: 0.53 of it at C = 4096, 0.67 at
/// C = 8192; docs/planner.md "Profiles"): a step's matmuls grow as C^2 per token and layer, the
/// work that does not run at the matmul rate (norms, activations, rotary, softmax, kernel
/// boundaries) as C, so time per hardware FLOP is a + b / C. Empty: none published. One point with
/// n_embd 0: that figure at every width. Otherwise points with n_embd > 0, strictly ascending:
/// 1/efficiency linear in 1/C between the two points around C, the nearest end point's figure
/// outside them (no extrapolation past what was measured).
struct EfficiencyCurve {
  std::vector<EfficiencyPoint> points;
  bool empty() const { return points.empty(); }
  /// The efficiency at width `n_embd` (> 0); 0 when empty.
  double at(int64_t n_embd) const;
  /// The first thing wrong with the points, as a message tail naming the point ("[1]: an
  /// efficiency must be in [0.01, 1], got 1.2"): an efficiency outside [kMinComputeEfficiency, 1],
  /// a width-free point beside others, or widths not positive and strictly ascending. Empty: none.
  std::string problem() const;
  /// Throws fsdp::Error (kInvalidArgument) "<what><problem()>" when problem() is not empty.
  void validate(const std::string& what) const;
};

/// A machine as the time model sees it, per rank.
struct DeviceProfile {
  std::string name;         ///< "h100", "a100", or the calibrated machine's name
  std::string description;  ///< one line
  std::vector<std::string> sources;  ///< where each figure comes from (datasheet names, calibration)
  int64_t memory_bytes = 0;          ///< memory per rank
  int64_t ranks_per_node = 1;
  double matmul_flops_per_s_fp32 = 0.0;  ///< matrix-product FLOP/s of one rank, fp32
  double matmul_flops_per_s_bf16 = 0.0;  ///< bf16
  double matmul_flops_per_s_fp16 = 0.0;  ///< fp16 (0: the bf16 rate)
  /// Fraction of those rates a training step reaches (1: the rates as given), in
  /// [kMinComputeEfficiency, 1]. A datasheet's figures are peaks: a step's estimate is then a
  /// lower bound. Not applied to model_flops_per_s.
  double compute_efficiency = 1.0;
  /// Datasheet profiles: the fraction of the matmul peak that published dense-transformer training
  /// reaches on this GPU, per precision and by model width (its source in `sources`); empty: none
  /// published (the precision then runs at matmul rate x compute_efficiency). A profile holds
  /// either these or a compute_efficiency below 1, never both (profile_from_json refuses the mix);
  /// fsdp-plan's --compute-efficiency clears them (the user's figure wins). Not applied to
  /// model_flops_per_s.
  EfficiencyCurve achieved_efficiency_fp32;
  EfficiencyCurve achieved_efficiency_bf16;
  EfficiencyCurve achieved_efficiency_fp16;
  /// Calibrated profiles: the FLOP rate a whole training forward + backward of the calibrated model
  /// reached per rank (its matmul FLOPs, time_model.h `unit_flops`, over the measured seconds: the
  /// norms, activations, attention softmax and the loss included). 0: not measured (the time model
  /// then uses the matmul rate x compute_efficiency).
  double model_flops_per_s_fp32 = 0.0;
  double model_flops_per_s_bf16 = 0.0;
  double model_flops_per_s_fp16 = 0.0;
  /// Seconds per trainable element of a rank's sharded state for the work between backward and
  /// the next forward: the grad-norm, clipping, the optimizer's update and zeroing the gradients
  /// (fp32 master state). Per optimizer kind (setup.h).
  double step_update_s_per_elem_adamw = 0.0;
  double step_update_s_per_elem_sgd_momentum = 0.0;
  double step_update_s_per_elem_sgd = 0.0;
  /// Calibrated profiles: seconds of the step update of one tensor by its size, per optimizer kind
  /// (numel ascending). The optimizer and the gradient passes run tensor by tensor, several
  /// passes over each: a tensor that fits in the caches costs less per element than one that does
  /// not, and every tensor costs a fixed overhead. Empty: numel x step_update_s_per_elem_*.
  std::vector<UpdatePoint> step_update_points_adamw;
  std::vector<UpdatePoint> step_update_points_sgd_momentum;
  std::vector<UpdatePoint> step_update_points_sgd;
  /// Bytes per second (read plus written) of a large tensor copy on one rank, all ranks at once:
  /// the rate of the engine's own copies on the compute thread (unsharding a gathered buffer into
  /// the params, packing gradients for a reduction, casts, adding a reduced shard into the
  /// gradient; time_model.h). Datasheet profiles: the memory bandwidth.
  double memory_copy_bytes_per_s = 0.0;
  /// Whether a collective runs beside compute without slowing it (GPUs: copy engines and NCCL's
  /// own SMs). False where communication needs the cores compute runs on (a calibrated CPU
  /// machine whose ranks, each with a communication thread, use every core): the time model then
  /// adds every collective to the compute thread's time.
  bool comm_overlaps_compute = true;
  /// True where the compute threads alone need more cores than the node has (calibrated: ranks per
  /// node x intra-op threads > cores), so the ranks' compute time-shares the cores: the calibration
  /// then times every compute-thread figure from one barrier to the next (what a step's
  /// synchronised ranks get together), and shared_core_factor may be below 1. False for the
  /// datasheet profiles and where absent from a profile file.
  bool compute_oversubscribed = false;
  CollectiveLinks all_gather, reduce_scatter, all_reduce;
  /// Network adapters per node for collectives that cross nodes. 0 (profiles that do not state it,
  /// calibrated ones among them): one ring over the nodes, each ring step waiting for its slowest
  /// hop, charged at inter_node's bandwidth for all of a rank's ring bytes (the node's one link).
  /// >= 1: the NCCL model (time_model.h collective_time_s, docs/planner.md "Collectives across
  /// nodes"): one ring per adapter, intra-node hops on intra_node, all-reduce by ring or tree,
  /// whichever is faster; inter_node's bandwidth is then one adapter's.
  int64_t nics_per_node = 0;
  /// The NCCL model's fixed cost of one collective (launch and protocol), seconds; 0 where
  /// nics_per_node is 0.
  double collective_base_latency_s = 0.0;
  /// False for a profile calibrated at N = 1 (no collective was measured): it plans one rank only.
  bool has_collectives = true;
  /// Calibrated profiles: the world size measured and the raw fits per kind (all_gather,
  /// reduce_scatter, all_reduce); 0 and empty for datasheet profiles.
  int64_t calibration_world_size = 0;
  /// Calibrated profiles: the model whose training pass gave model_flops_per_s (its name and
  /// parameter count: a preset with overridden dimensions keeps its name) and that pass's
  /// micro-batch and sequence length (tokens). Empty and 0 for datasheet profiles and for profiles
  /// written before they were recorded. A plan for another setup gets a note (Plan::notes).
  std::string calibration_model;
  int64_t calibration_model_params = 0;
  int64_t calibration_micro_batch_size = 0;
  int64_t calibration_seq_len = 0;
  std::vector<CalibrationFit> fits;

  /// The rate a step's FLOPs run at for a precision and a model of width `n_embd`: the measured
  /// model rate when there is one, else the matmul rate times efficiency(p, n_embd); 0 when the
  /// profile has neither for `p` (the time model then refuses to plan that precision).
  double flops_per_s(Precision p, int64_t n_embd) const;
  /// The fraction of the matmul peak a step of a model of width `n_embd` reaches for `p` where no
  /// model rate is measured: the achieved_efficiency curve's figure at n_embd when the profile has
  /// one for `p`, else compute_efficiency. Throws fsdp::Error (kInvalidArgument) naming
  /// "achieved_efficiency.<precision>[i]" when that curve's points are wrong (EfficiencyCurve::problem).
  double efficiency(Precision p, int64_t n_embd) const;
  /// achieved_efficiency_* of a precision.
  const EfficiencyCurve& achieved_efficiency(Precision p) const;
  /// Whether any precision has an achieved_efficiency curve.
  bool has_achieved_efficiency() const;
  /// Clears every achieved_efficiency curve (a user's --compute-efficiency replaces them).
  void clear_achieved_efficiency();
  /// The matmul peak of a precision (matmul_flops_per_s_*; fp16 0: none): the denominator of
  /// MFU and HFU.
  double peak_flops_per_s(Precision p) const;
  /// model_flops_per_s_* of a precision; 0: not measured.
  double model_flops_per_s(Precision p) const;
  /// step_update_s_per_elem_* of an optimizer kind.
  double step_update_s_per_elem(OptimizerKind o) const;
  /// step_update_points_* of an optimizer kind.
  const std::vector<UpdatePoint>& step_update_points(OptimizerKind o) const;
  /// Seconds of the step update of one trainable tensor of `numel` elements (this rank's shard of
  /// one parameter). With points: linear in numel between the two points around it, the smallest
  /// point's seconds below it (the fixed cost of a tensor), the largest point's seconds per
  /// element above it; without: numel x step_update_s_per_elem(o). 0 for numel <= 0.
  double step_update_tensor_s(OptimizerKind o, int64_t numel) const;
  /// Whether the time model prices collectives within a node from the calibration's points
  /// (time_model.h collective_time_s): calibration_world_size >= 2 and at least 2 points in each of
  /// the three fits.
  bool has_measured_points() const;
  /// The links of a collective kind (all-to-all and broadcast use all_reduce's). Throws
  /// fsdp::Error (kInvalidArgument) when the profile has no collective figures (has_collectives).
  const CollectiveLinks& links(fsdp::comm::CollectiveKind kind) const;
};

/// Built-in profiles: "a100" (DGX A100 node: 8 x A100 SXM4 80GB, NVLink 3 / NVSwitch, 8 x
/// 200 Gb/s HDR InfiniBand) and "h100" (DGX H100 node: 8 x H100 SXM5 80GB, NVLink 4 / NVSwitch,
/// 8 x 400 Gb/s NDR InfiniBand), vendor datasheet figures (each cited in `sources`); their step
/// update times are the bytes the update moves per element (step_update_bytes_per_elem) at the
/// datasheet's memory bandwidth. Throws
/// fsdp::Error (kInvalidArgument) naming the known profiles.
DeviceProfile builtin_profile(const std::string& name);
std::vector<std::string> builtin_profile_names();

/// Bytes of memory traffic per trainable fp32 element of the step update (the grad-norm reads the
/// gradient, clipping reads and writes it: 12; zero_grad sets it to none and the gradients' own
/// finite check runs only after a non-finite norm: 0; AdamW reads param, grad, exp_avg,
/// exp_avg_sq and writes three: 28; SGD with momentum 20; SGD 12).
int64_t step_update_bytes_per_elem(OptimizerKind o);

/// The JSON form (docs/planner.md, "Profile file"). Throws fsdp::Error (kCorruptData) for a
/// document that is not a profile (missing or negative fields, wrong types).
DeviceProfile profile_from_json(const std::string& text);
std::string profile_to_json(const DeviceProfile& profile);
/// A built-in name, or a profile file. Throws fsdp::Error (kIo) when the file cannot be read,
/// kCorruptData when it is not a profile.
DeviceProfile load_profile(const std::string& name_or_path);

/// Least-squares fit t = alpha + beta x bytes of `points` (alpha, beta clamped to >= 0). Throws
/// fsdp::Error (kInvalidArgument) for fewer than 2 points.
CalibrationFit fit_alpha_beta(const std::vector<CalibrationPoint>& points);
/// The ring link a fit implies at world size n (n >= 2): all-gather / reduce-scatter alpha =
/// fit alpha / (n-1), bandwidth = (n-1)/n / beta; all-reduce (two passes) alpha / (2(n-1)),
/// 2(n-1)/n / beta. Throws fsdp::Error (kInvalidArgument) for n < 2.
LinkProfile link_from_fit(fsdp::comm::CollectiveKind kind, const CalibrationFit& fit, int64_t n);

}  // namespace fsdp::planner
