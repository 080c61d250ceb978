#!/usr/bin/env bash
# Bring your own data: train and evaluate on a folder of audio files with transcripts.
#
#   bash recipes/folder/run.sh --data-dir DIR [--dev-fraction F] [--test-fraction F] [--seed N]
#                              [--split-file FILE] [--tokenizer char|bpe|unigram]
#                              [--vocab-size N] [--config FILE] [--stage N] [--stop-stage M]
#                              [--data DIR] [--exp DIR] [--force] [--beam-size N]
#                              [--ctc-weight W] [--average N] [--init MODEL]
#                              [-- ASR-FIT-OPTIONS...]
#
# DIR holds audio files (.wav .flac .sph .ogg .mp3 .m4a ..., any format asr transcribe reads,
# at any rate, in any subfolders), each with a same-stem transcript beside it:
# speaker1/utt01.wav + speaker1/utt01.txt. Utterance ids are the relative paths
# (speaker1-utt01), speakers the folder paths (speaker1).
#
#   1  prepare manifests       data/folder/{train,dev,test}.jsonl: a random split (dev and test
#                              fractions 0.1, seed 0), or --split-file: lines
#                              `<utterance-id> train|dev|test` covering every utterance
#   2  train the tokenizer     data/folder/tokenizer/ (BPE 128, as the config needs; for
#                              minutes of audio, --tokenizer char with a 4x config)
#   3  CMVN statistics         data/folder/cmvn.json (through the config's level and features)
#   4  train                   exp/folder/<config>/        (resumes from last.ckpt if present)
#   5  average checkpoints     exp/folder/<config>/avg.ckpt (best 5 as the config keeps them),
#                              finished on dev (asr finalize)
#   6  decode dev and test     exp/folder/<config>/decode_{dev,test}/ (test only if it has data)
#   7  results table           exp/folder/<config>/RESULTS.md, printed
#
# --config: default conf/folder/conformer.yaml (the Conformer that learns most from a few
# hours of speech on a CPU). --init MODEL fine-tunes a trained recognizer (a checkpoint, a package folder or
# hf://owner/name) instead of training from scratch: what matches is copied, a different
# vocabulary's output layers are remapped, and the log lists what was re-initialised; the
# config must describe the same model (e.g. the one it was trained with). Use a new --data
# (and --exp) for another folder. A finished stage leaves a marker
# (<out>/.done-<stage>) and is skipped when re-run; --force re-runs it. A stage that failed
# halfway left no marker, so it simply runs again. Options after `--` go to `asr fit`, e.g.
# -- --trainer.max_epochs 30 --trainer.accelerator gpu.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=recipes/lib/stages.sh
source "$here/../lib/stages.sh"

data_dir=""
data=data/folder
exp=exp/folder
config=conf/folder/conformer.yaml
dev_fraction=0.1
test_fraction=0.1
seed=0
split_file=""
tokenizer_kind=bpe
vocab_size=128
init=()

recipe_option() {
  case "$1" in
    --dev-fraction) need_weight "$@"; dev_fraction=$(canonical_number "$2"); consumed=2 ;;
    --test-fraction) need_weight "$@"; test_fraction=$(canonical_number "$2"); consumed=2 ;;
    --seed) need_value "$@"; need_digits "$@"; seed=$(canonical_number "$2"); consumed=2 ;;
    --split-file) need_value "$@"; split_file=$(absolute "$2"); consumed=2 ;;
    --tokenizer)
      need_value "$@"; need_choice "$1" "$2" char bpe unigram; tokenizer_kind=$2; consumed=2 ;;
    --vocab-size) need_positive "$@"; vocab_size=$((10#$2)); vocab_given=$1; consumed=2 ;;
    --config) need_value "$@"; config=$(config_path "$2"); consumed=2 ;;
    --init)
      need_value "$@"
      model=$2
      [[ $model == hf://* ]] || model=$(absolute "$model")
      init=(--model.init_args.init_from "$model")
      consumed=2 ;;
  esac
}
vocab_given=""
parse_options "$@"
need_sized_tokenizer

cd "$root"
require_asr
model_dir=$exp/$(basename "$config" .yaml)
# A fine-tune that started resumes from its own checkpoints: its initial model may be gone;
# forced to train again (its checkpoints removed first), it needs that model.
forced_fit=false
if [ "$force" = true ] && [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then forced_fit=true; fi
if [ ${#init[@]} -gt 0 ] && [[ ${init[1]} != hf://* ]] && [ ! -e "${init[1]}" ] &&
  { [ "$forced_fit" = true ] ||
    { [ ! -e "$model_dir/checkpoints/last.ckpt" ] && [ ! -e "$model_dir/.done-4" ]; }; }; then
  usage_error "--init ${init[1]}: no such checkpoint or package"
fi
[ -n "$data_dir" ] || usage_error "--data-dir DIR is required: your folder of audio + .txt files"
[ -d "$data_dir" ] || usage_error "--data-dir $data_dir is not a directory"
mkdir -p "$data"

# The random split's fractions and seed, or the split file, go to asr.data.prepare directly;
# given as arguments, they are the stage's record: another split is another stage 1.
prepare() {
  $(asr_python) - "$@" <<'PY'
import logging
import sys

from asr.data.prepare import prepare_folder

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
data_dir, out, dev, test, seed, split_file = sys.argv[1:]
try:
    summaries = prepare_folder(data_dir, out, float(dev), float(test), int(seed), split_file or None)
except ValueError as error:
    sys.exit(f"prepare folder: error: {error}")
for needed in ("train", "dev"):
    if needed not in summaries:
        sys.exit(f"prepare folder: no {needed} utterances: use more data, a larger fraction "
                 "or a split file with train and dev lines")
PY
}
stage_older="prepare manifests: prepare" run_stage 1 "prepare manifests" "$data" \
  prepare "$data_dir" "$data" "$dev_fraction" "$test_fraction" "$seed" "$split_file"

tokenizer_options=(--kind "$tokenizer_kind")
[ "$tokenizer_kind" = char ] || tokenizer_options+=(--vocab-size "$vocab_size")
run_stage 2 "tokenizer" "$data" \
  asr tokenizer --manifest "$data/train.jsonl" "${tokenizer_options[@]}" --out "$data/tokenizer"
cmvn_dir=$(cmvn_dir "$config" "$data")
cmvn_stage 3 "$config" "$cmvn_dir" --manifest "$data/train.jsonl"

splits=(dev)
test_manifest=()
if [ -f "$data/test.jsonl" ]; then
  splits+=(test)
  test_manifest=(--data.test_manifest "$data/test.jsonl")
fi
fit_stage 4 "$config" "$model_dir" \
  --data.train_manifest "$data/train.jsonl" --data.val_manifest "$data/dev.jsonl" \
  ${test_manifest[@]+"${test_manifest[@]}"} --data.tokenizer "$data/tokenizer" \
  --model.init_args.frontend.init_args.normalize.init_args.stats_path "$cmvn_dir/cmvn.json" \
  ${init[@]+"${init[@]}"}
average_stage 5 "$model_dir" "$data/dev.jsonl"
decode_stage 6 "$model_dir" "$data" "${splits[@]}"
results_stage 7 "$model_dir" "$config" "${splits[@]}"
