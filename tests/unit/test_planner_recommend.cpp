// Tier `unit`: the planner's recommendations (DDP fits; ZeRO-2 needed; FULL_SHARD needed; the
// smallest world size; tensor/pipeline parallelism needed), its JSON output, profiles and the
// byte-count parser.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/common/check.h"
#include "fsdp/planner/activations.h"
#include "fsdp/planner/plan.h"
#include "planner_test_helpers.h"

namespace fp = fsdp::planner;
using S = fsdp::ShardingStrategy;
using planner_test::par;
using K = fp::RecommendationKind;

namespace {

fp::PlanInputs inputs(const fp::ModelSpec& m, int64_t n, fp::Precision prec, const std::string& profile = "h100") {
  fp::PlanInputs in;
  in.model = m;
  in.world_size = n;
  in.profile = fp::builtin_profile(profile);
  in.step.precision = prec;
  if (m.arch.kind == fp::BlockKind::kLlama) in.step.seq_len = 4096;
  return in;
}

fp::ModelSpec llama(const std::string& name) { return fp::llama_model(fp::llama_shape(name), name); }

}  // namespace

TEST(PlannerRecommend, DdpWhenItFitsWithHeadroom) {
  const fp::Plan p = fp::make_plan(inputs(fp::gpt_model(fp::gpt_shape("gpt2", 50257), "gpt2"), 8, fp::Precision::kBf16));
  EXPECT_EQ(p.recommendation.kind, K::kDataParallel);
  EXPECT_EQ(p.recommendation.choice.strategy, S::kNoShard) << p.recommendation.reason;
  EXPECT_FALSE(p.recommendation.activation_checkpointing);
  EXPECT_NE(p.recommendation.reason.find("no_shard (DDP) fits"), std::string::npos) << p.recommendation.reason;
  EXPECT_EQ(p.usable_bytes, 72'000'000'000) << "80 GB less 10% headroom";
  ASSERT_EQ(p.strategies.size(), 4u + 2u) << "all strategies, hybrid_shard at G = 2 and 4";
  for (const auto& s : p.strategies) EXPECT_TRUE(s.fits) << s.parallelism.label();
  // The headroom rule: a peak above (1 - headroom) x memory does not fit.
  fp::PlanInputs tight = inputs(fp::gpt_model(fp::gpt_shape("gpt2", 50257)), 8, fp::Precision::kBf16);
  tight.memory_per_rank_bytes = static_cast<int64_t>(p.strategies.front().peak.peak_bytes / 0.9) - 1000;
  EXPECT_NE(fp::make_plan(tight).recommendation.choice.strategy, S::kNoShard);
  tight.headroom = 0.0;
  EXPECT_EQ(fp::make_plan(tight).recommendation.choice.strategy, S::kNoShard);
}

// Communication-bound (a slow link) and too little memory for zero1's resident full params:
// shard_grad_op moves 2 x 4P per step against full_shard's 3 x 4P.
TEST(PlannerRecommend, ShardGradOpWhenZero1DoesNotFitAndCommunicationDominates) {
  fp::PlanInputs in = inputs(fp::gpt_model(fp::gpt_shape("micro", 8192), "micro"), 2, fp::Precision::kFp32);
  in.step.micro_batch_size = 2;
  in.step.seq_len = 64;
  fp::LinkProfile slow{1e-4, 1e9};
  in.profile.all_gather = in.profile.reduce_scatter = in.profile.all_reduce = {slow, slow};
  const fp::Plan probe = fp::make_plan(in);
  const fp::StrategyPlan& zero1 = probe.strategies[1];
  const fp::StrategyPlan& sgo = probe.strategies[2];
  ASSERT_EQ(zero1.parallelism.strategy, S::kZero1);
  ASSERT_EQ(sgo.parallelism.strategy, S::kShardGradOp);
  ASSERT_LT(sgo.peak.peak_bytes, zero1.peak.peak_bytes) << "shard_grad_op frees each block after its backward";
  in.headroom = 0.0;
  in.memory_per_rank_bytes = (sgo.peak.peak_bytes + zero1.peak.peak_bytes) / 2;
  const fp::Plan p = fp::make_plan(in);
  EXPECT_EQ(p.recommendation.kind, K::kDataParallel);
  EXPECT_EQ(p.recommendation.choice.strategy, S::kShardGradOp) << p.recommendation.reason;
  EXPECT_LT(p.strategies[2].time.step_s, p.strategies.back().time.step_s) << "faster than full_shard";
  EXPECT_TRUE(p.strategies.back().fits);
  EXPECT_FALSE(p.strategies[1].fits);
}

TEST(PlannerRecommend, FullShardWhenOnlyItFits) {
  const fp::Plan p = fp::make_plan(inputs(llama("llama2-13b"), 8, fp::Precision::kBf16));
  EXPECT_EQ(p.recommendation.kind, K::kDataParallel);
  EXPECT_EQ(p.recommendation.choice.strategy, S::kFullShard) << p.recommendation.reason;
  for (const auto& s : p.strategies) {
    EXPECT_EQ(s.fits, s.parallelism.strategy == S::kFullShard) << s.parallelism.label();
  }
}

TEST(PlannerRecommend, SmallestWorldSizeAtWhichFullShardFits) {
  fp::PlanInputs in = inputs(llama("llama2-70b"), 8, fp::Precision::kBf16);
  in.step.activation_checkpointing = true;
  const fp::Plan p = fp::make_plan(in);
  ASSERT_EQ(p.recommendation.kind, K::kMoreRanks) << p.recommendation.reason;
  const int64_t n = p.recommendation.min_world_size;
  EXPECT_GT(n, 8);
  EXPECT_EQ(n % 8, 0) << "beyond one node: whole nodes";
  auto fs_peak = [&](int64_t w) {
    fp::Parallelism par;
    par.world_size = w;
    par.ranks_per_node = 8;
    return fp::peak_bytes(in.model, par, p.inputs.step).peak_bytes;  // the route the plan used
  };
  EXPECT_LE(fs_peak(n), p.usable_bytes);
  EXPECT_GT(fs_peak(n - 8), p.usable_bytes) << "the smallest such world size";
  // Without checkpointing the activations alone do not fit, at any N; the planner says to turn it on.
  in.step.activation_checkpointing = false;
  const fp::Plan q = fp::make_plan(in);
  EXPECT_EQ(q.recommendation.kind, K::kMoreRanks);
  EXPECT_TRUE(q.recommendation.activation_checkpointing) << q.recommendation.reason;
  EXPECT_EQ(q.recommendation.min_world_size, n);
}

TEST(PlannerRecommend, ModelParallelismWhenWhatCannotBeShardedDoesNotFit) {
  fp::PlanInputs in = inputs(llama("llama2-70b"), 64, fp::Precision::kBf16);
  in.step.micro_batch_size = 16;
  const fp::Plan p = fp::make_plan(in);
  EXPECT_EQ(p.recommendation.kind, K::kModelParallel);
  EXPECT_NE(p.recommendation.reason.find("tensor or pipeline parallelism"), std::string::npos) << p.recommendation.reason;
  EXPECT_NE(p.recommendation.reason.find("activations"), std::string::npos);
}

TEST(PlannerRecommend, SevenBillionOnEightRanks) {
  fp::PlanInputs in = inputs(fp::params_only_model(7'000'000'000, 32, "7B"), 8, fp::Precision::kBf16);
  const fp::Plan p = fp::make_plan(in);
  EXPECT_EQ(p.strategies.front().state.total_bytes(), 112'000'000'000);
  EXPECT_EQ(p.strategies.back().state.total_bytes(), 14'000'000'000);
  EXPECT_EQ(p.engine_split.total(), 16);
  EXPECT_EQ(p.zero_paper_split.optimizer, 12);
  EXPECT_NE(p.recommendation.choice.strategy, S::kNoShard) << "112 GB of model state exceed 80 GB";
}

TEST(PlannerRecommend, InvalidInputsAreRejected) {
  fp::PlanInputs in = inputs(fp::gpt_model(fp::gpt_shape("nano", 8192)), 4, fp::Precision::kFp32);
  in.headroom = 1.0;
  EXPECT_THROW(fp::make_plan(in), fsdp::Error);
  in.headroom = 0.1;
  in.strategy = S::kHybridShard;
  in.hybrid_shard_group_size = 3;
  EXPECT_THROW(fp::make_plan(in), fsdp::Error);
  in.hybrid_shard_group_size = 0;
  in.rank = 4;
  EXPECT_THROW(fp::make_plan(in), fsdp::Error);
}

TEST(PlannerJson, PlanParsesAndCarriesEveryStrategy) {
  fp::PlanInputs in = inputs(llama("llama2-13b"), 64, fp::Precision::kBf16);
  in.ranks_per_node = 8;
  const fp::Plan p = fp::make_plan(in);
  const auto j = nlohmann::json::parse(fp::plan_to_json(p));
  EXPECT_EQ(j["model"]["num_params"].get<int64_t>(), 13'015'864'320);
  EXPECT_EQ(j["inputs"]["world_size"].get<int64_t>(), 64);
  EXPECT_EQ(j["bytes_per_param"]["engine"]["total"].get<double>(), 16.0);
  ASSERT_EQ(j["strategies"].size(), p.strategies.size());
  for (size_t i = 0; i < p.strategies.size(); ++i) {
    const auto& s = j["strategies"][i];
    EXPECT_EQ(s["label"].get<std::string>(), p.strategies[i].parallelism.label());
    EXPECT_EQ(s["peak"]["peak_bytes"].get<int64_t>(), p.strategies[i].peak.peak_bytes);
    EXPECT_EQ(s["model_state"]["total_bytes"].get<int64_t>(), p.strategies[i].state.total_bytes());
    EXPECT_DOUBLE_EQ(s["time"]["step_s"].get<double>(), p.strategies[i].time.step_s);
    EXPECT_EQ(s["traffic"]["all_gather"]["calls"].get<int64_t>(), p.strategies[i].traffic.all_gather.calls);
    EXPECT_EQ(s["fits"].get<bool>(), p.strategies[i].fits);
  }
  EXPECT_EQ(j["recommendation"]["kind"].get<std::string>(), fp::to_string(p.recommendation.kind));
  EXPECT_EQ(j["recommendation"]["reason"].get<std::string>(), p.recommendation.reason);
  EXPECT_EQ(j["profile"]["name"].get<std::string>(), "h100");
  const fp::ActivationModel act = fp::activation_model(in.model, in.step);
  EXPECT_EQ(j["activations"]["total_saved_bytes"].get<int64_t>(), act.total_saved_bytes);
  EXPECT_EQ(j["activations"]["block_bytes"].get<int64_t>(), act.block_bytes);
  EXPECT_GT(act.total_saved_bytes, 0);
}

TEST(PlannerProfile, BuiltinsRoundTripThroughJson) {
  for (const auto& name : fp::builtin_profile_names()) {
    const fp::DeviceProfile a = fp::builtin_profile(name);
    const fp::DeviceProfile b = fp::profile_from_json(fp::profile_to_json(a));
    EXPECT_EQ(b.name, name);
    EXPECT_EQ(b.memory_bytes, 80'000'000'000);
    EXPECT_EQ(b.ranks_per_node, 8);
    EXPECT_EQ(b.sources, a.sources);
    EXPECT_DOUBLE_EQ(b.matmul_flops_per_s_bf16, a.matmul_flops_per_s_bf16);
    EXPECT_DOUBLE_EQ(b.all_reduce.inter_node.bandwidth_bytes_per_s, a.all_reduce.inter_node.bandwidth_bytes_per_s);
    EXPECT_DOUBLE_EQ(b.step_update_s_per_elem_adamw, a.step_update_s_per_elem_adamw);
    EXPECT_DOUBLE_EQ(b.step_update_s_per_elem_sgd, a.step_update_s_per_elem_sgd);
    EXPECT_EQ(b.comm_overlaps_compute, a.comm_overlaps_compute);
    EXPECT_DOUBLE_EQ(b.memory_copy_bytes_per_s, a.memory_copy_bytes_per_s);
    EXPECT_DOUBLE_EQ(b.all_gather.shared_core_factor, 1.0);
    EXPECT_GT(a.step_update_s_per_elem_adamw, a.step_update_s_per_elem_sgd_momentum);
    EXPECT_FALSE(a.sources.empty());
  }
  EXPECT_DOUBLE_EQ(fp::builtin_profile("h100").matmul_flops_per_s_bf16, 989.5e12);
  EXPECT_DOUBLE_EQ(fp::builtin_profile("a100").matmul_flops_per_s_fp32, 19.5e12);
  EXPECT_DOUBLE_EQ(fp::builtin_profile("h100").memory_copy_bytes_per_s, 3.35e12);  // the HBM bandwidth
  // The shared-core factor round-trips; a profile written before it was measured reads as 1; a
  // profile without a copy rate is refused with the field named.
  {
    fp::DeviceProfile c = fp::builtin_profile("a100");
    c.reduce_scatter.shared_core_factor = 1.75;
    EXPECT_DOUBLE_EQ(fp::profile_from_json(fp::profile_to_json(c)).reduce_scatter.shared_core_factor, 1.75);
    nlohmann::json j = nlohmann::json::parse(fp::profile_to_json(c));
    j["collectives"]["reduce_scatter"].erase("shared_core_factor");
    EXPECT_DOUBLE_EQ(fp::profile_from_json(j.dump()).reduce_scatter.shared_core_factor, 1.0);
    j.erase("memory_copy_bytes_per_s");
    try {
      fp::profile_from_json(j.dump());
      ADD_FAILURE() << "a profile without memory_copy_bytes_per_s accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("memory_copy_bytes_per_s"), std::string::npos) << e.what();
    }
  }
  // compute_oversubscribed round-trips (absent: false); only there may a shared-core factor be
  // below 1, down to kMinOversubscribedFactor; it needs comm_overlaps_compute false.
  {
    fp::DeviceProfile c = fp::builtin_profile("a100");
    c.comm_overlaps_compute = false;
    c.compute_oversubscribed = true;
    c.reduce_scatter.shared_core_factor = 0.4;
    const fp::DeviceProfile d = fp::profile_from_json(fp::profile_to_json(c));
    EXPECT_TRUE(d.compute_oversubscribed);
    EXPECT_DOUBLE_EQ(d.reduce_scatter.shared_core_factor, 0.4);
    nlohmann::json j = nlohmann::json::parse(fp::profile_to_json(c));
    auto refused = [](const nlohmann::json& k, const std::string& field) {
      try {
        fp::profile_from_json(k.dump());
        ADD_FAILURE() << "accepted: " << k.dump();
      } catch (const fsdp::Error& e) {
        EXPECT_EQ(e.kind(), fsdp::ErrorKind::kCorruptData);
        EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      }
    };
    j["collectives"]["reduce_scatter"]["shared_core_factor"] = 0.05;
    refused(j, "reduce_scatter.shared_core_factor");
    j["collectives"]["reduce_scatter"]["shared_core_factor"] = 0.4;
    j["compute_oversubscribed"] = false;
    refused(j, "reduce_scatter.shared_core_factor");
    j.erase("compute_oversubscribed");
    refused(j, "reduce_scatter.shared_core_factor");
    j["collectives"]["reduce_scatter"]["shared_core_factor"] = 1.0;
    EXPECT_FALSE(fp::profile_from_json(j.dump()).compute_oversubscribed);
    j["compute_oversubscribed"] = true;
    j["comm_overlaps_compute"] = true;
    refused(j, "compute_oversubscribed");
  }
  try {
    fp::profile_from_json(R"({"name": "x", "memory_bytes": 1})");
    ADD_FAILURE() << "a profile without ranks_per_node accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kCorruptData);
    EXPECT_NE(std::string(e.what()).find("ranks_per_node"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fp::load_profile("/nonexistent/profile.json"), fsdp::Error);
}

// A calibrated step update: seconds per tensor by its size (interpolated, the fixed cost below the
// smallest point, the largest point's rate per element above it), through JSON, and bad points refused.
TEST(PlannerProfile, StepUpdatePointsPerTensor) {
  fp::DeviceProfile p = fp::builtin_profile("a100");
  const auto A = fp::OptimizerKind::kAdamW;
  EXPECT_DOUBLE_EQ(p.step_update_tensor_s(A, 1000), 1000 * p.step_update_s_per_elem_adamw);  // no points
  p.step_update_points_adamw = {{1000, 1e-5}, {2000, 3e-5}, {4000, 5e-5}};
  EXPECT_DOUBLE_EQ(p.step_update_tensor_s(A, 0), 0.0);
  EXPECT_DOUBLE_EQ(p.step_update_tensor_s(A, 500), 1e-5);
  EXPECT_DOUBLE_EQ(p.step_update_tensor_s(A, 1500), 2e-5);
  EXPECT_DOUBLE_EQ(p.step_update_tensor_s(A, 2000), 3e-5);
  EXPECT_DOUBLE_EQ(p.step_update_tensor_s(A, 3000), 4e-5);
  EXPECT_DOUBLE_EQ(p.step_update_tensor_s(A, 8000), 1e-4);
  EXPECT_DOUBLE_EQ(p.step_update_tensor_s(fp::OptimizerKind::kSgd, 1000), 1000 * p.step_update_s_per_elem_sgd);
  const fp::DeviceProfile q = fp::profile_from_json(fp::profile_to_json(p));
  ASSERT_EQ(q.step_update_points_adamw.size(), 3u);
  EXPECT_EQ(q.step_update_points_adamw[2].numel, 4000);
  EXPECT_DOUBLE_EQ(q.step_update_points_adamw[1].seconds, 3e-5);
  EXPECT_TRUE(q.step_update_points_sgd.empty());
  EXPECT_DOUBLE_EQ(q.step_update_tensor_s(A, 3000), 4e-5);
  nlohmann::json j = nlohmann::json::parse(fp::profile_to_json(p));
  for (const char* bad : {R"([[2000, 1e-5], [1000, 2e-5]])", R"([[0, 1e-5]])", R"([[1000, -1]])", R"([[1000]])",
                          R"([])", R"([[1000, 1e300]])", R"([[1e300, 1e-5]])", R"("abc")"}) {
    j["step_update_points_numel_seconds"]["adamw"] = nlohmann::json::parse(bad);
    try {
      fp::profile_from_json(j.dump());
      ADD_FAILURE() << "step update points " << bad << " accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kCorruptData);
      EXPECT_NE(std::string(e.what()).find("step_update_points_numel_seconds.adamw"), std::string::npos) << e.what();
    }
  }
  // Every figure is bounded (an edited file cannot overflow the time model), with the field named.
  for (const auto& [ptr, value, field_name] :
       std::vector<std::tuple<std::vector<std::string>, double, std::string>>{
           {{"memory_bytes"}, 1e300, "memory_bytes"},
           {{"step_update_s_per_elem", "adamw"}, 1e300, "step_update_s_per_elem.adamw"},
           {{"collectives", "all_gather", "intra_node", "alpha_s"}, 1e300, "all_gather.intra_node.alpha_s"},
           {{"model_flops_per_s", "fp32"}, 1e-300, "model_flops_per_s.fp32"},
           {{"matmul_flops_per_s", "bf16"}, 1e300, "matmul_flops_per_s.bf16"},
           {{"memory_copy_bytes_per_s"}, 1e-300, "memory_copy_bytes_per_s"},
           {{"memory_copy_bytes_per_s"}, 0.0, "memory_copy_bytes_per_s"},
           {{"collectives", "all_reduce", "shared_core_factor"}, 1e300, "all_reduce.shared_core_factor"},
           {{"collectives", "all_reduce", "shared_core_factor"}, -1.0, "all_reduce.shared_core_factor"},
           {{"collectives", "all_reduce", "shared_core_factor"}, 0.5, "all_reduce.shared_core_factor"},
           {{"memory_copy_bytes_per_s"}, -1e9, "memory_copy_bytes_per_s"},
           {{"memory_copy_bytes_per_s"}, 1e300, "memory_copy_bytes_per_s"}}) {
    nlohmann::json k = nlohmann::json::parse(fp::profile_to_json(fp::builtin_profile("a100")));
    nlohmann::json* at = &k;
    for (const auto& key : ptr) at = &(*at)[key];
    *at = value;
    try {
      fp::profile_from_json(k.dump());
      ADD_FAILURE() << field_name << " = " << value << " accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kCorruptData);
      EXPECT_NE(std::string(e.what()).find(field_name), std::string::npos) << e.what();
    }
  }
  try {
    fp::profile_from_json("[1, 2]");
    ADD_FAILURE() << "a JSON array accepted as a profile";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be a JSON object"), std::string::npos) << e.what();
  }
  // The time model charges each trainable tensor of the rank's shard once: with one fixed cost per
  // tensor, the update is that cost x the model's trainable tensors (every one has rows on rank 0).
  p.step_update_points_adamw = {{1, 2e-4}, {int64_t{1} << 40, 2e-4}};
  const fp::ModelSpec m = fp::gpt_model(fp::gpt_shape("micro", 8192));
  int64_t tensors = 0;
  for (const auto& u : m.units) {
    for (const auto& prm : u.params) tensors += prm.trainable ? 1 : 0;
  }
  EXPECT_GT(tensors, 20);
  fp::StepSetup st;
  for (S s : {S::kNoShard, S::kZero1, S::kFullShard}) {
    EXPECT_NEAR(fp::estimate_step_time(m, par(s, 8), st, p).update_s, 2e-4 * static_cast<double>(tensors), 1e-12)
        << fsdp::to_string(s);
  }
}

// A one-rank calibration measures no collective: its profile plans N = 1 and refuses more ranks.
TEST(PlannerProfile, OneRankCalibrationPlansOneRankOnly) {
  fp::DeviceProfile p = fp::builtin_profile("a100");
  p.has_collectives = false;
  p.calibration_world_size = 1;
  const fp::DeviceProfile q = fp::profile_from_json(fp::profile_to_json(p));
  EXPECT_FALSE(q.has_collectives);
  const fp::ModelSpec m = fp::gpt_model(fp::gpt_shape("micro", 8192));
  fp::StepSetup st;
  const fp::StepTime one = fp::estimate_step_time(m, par(S::kFullShard, 1), st, q);
  EXPECT_NEAR(one.step_s, one.compute_s + one.update_s + one.copy_s, 1e-12);
  try {
    fp::estimate_step_time(m, par(S::kFullShard, 2), st, q);
    ADD_FAILURE() << "a one-rank profile planned N = 2";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("calibrated on one rank"), std::string::npos) << e.what();
  }
  // "collectives": null belongs to a one-rank calibration only.
  p.calibration_world_size = 4;
  EXPECT_THROW(fp::profile_from_json(fp::profile_to_json(p)), fsdp::Error);
}

// A precision the profile has no rate for is refused (no other precision's rate stands in); one a
// calibration measured no model rate for is planned at its at::mm rate, with a note saying so.
TEST(PlannerProfile, APrecisionWithoutARateIsRefusedOrNoted) {
  const fp::ModelSpec micro = fp::gpt_model(fp::gpt_shape("micro", 8192), "micro");
  fp::PlanInputs in = inputs(micro, 2, fp::Precision::kFp16, "a100");
  EXPECT_TRUE(fp::make_plan(in).notes.empty());  // a datasheet profile with an fp16 rate
  in.profile.matmul_flops_per_s_fp16 = 0.0;
  try {
    fp::make_plan(in);
    ADD_FAILURE() << "fp16 planned without an fp16 rate";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no matmul rate for fp16"), std::string::npos) << e.what();
  }
  in.profile = fp::builtin_profile("a100");
  in.profile.model_flops_per_s_fp32 = 5e10;  // as a calibration measures: fp32 and bf16
  in.profile.model_flops_per_s_bf16 = 8e10;
  in.profile.calibration_world_size = 2;  // the plan's
  const fp::Plan fp16 = fp::make_plan(in);
  ASSERT_EQ(fp16.notes.size(), 1u);
  EXPECT_NE(fp16.notes[0].find("without a model rate for fp16"), std::string::npos) << fp16.notes[0];
  EXPECT_DOUBLE_EQ(fp16.strategies[0].time.compute_s,
                   fp::step_flops(micro, in.step) /
                       (in.profile.matmul_flops_per_s_fp16 *
                        in.profile.efficiency(fp::Precision::kFp16, micro.arch.n_embd)));
  in.step.precision = fp::Precision::kBf16;
  EXPECT_TRUE(fp::make_plan(in).notes.empty());
}

// A calibrated profile records its setup (world size, model, micro-batch x sequence length); a
// plan for another setup gets one note per difference, naming both; a datasheet profile, a
// matching setup and a profile written before the setup was recorded get none.
TEST(PlannerProfile, CalibratedSetupRoundTripsAndNotesAPlanForAnother) {
  const fp::ModelSpec micro = fp::gpt_model(fp::gpt_shape("micro", 8192), "micro");
  fp::PlanInputs in = inputs(micro, 2, fp::Precision::kFp32, "a100");
  in.step.micro_batch_size = 2;
  in.step.seq_len = 64;
  EXPECT_TRUE(fp::make_plan(in).notes.empty());  // datasheet profile
  in.profile.name = "cal";
  in.profile.calibration_world_size = 2;
  in.profile.calibration_model = "micro";
  in.profile.calibration_model_params = micro.num_params();
  in.profile.calibration_micro_batch_size = 2;
  in.profile.calibration_seq_len = 64;
  fp::CalibrationFit fit;
  fit.alpha_s = 1e-5;
  fit.beta_s_per_byte = 1e-9;
  in.profile.fits.assign(3, fit);
  const fp::DeviceProfile back = fp::profile_from_json(fp::profile_to_json(in.profile));
  EXPECT_EQ(back.calibration_model, "micro");
  EXPECT_EQ(back.calibration_model_params, micro.num_params());
  EXPECT_EQ(back.calibration_micro_batch_size, 2);
  EXPECT_EQ(back.calibration_seq_len, 64);
  in.profile = back;
  EXPECT_TRUE(fp::make_plan(in).notes.empty());  // the calibrated setup
  const auto has = [](const std::vector<std::string>& notes, const std::string& a, const std::string& b) {
    for (const auto& n : notes) {
      if (n.find(a) != std::string::npos && n.find(b) != std::string::npos) return true;
    }
    return false;
  };
  {
    fp::PlanInputs other = in;
    other.world_size = 4;
    other.step.micro_batch_size = 1;
    const std::vector<std::string> notes = fp::make_plan(other).notes;
    ASSERT_EQ(notes.size(), 2u);
    EXPECT_TRUE(has(notes, "world size 2", "for 4")) << notes[0];
    EXPECT_TRUE(has(notes, "micro-batch 2 x 64", "for 1 x 64")) << notes[1];
    EXPECT_NE(fp::plan_to_json(fp::make_plan(other)).find("world size 2"), std::string::npos);
  }
  {
    fp::PlanInputs other = in;  // the same preset name with other dimensions
    other.model = fp::gpt_model(fp::gpt_shape("micro", 4096), "micro");
    const std::vector<std::string> notes = fp::make_plan(other).notes;
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_TRUE(has(notes, fp::format_count(micro.num_params()), fp::format_count(other.model.num_params())))
        << notes[0];
    EXPECT_TRUE(has(notes, "(13,891,584 params)", "micro")) << notes[0];  // digits grouped in threes
    EXPECT_EQ(fp::format_count(-1234), "-1,234");
    EXPECT_EQ(fp::format_count(999), "999");
    EXPECT_EQ(fp::format_count(1000), "1,000");
  }
  {  // written before the setup was recorded: the world size only
    nlohmann::json j = nlohmann::json::parse(fp::profile_to_json(in.profile));
    for (const char* k : {"model", "model_params", "micro_batch_size", "seq_len"}) j["calibration"].erase(k);
    fp::PlanInputs old = in;
    old.profile = fp::profile_from_json(j.dump());
    EXPECT_TRUE(old.profile.calibration_model.empty());
    old.model = fp::gpt_model(fp::gpt_shape("nano", 8192), "nano");
    EXPECT_TRUE(fp::make_plan(old).notes.empty());
    old.world_size = 4;
    EXPECT_EQ(fp::make_plan(old).notes.size(), 1u);
    j["calibration"]["model"] = "micro";
    j["calibration"]["model_params"] = 1;
    j["calibration"]["seq_len"] = 64;
    j["calibration"]["micro_batch_size"] = 2.5;
    EXPECT_THROW(fp::profile_from_json(j.dump()), fsdp::Error);  // not cut to 2
    j["calibration"]["micro_batch_size"] = 2;
    j["calibration"]["model"] = "";
    EXPECT_THROW(fp::profile_from_json(j.dump()), fsdp::Error);
    j["calibration"].erase("model_params");
    j["calibration"]["model"] = "micro";  // a setup recorded in part is refused
    try {
      fp::profile_from_json(j.dump());
      ADD_FAILURE() << "a calibration.model without its model_params accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("calibration.model, .model_params, .micro_batch_size and .seq_len are all four or none, got 3"),
                std::string::npos) << e.what();
    }
  }
}

// What profile_from_json says of `j`: its error's text, or "accepted".
static std::string profile_message(const nlohmann::json& j) {
  try {
    fp::profile_from_json(j.dump());
  } catch (const fsdp::Error& e) {
    return e.what();
  }
  return "accepted";
}

// A bad field is named by its path in the file: a top-level field by its key alone.
TEST(PlannerProfile, ErrorsNameTheFieldsPath) {
  const auto& message = profile_message;
  const nlohmann::json good = nlohmann::json::parse(fp::profile_to_json(fp::builtin_profile("a100")));
  nlohmann::json j = good;
  j["memory_bytes"] = -1;
  EXPECT_NE(message(j).find("profile: memory_bytes must be a whole number in [0, 2^60] (bytes; 0: not known), got -1"),
            std::string::npos)
      << message(j);
  EXPECT_EQ(message(j).find("profile.memory_bytes"), std::string::npos) << message(j);
  j = good;
  j["ranks_per_node"] = "eight";
  EXPECT_NE(message(j).find("profile: ranks_per_node must be a whole number in [1, 2^20], got \"eight\""),
            std::string::npos)
      << message(j);
  j = good;
  j["collectives"]["all_gather"]["intra_node"]["alpha_s"] = -1;
  EXPECT_NE(message(j).find("profile: collectives.all_gather.intra_node.alpha_s must be in"), std::string::npos)
      << message(j);
  EXPECT_NE(message(nlohmann::json::array()).find("profile: the file must be a JSON object"), std::string::npos);
  j = good;
  j["ranks_per_node"] = 2.5;  // not cut to 2
  EXPECT_NE(message(j).find("profile: ranks_per_node must be a whole number in [1, 2^20], got 2.5"), std::string::npos)
      << message(j);
  // memory_bytes: whole bytes up to 2^60, the limit written as such; a whole number written with
  // an exponent is that number, a fraction is not.
  j = good;
  j["memory_bytes"] = 8.5e9;
  EXPECT_EQ(fp::profile_from_json(j.dump()).memory_bytes, 8'500'000'000);
  j["memory_bytes"] = 8.5;
  EXPECT_NE(message(j).find("profile: memory_bytes must be a whole number in [0, 2^60] (bytes; 0: not known), got 8.5"),
            std::string::npos)
      << message(j);
  j["memory_bytes"] = int64_t{1} << 61;
  EXPECT_NE(message(j).find(
                "profile: memory_bytes must be a whole number in [0, 2^60] (bytes; 0: not known), got 2305843009213693952"),
            std::string::npos)
      << message(j);
  // A wrong type is named in words, without the JSON library's own text.
  j = good;
  j["comm_overlaps_compute"] = "yes";
  EXPECT_NE(message(j).find("profile: comm_overlaps_compute must be true or false, got \"yes\""), std::string::npos)
      << message(j);
  j = good;
  j["collectives"]["all_gather"]["shared_core_factor"] = "high";
  EXPECT_NE(message(j).find("profile: collectives.all_gather.shared_core_factor must be a number, got \"high\""),
            std::string::npos)
      << message(j);
  EXPECT_EQ(message(j).find("json.exception"), std::string::npos) << message(j);
  j = good;
  j["description"] = nullptr;
  EXPECT_NE(message(j).find("profile: description must be a string, got null"), std::string::npos) << message(j);
  j = good;
  j["sources"] = "x";
  EXPECT_NE(message(j).find("profile: sources must be an array of strings, got \"x\""), std::string::npos)
      << message(j);
  // Past int64 is named as such, not wrapped to a negative number; 2^60 + 1 bytes is past the limit.
  j = good;
  j["memory_bytes"] = uint64_t{1} << 63;
  EXPECT_NE(message(j).find("profile: memory_bytes must be a whole number in [0, 2^60] (bytes; 0: not known), got "
                            "9223372036854775808"),
            std::string::npos)
      << message(j);
  j["memory_bytes"] = 1e300;
  EXPECT_NE(message(j).find("profile: memory_bytes must be a whole number in [0, 2^60] (bytes; 0: not known), got "),
            std::string::npos)
      << message(j);
  j["memory_bytes"] = (int64_t{1} << 60) + 1;
  EXPECT_NE(message(j).find("memory_bytes must be a whole number in [0, 2^60]"), std::string::npos) << message(j);
  j["memory_bytes"] = int64_t{1} << 60;
  EXPECT_EQ(message(j), "accepted");
  j = good;
  j.erase("matmul_flops_per_s");
  EXPECT_NE(message(j).find("profile: the file has no field 'matmul_flops_per_s'"), std::string::npos) << message(j);
  j = good;
  j.erase("collectives");
  EXPECT_NE(message(j).find("profile: the file has no field 'collectives'"), std::string::npos) << message(j);
  // Not JSON: the parser's words without its tag.
  const std::string bad = [] {
    try {
      fp::profile_from_json("{\"name\": ");
    } catch (const fsdp::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  }();
  EXPECT_NE(bad.find("profile: not JSON: parse error"), std::string::npos) << bad;
  EXPECT_EQ(bad.find("[json.exception"), std::string::npos) << bad;
}

TEST(PlannerProfile, CalibrationFitGivesBackTheCollectiveTimes) {
  using CK = fsdp::comm::CollectiveKind;
  // Synthetic measurements at N = 4: t = 30 us + bytes / 2 GB/s.
  std::vector<fp::CalibrationPoint> pts;
  for (int64_t b : {4096, 65536, 1 << 20, 16 << 20}) pts.push_back({b, 30e-6 + static_cast<double>(b) / 2e9});
  const fp::CalibrationFit fit = fp::fit_alpha_beta(pts);
  EXPECT_NEAR(fit.alpha_s, 30e-6, 1e-12);
  EXPECT_NEAR(fit.beta_s_per_byte, 0.5e-9, 1e-18);
  fp::DeviceProfile p = fp::builtin_profile("h100");
  p.nics_per_node = 0;  // as a calibrated profile: one ring, no fixed cost beyond the links
  p.collective_base_latency_s = 0;
  for (CK k : {CK::kAllGather, CK::kReduceScatter, CK::kAllReduce}) {
    const fp::LinkProfile l = fp::link_from_fit(k, fit, 4);
    p.all_gather = p.reduce_scatter = p.all_reduce = {l, l};
    EXPECT_NEAR(fp::collective_time_s(p, k, 1 << 20, 4, false), 30e-6 + (1 << 20) / 2e9, 1e-12) << fsdp::comm::to_string(k);
  }
  EXPECT_THROW(fp::fit_alpha_beta({{1, 1.0}}), fsdp::Error);
}

TEST(PlannerProfile, CalibratedPointsAreInterpolatedPerRingStep) {
  using CK = fsdp::comm::CollectiveKind;
  // A calibration at N = 4 with three points per kind, not on one line (a faster small-message
  // regime): within a node the time model follows the points, not the links.
  fp::DeviceProfile p = fp::builtin_profile("h100");
  p.calibration_world_size = 4;
  const std::vector<fp::CalibrationPoint> pts{{4096, 1e-4}, {1 << 20, 1e-3}, {16 << 20, 30e-3}};
  p.fits.assign(3, fp::CalibrationFit{});
  for (auto& f : p.fits) f.points = pts;
  for (CK k : {CK::kAllGather, CK::kReduceScatter, CK::kAllReduce}) {
    const std::string kind = fsdp::comm::to_string(k);
    // At the calibration's world size: the measured seconds, linear between them, the first
    // point's below it and the largest point's rate past it.
    EXPECT_DOUBLE_EQ(fp::collective_time_s(p, k, 1 << 20, 4, false), 1e-3) << kind;
    EXPECT_DOUBLE_EQ(fp::collective_time_s(p, k, 16 << 20, 4, false), 30e-3) << kind;
    EXPECT_NEAR(fp::collective_time_s(p, k, (17 << 20) / 2, 4, false), 1e-3 + 0.5 * 29e-3, 1e-15) << kind;
    EXPECT_DOUBLE_EQ(fp::collective_time_s(p, k, 100, 4, false), 1e-4) << kind;
    EXPECT_NEAR(fp::collective_time_s(p, k, 32 << 20, 4, false), 60e-3, 1e-15) << kind;
    // Crossing nodes: the links (one node measured).
    EXPECT_DOUBLE_EQ(fp::collective_time_s(p, k, 1 << 20, 16, true),
                     fp::collective_time_s(fp::builtin_profile("h100"), k, 1 << 20, 16, true))
        << kind;
  }
  // Another group size: per ring step against the bytes each rank holds (logical / ranks). At
  // N = 2 a 512 KiB all-gather holds 256 KiB per rank, as the 1 MiB point at N = 4, whose 3 steps
  // took 1 ms: one step, 1/3 ms. An all-reduce at N = 8 of 2 MiB: 14 steps of the 1 MiB point's
  // 6 steps.
  EXPECT_NEAR(fp::collective_time_s(p, CK::kAllGather, 1 << 19, 2, false), 1e-3 / 3, 1e-15);
  EXPECT_NEAR(fp::collective_time_s(p, CK::kAllReduce, 2 << 20, 8, false), 14 * 1e-3 / 6, 1e-15);
  // Seconds that fall with size (a noisy median) count as the running maximum: never cheaper than a
  // smaller message, never negative past the last point.
  {
    fp::DeviceProfile dip = p;
    dip.fits[1].points = {{4096, 1e-3}, {8192, 1e-2}, {16384, 1e-4}};
    EXPECT_DOUBLE_EQ(fp::collective_time_s(dip, CK::kReduceScatter, 16384, 4, false), 1e-2);
    EXPECT_NEAR(fp::collective_time_s(dip, CK::kReduceScatter, 12288, 4, false), 1e-2, 1e-15);
    EXPECT_NEAR(fp::collective_time_s(dip, CK::kReduceScatter, 1 << 20, 4, false), 1e-2 * 64, 1e-12);
    // A kind without points: every kind uses the links.
    dip.fits[0].points.clear();
    EXPECT_FALSE(dip.has_measured_points());
    EXPECT_DOUBLE_EQ(fp::collective_time_s(dip, CK::kReduceScatter, 1 << 20, 4, false),
                     fp::collective_time_s(fp::builtin_profile("h100"), CK::kReduceScatter, 1 << 20, 4, false));
  }
  // The points round-trip through the file; a bad point names its field.
  const nlohmann::json j = nlohmann::json::parse(fp::profile_to_json(p));
  EXPECT_DOUBLE_EQ(fp::collective_time_s(fp::profile_from_json(j.dump()), CK::kReduceScatter, 3 << 20, 4, false),
                   fp::collective_time_s(p, CK::kReduceScatter, 3 << 20, 4, false));
  for (const nlohmann::json& bad : {nlohmann::json::parse("[[4096, 1e-4], [4096, 2e-4]]"),
                                    nlohmann::json::parse("[[4096, -1], [8192, 1]]"),
                                    nlohmann::json::parse("[[4096.5, 1], [8192, 1]]"), nlohmann::json::parse("{}"),
                                    nlohmann::json::parse("[[4096, 1e-3]]")}) {
    nlohmann::json b = j;
    b["calibration"]["fits"]["reduce_scatter"]["points_bytes_seconds"] = bad;
    try {
      fp::profile_from_json(b.dump());
      ADD_FAILURE() << bad.dump() << " accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("profile: calibration.fits.reduce_scatter.points_bytes_seconds"),
                std::string::npos)
          << e.what();
      EXPECT_LT(std::string(e.what()).size(), 400u) << e.what();
    }
  }
  // A huge point is shown cut short.
  {
    nlohmann::json b = j;
    b["calibration"]["fits"]["reduce_scatter"]["points_bytes_seconds"] = {std::vector<int>(100000, 1)};
    try {
      fp::profile_from_json(b.dump());
      ADD_FAILURE() << "accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_LT(std::string(e.what()).size(), 400u);
    }
  }
  // The calibration's world size is bounded (the ring's step count stays exact).
  {
    nlohmann::json b = j;
    b["calibration"]["world_size"] = (int64_t{1} << 20) + 1;
    try {
      fp::profile_from_json(b.dump());
      ADD_FAILURE() << "accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("profile: calibration.world_size must be a whole number in [1, 2^20]"), std::string::npos)
          << e.what();
    }
  }
}

TEST(PlannerProfile, DurationFactorRoundTripsAndIsChecked) {
  fp::DeviceProfile p = fp::builtin_profile("a100");
  p.comm_overlaps_compute = false;
  p.compute_oversubscribed = true;
  p.reduce_scatter.duration_factor = 2.5;
  const nlohmann::json j = nlohmann::json::parse(fp::profile_to_json(p));
  EXPECT_DOUBLE_EQ(fp::profile_from_json(j.dump()).reduce_scatter.duration_factor, 2.5);
  EXPECT_DOUBLE_EQ(fp::profile_from_json(j.dump()).all_gather.duration_factor, 1.0);
  nlohmann::json old = j;  // written before it was measured: 1
  old["collectives"]["reduce_scatter"].erase("duration_factor");
  EXPECT_DOUBLE_EQ(fp::profile_from_json(old.dump()).reduce_scatter.duration_factor, 1.0);
  for (double bad : {0.5, 1001.0}) {
    nlohmann::json b = j;
    b["collectives"]["reduce_scatter"]["duration_factor"] = bad;
    try {
      fp::profile_from_json(b.dump());
      ADD_FAILURE() << bad << " accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("profile: collectives.reduce_scatter.duration_factor must be in [1, 1000]"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(PlannerProfile, UnknownKeysAreRejectedAtEveryLevelAndEachNumberHasOneRange) {
  const auto& message = profile_message;
  // A calibrated profile holds every level a file can have: calibration, its fits, their points,
  // the step update's points.
  fp::DeviceProfile p = fp::builtin_profile("a100");
  p.calibration_world_size = 2;
  p.calibration_model = "micro";
  p.calibration_model_params = 13891584;
  p.calibration_micro_batch_size = 2;
  p.calibration_seq_len = 64;
  p.fits.assign(3, fp::CalibrationFit{1e-5, 1e-9, {{4096, 1e-4}, {1 << 20, 1e-3}}});
  p.step_update_points_adamw = {{1024, 1e-5}, {1 << 20, 1e-3}};
  p.model_flops_per_s_fp32 = 5e10;
  p.clear_achieved_efficiency();  // as calibrated: no published figure
  const nlohmann::json good = nlohmann::json::parse(fp::profile_to_json(p));
  ASSERT_EQ(message(good), "accepted");
  // A misspelt key at each level is named with the level and the keys it may hold.
  const std::vector<std::pair<nlohmann::json::json_pointer, std::string>> levels = {
      {nlohmann::json::json_pointer(""), "profile: the file has an unknown field \"compute_efficency\" (known: name, "},
      {nlohmann::json::json_pointer("/matmul_flops_per_s"),
       "profile: matmul_flops_per_s has an unknown field \"compute_efficency\" (known: fp32, bf16, fp16)"},
      {nlohmann::json::json_pointer("/model_flops_per_s"), "profile: model_flops_per_s has an unknown field"},
      {nlohmann::json::json_pointer("/step_update_s_per_elem"),
       "profile: step_update_s_per_elem has an unknown field \"compute_efficency\" (known: adamw, sgd-momentum, sgd)"},
      {nlohmann::json::json_pointer("/step_update_points_numel_seconds"),
       "profile: step_update_points_numel_seconds has an unknown field"},
      {nlohmann::json::json_pointer("/collectives"), "profile: collectives has an unknown field"},
      {nlohmann::json::json_pointer("/collectives/reduce_scatter"),
       "profile: collectives.reduce_scatter has an unknown field \"compute_efficency\" (known: intra_node, inter_node, "
       "shared_core_factor, duration_factor)"},
      {nlohmann::json::json_pointer("/collectives/all_reduce/inter_node"),
       "profile: collectives.all_reduce.inter_node has an unknown field \"compute_efficency\" (known: alpha_s, "
       "bandwidth_bytes_per_s)"},
      {nlohmann::json::json_pointer("/calibration"), "profile: calibration has an unknown field"},
      {nlohmann::json::json_pointer("/calibration/fits"), "profile: calibration.fits has an unknown field"},
      {nlohmann::json::json_pointer("/calibration/fits/all_gather"),
       "profile: calibration.fits.all_gather has an unknown field \"compute_efficency\" (known: alpha_s, "
       "beta_s_per_byte, points_bytes_seconds)"},
  };
  for (const auto& [where, expected] : levels) {
    nlohmann::json j = good;
    ASSERT_TRUE(j.at(where).is_object()) << where.to_string();
    j.at(where)["compute_efficency"] = 0.5;
    EXPECT_NE(message(j).find(expected), std::string::npos) << where.to_string() << ": " << message(j);
  }
  // A long key is cut short in the message.
  {
    nlohmann::json j = good;
    j[std::string(10000, 'x')] = 1;
    EXPECT_LT(message(j).size(), 600u) << message(j).size();
  }
  // One range per number, the same words below and above it (0 and negative values alike).
  const auto range = [&](const std::string& ptr, double v) {
    nlohmann::json j = good;
    j.at(nlohmann::json::json_pointer(ptr)) = v;
    return message(j);
  };
  for (double v : {0.0, -1.0, 0.005, 1.5}) {
    EXPECT_NE(range("/compute_efficiency", v).find("profile: compute_efficiency must be in [0.01, 1], got "),
              std::string::npos)
        << v << ": " << range("/compute_efficiency", v);
  }
  EXPECT_EQ(range("/compute_efficiency", fp::kMinComputeEfficiency), "accepted");
  for (double v : {0.0, -1.0, 0.5, 2e18}) {
    EXPECT_NE(range("/collectives/all_gather/intra_node/bandwidth_bytes_per_s", v)
                  .find("profile: collectives.all_gather.intra_node.bandwidth_bytes_per_s must be in [1, 1e+18], got "),
              std::string::npos)
        << v << ": " << range("/collectives/all_gather/intra_node/bandwidth_bytes_per_s", v);
    EXPECT_NE(range("/matmul_flops_per_s/fp32", v).find("profile: matmul_flops_per_s.fp32 must be in [1, 1e+18], got "),
              std::string::npos)
        << v << ": " << range("/matmul_flops_per_s/fp32", v);
  }
  for (double v : {-1.0, 0.5, 2e18}) {
    EXPECT_NE(range("/model_flops_per_s/bf16", v)
                  .find("profile: model_flops_per_s.bf16 must be 0 (not measured) or in [1, 1e+18], got "),
              std::string::npos)
        << v << ": " << range("/model_flops_per_s/bf16", v);
  }
  EXPECT_EQ(range("/model_flops_per_s/bf16", 0.0), "accepted");
  for (int64_t v : {int64_t{0}, int64_t{-3}, (int64_t{1} << 20) + 1}) {
    nlohmann::json j = good;
    j["ranks_per_node"] = v;
    EXPECT_NE(message(j).find("profile: ranks_per_node must be a whole number in [1, 2^20], got " + std::to_string(v)),
              std::string::npos)
        << message(j);
  }
  EXPECT_NE(range("/calibration/fits/reduce_scatter/beta_s_per_byte", -1.0)
                .find("profile: calibration.fits.reduce_scatter.beta_s_per_byte must be in [0, 3600], got -1.0"),
            std::string::npos)
      << range("/calibration/fits/reduce_scatter/beta_s_per_byte", -1.0);
  // The value as the file writes it, not rounded to 6 digits (which would print "got 1" for a value past 1).
  EXPECT_NE(range("/compute_efficiency", 1.0000001).find("must be in [0.01, 1], got 1.0000001"), std::string::npos)
      << range("/compute_efficiency", 1.0000001);
  // A key twice in one object: the library would keep the last without a word.
  {
    std::string text = good.dump();
    text.insert(1, "\"compute_efficiency\": 0.5, ");
    text.insert(1, "\"compute_efficiency\": 0.5, ");
    try {
      fp::profile_from_json(text);
      ADD_FAILURE() << "a key twice accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("profile: the key \"compute_efficiency\" appears twice in one object"),
                std::string::npos)
          << e.what();
    }
  }
  // The calibrated setup: all four keys or none; the three numbers checked whichever is missing.
  {
    nlohmann::json j = good;
    j["calibration"].erase("model");
    j["calibration"]["seq_len"] = -5;
    EXPECT_NE(message(j).find("profile: calibration.model, .model_params, .micro_batch_size and .seq_len are all four "
                              "or none, got 3"),
              std::string::npos)
        << message(j);
    j = good;
    j["calibration"]["seq_len"] = -5;
    EXPECT_NE(message(j).find("profile: calibration.seq_len must be a whole number in [1, 2^50], got -5"),
              std::string::npos)
        << message(j);
  }
  // A one-rank calibration ("collectives": null) holds no fits, so none can hide in it.
  {
    nlohmann::json j = good;
    j["collectives"] = nullptr;
    j["calibration"]["world_size"] = 1;
    EXPECT_NE(message(j).find("profile: calibration.fits is for a calibration of 2 or more ranks"), std::string::npos)
        << message(j);
    j["calibration"].erase("fits");
    EXPECT_EQ(message(j), "accepted");
  }
}

TEST(PlannerUnits, ParseLinkRates) {
  EXPECT_DOUBLE_EQ(fp::parse_link_rate_bytes_per_s("200Mbit"), 25e6);
  EXPECT_DOUBLE_EQ(fp::parse_link_rate_bytes_per_s("10Gbit/s"), 1.25e9);
  EXPECT_DOUBLE_EQ(fp::parse_link_rate_bytes_per_s("25 Gbps"), 3.125e9);
  EXPECT_DOUBLE_EQ(fp::parse_link_rate_bytes_per_s("1e3kbit"), 125e3);
  EXPECT_DOUBLE_EQ(fp::parse_link_rate_bytes_per_s("3GB/s"), 3e9);
  EXPECT_DOUBLE_EQ(fp::parse_link_rate_bytes_per_s("500mb/s"), 5e8);
  for (const char* bad : {"", "Gbit", "200", "200MB", "200Xbit", "0Gbit", "-1Gbit", "inf Gbit"}) {
    try {
      fp::parse_link_rate_bytes_per_s(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument);
    }
  }
}

TEST(PlannerUnits, ParseAndFormatBytes) {
  EXPECT_EQ(fp::parse_bytes("80GB"), 80'000'000'000);
  EXPECT_EQ(fp::parse_bytes("80GiB"), 80LL << 30);
  EXPECT_EQ(fp::parse_bytes("512 MiB"), 512LL << 20);
  EXPECT_EQ(fp::parse_bytes("1.5TB"), 1'500'000'000'000);
  EXPECT_EQ(fp::parse_bytes("1e9"), 1'000'000'000);
  EXPECT_EQ(fp::parse_bytes("123"), 123);
  for (const char* bad : {"", "GB", "80XB", "-1GB"}) {
    try {
      fp::parse_bytes(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument);
    }
  }
  EXPECT_EQ(fp::format_bytes(112e9), "112.0 GB");
  EXPECT_EQ(fp::format_bytes(14e9), "14.0 GB");
}
