// DistributedBatchSampler: the same global batches at every world size, each rank taking its rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "data/token_dataset.h"

namespace apps::data {

/// Splits a TokenDataset into windows of seq_len + 1 tokens (input + shifted target) and serves
/// global batches of global_batch_size windows, rank r getting rows [r*G/N, (r+1)*G/N).
///
/// Training order: the stream of windows is a sequence of epochs; epoch e starts at a shift
/// u_e in [0, T) (windows [u_e + i*T, u_e + i*T + T + 1), i < W = n/T - 1) visited in a random
/// permutation of the W windows. u_e and the permutation are functions of (seed, e) only (SplitMix64
/// and Fisher-Yates, no std:: distributions, so they are the same on every platform). Global batch s
/// is windows s*G .. s*G + G - 1 of that stream. Hence the concatenation over ranks in rank order of
/// train_batch(s) is the same tensor for every world size N dividing G (runs at different N see the
/// same data), and every window is seen once per epoch.
/// Evaluation order: eval_batch(b) takes the non-overlapping windows [i*T, i*T + T + 1) in file order,
/// i = (b*G + j) mod W_eval, W_eval = (n - 1)/T: fixed, unshuffled, also independent of N.
/// Not thread-safe (caches the current epoch's permutation).
class DistributedBatchSampler {
 public:
  /// Throws std::invalid_argument if global_batch_size % world_size != 0 (naming both), if a size is
  /// not positive, if rank is outside [0, world_size), or if the dataset has fewer than 2*T + 1
  /// tokens.
  DistributedBatchSampler(std::shared_ptr<const TokenDataset> data, int64_t global_batch_size,
                          int64_t seq_len, int rank, int world_size, uint64_t seed);

  /// This rank's rows of global training batch `step` (0-based): int64 tensor (G/N, T+1).
  at::Tensor train_batch(int64_t step);
  /// This rank's rows of validation batch `index` (0-based): int64 tensor (G/N, T+1).
  at::Tensor eval_batch(int64_t index) const;

  /// Start offsets (in tokens) of the G windows of global training batch `step`, in row order.
  std::vector<int64_t> global_train_offsets(int64_t step);

  int64_t rows_per_rank() const { return global_batch_size_ / world_size_; }
  int64_t global_batch_size() const { return global_batch_size_; }
  int64_t seq_len() const { return seq_len_; }
  /// Windows per training epoch (W) and in the evaluation order (W_eval).
  int64_t train_windows() const { return train_windows_; }
  int64_t eval_windows() const { return eval_windows_; }

 private:
  int64_t train_offset(int64_t stream_index);
  at::Tensor gather_rows(const std::vector<int64_t>& offsets) const;

  std::shared_ptr<const TokenDataset> data_;
  int64_t global_batch_size_;
  int64_t seq_len_;
  int rank_;
  int world_size_;
  uint64_t seed_;
  int64_t train_windows_;
  int64_t eval_windows_;
  int64_t cached_epoch_ = -1;
  int64_t cached_shift_ = 0;
  std::vector<int64_t> cached_perm_;  // (W,) window order of cached_epoch_
};

}  // namespace apps::data
