#include "data/tokenizer.h"
#include "fsdp/common/hash.h"

#include <sentencepiece_processor.h>

#include <fstream>
#include <iterator>
#include <stdexcept>

namespace apps::data {

namespace {
int32_t piece_id_or_minus_one(const sentencepiece::SentencePieceProcessor& sp, const char* piece) {
  int id = sp.PieceToId(piece);
  return (id == sp.unk_id() || sp.IdToPiece(id) != piece) ? -1 : id;
}
}  // namespace

Tokenizer::Tokenizer(const std::string& model_path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), model_path_(model_path) {
  std::ifstream in(model_path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("tokenizer: cannot open SentencePiece model '" + model_path +
                             "' (run scripts/prepare_data.sh to train one)");
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  model_hash_ = fsdp::fnv1a64(bytes);
  auto status = sp_->LoadFromSerializedProto(bytes);
  if (!status.ok()) {
    throw std::runtime_error("tokenizer: cannot load SentencePiece model '" + model_path +
                             "': " + status.ToString());
  }
  vocab_size_ = sp_->GetPieceSize();
  eos_id_ = piece_id_or_minus_one(*sp_, "<|endoftext|>");
  newline_id_ = piece_id_or_minus_one(*sp_, "<n>");
  // A byte-fallback model (Llama-2's tokenizer.model) has a piece for the newline byte.
  if (newline_id_ < 0) newline_id_ = piece_id_or_minus_one(*sp_, "<0x0A>");
}

Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int32_t> out;
  std::vector<int> ids;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    bool last = end == std::string::npos;
    if (last) end = text.size();
    if (end > begin) {
      auto status = sp_->Encode(absl::string_view(text.data() + begin, end - begin), &ids);
      if (!status.ok()) throw std::runtime_error("tokenizer: encode failed: " + status.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (last) break;
    if (newline_id_ >= 0) out.push_back(newline_id_);
    begin = end + 1;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    std::string piece;
    auto status = sp_->Decode(run, &piece);
    if (!status.ok()) throw std::runtime_error("tokenizer: decode failed: " + status.ToString());
    out += piece;
    run.clear();
  };
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) {
      throw std::out_of_range("tokenizer: id " + std::to_string(id) + " outside [0, " +
                              std::to_string(vocab_size_) + ")");
    }
    if (id == newline_id_) {
      flush();
      out += '\n';
    } else {
      run.push_back(id);
    }
  }
  flush();
  return out;
}

}  // namespace apps::data
