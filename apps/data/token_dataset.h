// TokenDataset: the token ids of one text file, tokenized once and cached beside it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace apps::data {

/// A read-only sequence of token ids in memory (int32, each in [0, vocab)).
class TokenDataset {
 public:
  TokenDataset() = default;
  explicit TokenDataset(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}

  /// Tokens of text_path (see Tokenizer::encode; the whole file is one text). The first call
  /// tokenizes and writes cache_path(text_path, tokenizer); later calls read that file when its
  /// header still matches (version, source size and mtime, tokenizer hash, its own size), its bytes
  /// their checksum (fsdp::fnv1a64 of the header and the ids) and its ids the vocabulary, and
  /// rebuild it otherwise: every id read back is checked. The cache holds uint16 ids when the
  /// vocabulary fits (else int32) after a 56-byte header, and is written to a temporary file then
  /// renamed, so concurrent builders never see a partial file. *built (optional) tells whether
  /// this call tokenized; *why_built (optional) why the cache was not used ("absent", "its header
  /// or ids do not match their checksum", ...). A cache that cannot be written (a read-only or
  /// full disk) leaves nothing behind; with cache_error given the tokens are returned anyway and
  /// *cache_error says why ("cannot write '<tmp>': No space left on device"), else it throws.
  /// Throws std::runtime_error on I/O errors reading the text.
  static TokenDataset load_or_build(const std::string& text_path, const Tokenizer& tokenizer,
                                    bool* built = nullptr, std::string* why_built = nullptr,
                                    std::string* cache_error = nullptr);
  /// "<text_path>.<model file stem>.tok", e.g. data/corpus/train.txt.spm_8192.tok.
  static std::string cache_path(const std::string& text_path, const Tokenizer& tokenizer);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const int32_t* data() const { return tokens_.data(); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  /// Tokens [begin, end) as a new dataset.
  TokenDataset slice(int64_t begin, int64_t end) const;

 private:
  std::vector<int32_t> tokens_;
};

}  // namespace apps::data
