// The built-in device profiles: DGX A100 and DGX H100 nodes from the vendors' datasheets.
#include "fsdp/planner/profile.h"

#include "fsdp/common/check.h"
#include "profile_file.h"

namespace fsdp::planner {
namespace {

// [Note: built-in profiles] Figures from the vendors' datasheets, per GPU. NVLink's "900GB/s" and
// "600GB/s" are bidirectional totals: a ring sends and receives at once, so a rank's bandwidth is
// half. InfiniBand: one single-port adapter per GPU (DGX), its line rate in bytes. Matmul rates
// are the dense Tensor Core peaks (the datasheets print them "with sparsity", twice the dense
// figure), fp32 the non-tensor FP32 peak (PyTorch runs fp32 matmuls without TF32 by default).
// The latencies are NCCL's own cost model for its Simple protocol (the one large messages use):
// a fixed cost per collective and one per ring step on NVLink or on the network. The achieved
// efficiency per precision is the published MFU of dense transformer training on that GPU (bf16;
// fp16 runs on the same Tensor Core peak and takes the bf16 figure). fp32 has no published figure:
// it takes the bf16 fraction of its own (non-tensor) peak, an assumption the sources name, rather
// than the bare peak, which no training step reaches (a plan at 98% MFU). [Note: collectives across nodes] in
// time_model.cpp for how the NICs are used.
constexpr double kNcclBaseLatencyS = 8.4e-6, kNcclNvlinkHopS = 3.4e-6, kNcclNetHopS = 9.6e-6;
const char* const kNcclLatencySource =
    "NCCL's tuning model (NVIDIA/nccl, src/graph/tuning.cc), Simple protocol, ring: 8.4 us per collective, "
    "3.4 us per NVLink step, 9.6 us per network step (the latencies used here); one ring per NIC "
    "(NCCL documentation, 'NCCL_CROSS_NIC', 'NCCL_MIN_NCHANNELS'; nccl-tests doc/PERFORMANCE.md for bus bandwidth)";

DeviceProfile dgx(const std::string& name) {
  DeviceProfile p;
  p.name = name;
  p.ranks_per_node = 8;
  p.nics_per_node = 8;  // one single-port adapter per GPU (DGX A100 and H100 datasheets)
  p.collective_base_latency_s = kNcclBaseLatencyS;
  p.memory_bytes = 80'000'000'000;  // the datasheets' "80GB"
  LinkProfile nvlink, ib;
  double hbm_bytes_per_s = 0.0;
  nvlink.alpha_s = kNcclNvlinkHopS;
  ib.alpha_s = kNcclNetHopS;
  if (name == "h100") {
    p.description = "DGX H100 node: 8 x H100 SXM5 80GB, NVLink 4 + NVSwitch, 8 x 400 Gb/s InfiniBand";
    p.sources = {
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: FP32 67 TFLOPS; BF16 and FP16 Tensor Core "
        "1,979 TFLOPS with sparsity (989.5 dense, used here); GPU memory 80GB; NVLink 900GB/s "
        "(bidirectional: 450 GB/s per direction used here)",
        "NVIDIA DGX H100 datasheet: 8 x H100, 4 x NVSwitch, 8 x single-port ConnectX-7 VPI up to "
        "400 Gb/s InfiniBand (one per GPU: 50 GB/s per direction used here)",
        kNcclLatencySource,
        "achieved efficiency bf16 (and fp16) by model width, 0.344 at C = 4096 and 0.466 at C = 8192: Team "
        "PyTorch at IBM and at Meta, 'Maximizing training throughput using PyTorch FSDP' (pytorch.org blog, "
        "2024), table 1: 7,500 / 1,550 / 800 tokens/s per GPU for Llama 2 7B / 34B / 70B on 96 H100 80GB, "
        "800 Gb/s per node, 2 x 4096 tokens per GPU; the fraction of the peak that reproduces them "
        "(docs/planner.md \"Profiles\"); fp32, which has no published figure, assumed at the same fraction of "
        "its own peak"};
    p.sources.push_back("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: GPU memory bandwidth 3.35TB/s (the step "
                        "update's time: its bytes per element at this rate; the engine's copies at this rate)");
    hbm_bytes_per_s = 3.35e12;
    p.matmul_flops_per_s_fp32 = 67e12;
    p.matmul_flops_per_s_bf16 = 989.5e12;
    p.matmul_flops_per_s_fp16 = 989.5e12;
    p.achieved_efficiency_bf16.points = {{4096, 0.344}, {8192, 0.466}};
    p.achieved_efficiency_fp16 = p.achieved_efficiency_fp32 = p.achieved_efficiency_bf16;
    nvlink.bandwidth_bytes_per_s = 450e9;
    ib.bandwidth_bytes_per_s = 50e9;
  } else {
    p.description = "DGX A100 node: 8 x A100 SXM4 80GB, NVLink 3 + NVSwitch, 8 x 200 Gb/s HDR InfiniBand";
    p.sources = {
        "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: FP32 19.5 TFLOPS; BF16 and FP16 Tensor "
        "Core 312 TFLOPS (624 with sparsity); GPU memory 80GB HBM2e; NVLink 600GB/s (bidirectional: "
        "300 GB/s per direction used here)",
        "NVIDIA DGX A100 datasheet: 8 x A100 80GB, 6 x NVSwitch, 8 x single-port ConnectX-6 VPI "
        "200 Gb/s HDR InfiniBand (one per GPU: 25 GB/s per direction used here)",
        kNcclLatencySource,
        "achieved efficiency bf16 (and fp16) by model width, 0.533 at C = 4096 and 0.670 at C = 8192: Team "
        "PyTorch at IBM and at Meta, 'Maximizing training throughput using PyTorch FSDP' (pytorch.org blog, "
        "2024), table 1: 3,700 / 700 / 370 tokens/s per GPU for Llama 2 7B / 34B / 70B on 128 A100 80GB, "
        "400 Gb/s per node, 2 x 4096 tokens per GPU; the fraction of the peak that reproduces them "
        "(docs/planner.md \"Profiles\"); fp32, which has no published figure, assumed at the same fraction of "
        "its own peak"};
    p.sources.push_back("NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: GPU memory bandwidth 2,039GB/s (the "
                        "step update's time: its bytes per element at this rate; the engine's copies at this rate)");
    hbm_bytes_per_s = 2.039e12;
    p.matmul_flops_per_s_fp32 = 19.5e12;
    p.matmul_flops_per_s_bf16 = 312e12;
    p.matmul_flops_per_s_fp16 = 312e12;
    p.achieved_efficiency_bf16.points = {{4096, 0.533}, {8192, 0.670}};
    p.achieved_efficiency_fp16 = p.achieved_efficiency_fp32 = p.achieved_efficiency_bf16;
    nvlink.bandwidth_bytes_per_s = 300e9;
    ib.bandwidth_bytes_per_s = 25e9;
  }
  const CollectiveLinks links{nvlink, ib};
  p.all_gather = p.reduce_scatter = p.all_reduce = links;
  using O = OptimizerKind;
  p.step_update_s_per_elem_adamw = static_cast<double>(step_update_bytes_per_elem(O::kAdamW)) / hbm_bytes_per_s;
  p.step_update_s_per_elem_sgd_momentum =
      static_cast<double>(step_update_bytes_per_elem(O::kSgdMomentum)) / hbm_bytes_per_s;
  p.step_update_s_per_elem_sgd = static_cast<double>(step_update_bytes_per_elem(O::kSgd)) / hbm_bytes_per_s;
  p.memory_copy_bytes_per_s = hbm_bytes_per_s;
  p.comm_overlaps_compute = true;
  return p;
}

}  // namespace

std::vector<std::string> builtin_profile_names() { return {"a100", "h100"}; }

DeviceProfile builtin_profile(const std::string& name) {
  FSDP_CHECK(name == "a100" || name == "h100", ErrorKind::kInvalidArgument, profile_file::kWhere,
             expected_actual("built-in profile", "a100 or h100", "'" + name + "'"));
  return dgx(name);
}

}  // namespace fsdp::planner
