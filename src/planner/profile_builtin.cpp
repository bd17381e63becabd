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
// The per-step latencies alpha are not datasheet figures: they are assumed (typical of NCCL's
// small-message latency) and say so in `sources`.
DeviceProfile dgx(const std::string& name) {
  DeviceProfile p;
  p.name = name;
  p.ranks_per_node = 8;
  p.memory_bytes = 80'000'000'000;  // the datasheets' "80GB"
  LinkProfile nvlink, ib;
  double hbm_bytes_per_s = 0.0;
  nvlink.alpha_s = 2e-6;
  ib.alpha_s = 6e-6;
  if (name == "h100") {
    p.description = "DGX H100 node: 8 x H100 SXM5 80GB, NVLink 4 + NVSwitch, 8 x 400 Gb/s InfiniBand";
    p.sources = {
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: FP32 67 TFLOPS; BF16 and FP16 Tensor Core "
        "1,979 TFLOPS with sparsity (989.5 dense, used here); GPU memory 80GB; NVLink 900GB/s "
        "(bidirectional: 450 GB/s per direction used here)",
        "NVIDIA DGX H100 datasheet: 8 x H100, 4 x NVSwitch, 8 x single-port ConnectX-7 VPI up to "
        "400 Gb/s InfiniBand (one per GPU: 50 GB/s per direction used here)",
        "alpha (latency per ring step) 2 us within a node, 6 us between nodes: assumed, not from a "
        "datasheet"};
    p.sources.push_back("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: GPU memory bandwidth 3.35TB/s (the step "
                        "update's time: its bytes per element at this rate; the engine's copies at this rate)");
    hbm_bytes_per_s = 3.35e12;
    p.matmul_flops_per_s_fp32 = 67e12;
    p.matmul_flops_per_s_bf16 = 989.5e12;
    p.matmul_flops_per_s_fp16 = 989.5e12;
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
        "alpha (latency per ring step) 2 us within a node, 6 us between nodes: assumed, not from a "
        "datasheet"};
    p.sources.push_back("NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: GPU memory bandwidth 2,039GB/s (the "
                        "step update's time: its bytes per element at this rate; the engine's copies at this rate)");
    hbm_bytes_per_s = 2.039e12;
    p.matmul_flops_per_s_fp32 = 19.5e12;
    p.matmul_flops_per_s_bf16 = 312e12;
    p.matmul_flops_per_s_fp16 = 312e12;
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
