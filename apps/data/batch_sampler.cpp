#include "data/batch_sampler.h"

#include <ATen/ops/empty.h>

#include <numeric>
#include <stdexcept>
#include <string>

namespace apps::data {

namespace {
// SplitMix64: a tiny, portable, well-mixed generator (Steele et al. 2014).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) by rejection (no modulo bias).
  uint64_t below(uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do r = next(); while (r >= limit);
    return r % n;
  }
};
}  // namespace

DistributedBatchSampler::DistributedBatchSampler(std::shared_ptr<const TokenDataset> data,
                                                 int64_t global_batch_size, int64_t seq_len,
                                                 int rank, int world_size, uint64_t seed)
    : data_(std::move(data)),
      global_batch_size_(global_batch_size),
      seq_len_(seq_len),
      rank_(rank),
      world_size_(world_size),
      seed_(seed) {
  if (!data_) throw std::invalid_argument("sampler: null dataset");
  if (global_batch_size <= 0 || seq_len <= 0 || world_size <= 0) {
    throw std::invalid_argument("sampler: global batch size (" + std::to_string(global_batch_size) +
                                "), seq len (" + std::to_string(seq_len) + ") and world size (" +
                                std::to_string(world_size) + ") must be positive");
  }
  if (global_batch_size % world_size != 0) {
    throw std::invalid_argument("sampler: global batch size " + std::to_string(global_batch_size) +
                                " is not divisible by the world size " +
                                std::to_string(world_size) + " (every rank takes G/N sequences)");
  }
  if (rank < 0 || rank >= world_size) {
    throw std::invalid_argument("sampler: rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(world_size) + ")");
  }
  const int64_t n = data_->size();
  if (n < 2 * seq_len + 1) {
    throw std::invalid_argument("sampler: dataset of " + std::to_string(n) +
                                " tokens is too small for seq len " + std::to_string(seq_len) +
                                " (needs at least 2*T + 1 tokens)");
  }
  train_windows_ = n / seq_len - 1;
  eval_windows_ = (n - 1) / seq_len;
}

int64_t DistributedBatchSampler::train_offset(int64_t stream_index) {
  const int64_t epoch = stream_index / train_windows_;
  if (epoch != cached_epoch_) {
    SplitMix64 rng{seed_ ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(epoch + 1))};
    cached_shift_ = static_cast<int64_t>(rng.below(static_cast<uint64_t>(seq_len_)));
    cached_perm_.resize(train_windows_);
    std::iota(cached_perm_.begin(), cached_perm_.end(), 0);
    for (int64_t i = train_windows_ - 1; i > 0; --i) {
      int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
      std::swap(cached_perm_[i], cached_perm_[j]);
    }
    cached_epoch_ = epoch;
  }
  return cached_shift_ + cached_perm_[stream_index % train_windows_] * seq_len_;
}

std::vector<int64_t> DistributedBatchSampler::global_train_offsets(int64_t step) {
  if (step < 0) throw std::invalid_argument("sampler: negative step " + std::to_string(step));
  std::vector<int64_t> offsets(global_batch_size_);
  for (int64_t j = 0; j < global_batch_size_; ++j) {
    offsets[j] = train_offset(step * global_batch_size_ + j);
  }
  return offsets;
}

at::Tensor DistributedBatchSampler::gather_rows(const std::vector<int64_t>& offsets) const {
  const int64_t rows = static_cast<int64_t>(offsets.size());
  at::Tensor out = at::empty({rows, seq_len_ + 1}, at::TensorOptions().dtype(at::kLong));
  int64_t* dst = out.data_ptr<int64_t>();
  const int32_t* src = data_->data();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t t = 0; t <= seq_len_; ++t) dst[i * (seq_len_ + 1) + t] = src[offsets[i] + t];
  }
  return out;
}

at::Tensor DistributedBatchSampler::train_batch(int64_t step) {
  if (step < 0) throw std::invalid_argument("sampler: negative step " + std::to_string(step));
  const int64_t rows = rows_per_rank();
  std::vector<int64_t> offsets(rows);
  for (int64_t i = 0; i < rows; ++i) {
    offsets[i] = train_offset(step * global_batch_size_ + rank_ * rows + i);
  }
  return gather_rows(offsets);
}

at::Tensor DistributedBatchSampler::eval_batch(int64_t index) const {
  if (index < 0) throw std::invalid_argument("sampler: negative eval batch " + std::to_string(index));
  const int64_t rows = rows_per_rank();
  std::vector<int64_t> offsets(rows);
  for (int64_t i = 0; i < rows; ++i) {
    offsets[i] = ((index * global_batch_size_ + rank_ * rows + i) % eval_windows_) * seq_len_;
  }
  return gather_rows(offsets);
}

}  // namespace apps::data
