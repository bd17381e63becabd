// Tier `unit`: dim-0 shard layout math, exhaustively over small shapes and world sizes.
#include <gtest/gtest.h>

#include "fsdp/common/check.h"
#include "fsdp/shard/layout.h"

using fsdp::shard::FlatLayout;
using fsdp::shard::ParamShardSpec;

TEST(ShardLayout, RowsPartitionExactlyForAllSmallCases) {
  for (int64_t world = 1; world <= 9; ++world) {
    for (int64_t d0 = 0; d0 <= 23; ++d0) {
      auto s = ParamShardSpec::make({d0, 3}, world);
      EXPECT_EQ(s.rows_per_rank, (d0 + world - 1) / world);
      int64_t covered = 0;
      for (int64_t r = 0; r < world; ++r) {
        EXPECT_EQ(s.row_offset(r), std::min(r * s.rows_per_rank, d0)) << "d0=" << d0 << " N=" << world;
        EXPECT_GE(s.real_rows(r), 0);
        EXPECT_LE(s.real_rows(r), s.rows_per_rank);
        // contiguous, in rank order
        EXPECT_EQ(s.row_offset(r), covered) << "d0=" << d0 << " N=" << world << " r=" << r;
        covered += s.real_rows(r);
      }
      EXPECT_EQ(covered, d0);
      EXPECT_EQ(s.padded_numel(), world * s.rows_per_rank * 3);
      EXPECT_GE(s.padded_numel(), s.numel());
      // padding is less than one row per rank
      EXPECT_LT(world * s.rows_per_rank - d0, world) << "d0=" << d0 << " N=" << world;
    }
  }
}

TEST(ShardLayout, KnownCases) {
  // 13 rows on 4 ranks: 4,4,4,1 (padding 3 rows on rank 3)
  auto s = ParamShardSpec::make({13, 19}, 4);
  EXPECT_EQ(s.rows_per_rank, 4);
  EXPECT_EQ(s.real_rows(3), 1);
  EXPECT_EQ(s.padded_shard_numel(), 4 * 19);
  // 2 rows (Linear(2,1).weight is [1,2]: 1 row) on 4 ranks: ranks 1..3 empty
  auto w = ParamShardSpec::make({1, 2}, 4);
  EXPECT_EQ(w.rows_per_rank, 1);
  EXPECT_EQ(w.real_rows(0), 1);
  EXPECT_EQ(w.real_rows(1), 0);
  EXPECT_EQ(w.real_rows(3), 0);
  EXPECT_EQ(w.row_offset(3), 1);
  // 5-element vector on 4 ranks: 2,2,1,0
  auto v = ParamShardSpec::make({5}, 4);
  EXPECT_EQ(v.rows_per_rank, 2);
  EXPECT_EQ(v.real_rows(2), 1);
  EXPECT_EQ(v.real_rows(3), 0);
  // 0-dim parameter: one row of one element
  auto z = ParamShardSpec::make({}, 3);
  EXPECT_EQ(z.dim0, 1);
  EXPECT_EQ(z.row_numel, 1);
  EXPECT_EQ(z.real_rows(0), 1);
  EXPECT_EQ(z.real_rows(1), 0);
}

TEST(ShardLayout, FlatLayoutOffsetsAndTotals) {
  auto l = FlatLayout::make({{13, 19}, {19}, {3, 19}, {3}}, 4);
  ASSERT_EQ(l.params.size(), 4u);
  EXPECT_EQ(l.offsets[0], 0);
  EXPECT_EQ(l.offsets[1], 4 * 19);
  EXPECT_EQ(l.offsets[2], 4 * 19 + 5);
  EXPECT_EQ(l.offsets[3], 4 * 19 + 5 + 19);
  EXPECT_EQ(l.shard_numel(), 4 * 19 + 5 + 19 + 1);
  EXPECT_EQ(l.total_numel(), 4 * l.shard_numel());
  EXPECT_EQ(l.real_numel(), 247 + 19 + 57 + 3);
}

TEST(ShardLayout, RejectsBadInput) {
  EXPECT_THROW(ParamShardSpec::make({3}, 0), fsdp::Error);
  EXPECT_THROW(ParamShardSpec::make({-1}, 2), fsdp::Error);
}
