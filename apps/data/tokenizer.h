// Tokenizer: a SentencePiece model (scripts/prepare_data.sh trains one) with newline handling.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace apps::data {

/// Wraps a SentencePiece processor. SentencePiece drops newlines (it encodes one sentence at a
/// time), so encode() splits the text at '\n', encodes each line, and joins the lines with the id
/// of the user symbol "<n>", or for a byte-fallback model without it (Llama-2's tokenizer.model)
/// of the newline byte's piece "<0x0A>"; decode() turns that id back into '\n'. A model with
/// neither encodes lines back to back (newlines are lost). The symbol "<|endoftext|>" marks document ends.
/// Thread-safe after construction (all methods are const).
class Tokenizer {
 public:
  /// Loads a .model file. Throws std::runtime_error if it cannot be read.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  /// Token ids of UTF-8 text, each in [0, vocab_size()).
  std::vector<int32_t> encode(const std::string& text) const;
  /// Text of ids; ids outside [0, vocab_size()) throw std::out_of_range.
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const { return vocab_size_; }
  /// Id of "<|endoftext|>", or -1 if the model has no such piece.
  int32_t eos_id() const { return eos_id_; }
  /// Id of "<n>" (else "<0x0A>"), or -1.
  int32_t newline_id() const { return newline_id_; }
  const std::string& model_path() const { return model_path_; }
  /// FNV-1a hash of the model file's bytes (identifies the model in token caches).
  uint64_t model_hash() const { return model_hash_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string model_path_;
  uint64_t model_hash_ = 0;
  int32_t vocab_size_ = 0;
  int32_t eos_id_ = -1;
  int32_t newline_id_ = -1;
};

}  // namespace apps::data
