#!/usr/bin/env bash
# LibriSpeech recipe: BPE Conformer with joint CTC, for one or several GPUs, reading shards.
#
#   bash recipes/librispeech/run.sh [--data-dir DIR] [--train-sets "SET..."] [--dev-set SET]
#                                   [--test-sets "SET..."] [--vocab-size N] [--config FILE]
#                                   [--cmvn-utterances N] [--url-base URL]
#                                   [--stage N]
#                                   [--stop-stage M] [--data DIR] [--exp DIR] [--force]
#                                   [--beam-size N] [--ctc-weight W] [--average N]
#                                   [--lm-weight W --lm-config FILE] [-- ASR-FIT-OPTIONS...]
#
#   0  download                sets not found under --data-dir: <url-base>/<set>.tar.gz
#   1  prepare manifests       data/librispeech/<set>.jsonl per set, train.jsonl (the train
#                              sets pooled); for a config that trains on shards (its
#                              train_manifest a folder), data/librispeech/shards/train/
#                              (asr shard: WebDataset tars streamed in training)
#   2  train the tokenizer     data/librispeech/bpe<N>/ (BPE, N = --vocab-size; default: the
#                              N of the config's `tokenizer: .../bpeN`, else 5000)
#   3  CMVN statistics         data/librispeech/cmvn.json (first --cmvn-utterances, 20000;
#                              through the config's level normaliser and features)
#   4  train                   exp/librispeech/<config>/   (resumes from last.ckpt if present)
#   5  average checkpoints     exp/librispeech/<config>/avg.ckpt (best 5 as the config keeps them),
#                              finished on the dev set (asr finalize)
#   6  decode the test sets    exp/librispeech/<config>/decode_<set>/ (metrics, errors, plots)
#   7  results table           exp/librispeech/<config>/RESULTS.md, printed
# With --lm-weight W > 0 and --lm-config FILE (an LM config, e.g. conf/mini_librispeech/lm.yaml):
#   8  train the LM            exp/librispeech/lm_bpe<N>/ on the training transcripts, in the
#                              BPE units
#   9  decode with the LM      exp/librispeech/<config>/decode_<set>_lm/, and the results table
#
# Sets: train-clean-100, train-clean-360, train-other-500 (default: all three, 960 h),
# dev-clean (validation, default), dev-other, test-clean, test-other (decoded by default:
# all four). --data-dir: the LibriSpeech folder or its parent (default data/librispeech/download).
# --config: default conf/librispeech/conformer.yaml (every GPU of this node; the cost:
# docs/scaling.md); conf/librispeech/transformer.yaml reads the pooled manifest;
# conf/librispeech/transformer_smoke.yaml is a CPU smoke test; gpu_smoke.sh beside this
# script checks a GPU machine in minutes. Several nodes: run stages 0-3
# here, stage 4 under torchrun or SLURM as the config's header shows, then --stage 5.
# A finished stage leaves a marker (<out>/.done-<stage>) and is skipped when re-run; --force
# re-runs it. A stage that failed halfway left no marker, so it simply runs again. Options
# after `--` go to `asr fit`, e.g. -- --trainer.devices 4.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=recipes/lib/stages.sh
source "$here/../lib/stages.sh"

stage=0
data_dir=""
data=data/librispeech
exp=exp/librispeech
config=conf/librispeech/conformer.yaml
train_sets="train-clean-100 train-clean-360 train-other-500"
dev_set=dev-clean
test_sets="dev-clean dev-other test-clean test-other"
vocab_size=""  # --vocab-size, else the config's (config_bpe_size)
cmvn_utterances=20000
url_base=https://www.openslr.org/resources/12
lm_config=""

# config_bpe_size CONFIG: the N of its `tokenizer: .../bpeN`, the size its results were
# measured with, else 5000.
config_bpe_size() {
  local n=""
  [ -f "$1" ] && n=$(sed -n 's|^ *tokenizer: .*/bpe\([0-9][0-9]*\) *$|\1|p' "$1" | head -n 1)
  echo "${n:-5000}"
}

recipe_option() {
  case "$1" in
    --train-sets) need_value "$@"; train_sets=$2; consumed=2 ;;
    --dev-set) need_value "$@"; dev_set=$2; consumed=2 ;;
    --test-sets) need_value "$@"; test_sets=$2; consumed=2 ;;
    --vocab-size) need_positive "$@"; vocab_size=$((10#$2)); consumed=2 ;;
    --cmvn-utterances) need_positive "$@"; cmvn_utterances=$((10#$2)); consumed=2 ;;
    --config) need_value "$@"; config=$(config_path "$2"); consumed=2 ;;
    --url-base) need_value "$@"; url_base=$2; consumed=2 ;;
    --lm-weight) need_lm_weight "$@"; lm_weight=$(canonical_number "$2"); consumed=2 ;;
    --lm-config) need_value "$@"; lm_config=$(config_path "$2"); consumed=2 ;;
  esac
}
parse_options "$@"
if lm_wanted && [ -z "$lm_config" ]; then
  usage_error "--lm-weight needs --lm-config (e.g. conf/mini_librispeech/lm.yaml)"
fi
if lm_wanted && [ ! -f "$lm_config" ] && [ ! -f "$root/$lm_config" ]; then
  usage_error "no LM config $lm_config"
fi

cd "$root"
require_asr
vocab_size=${vocab_size:-$(config_bpe_size "$config")}
data_dir=${data_dir:-$data/download}
read -r -a train_list <<<"$train_sets"
read -r -a test_list <<<"$test_sets"
[ ${#train_list[@]} -gt 0 ] || usage_error "--train-sets names no set"
[ ${#test_list[@]} -gt 0 ] || usage_error "--test-sets names no set"
# asr prepare pools the sets named train-* (LibriSpeech's own names) into train.jsonl
for set in "${train_list[@]}"; do
  case $set in train-*) ;; *) usage_error "--train-sets $set: train.jsonl pools the sets named train-*" ;; esac
done
for set in "$dev_set" "${test_list[@]}"; do  # scored on what it trained on, only where asked
  case "$set: ${train_list[*]} " in
    train-*:*" $set "*) ;;
    train-*) usage_error "$set: a set named train-* is pooled into train.jsonl: name it in --train-sets too, or score another" ;;
  esac
done
mkdir -p "$data"
# Every set once, in order of first mention.
sets=()
for set in "${train_list[@]}" "$dev_set" "${test_list[@]}"; do
  case " ${sets[*]-} " in *" $set "*) ;; *) sets+=("$set") ;; esac
done

# Stage 0 has no marker: a set is there or not.
missing=()
for set in "${sets[@]}"; do
  [ -d "$data_dir/LibriSpeech/$set" ] || [ -d "$data_dir/$set" ] || missing+=("$set")
done
if [ "$stage" -le 1 ] && [ ${#missing[@]} -gt 0 ]; then
  [ "$stage" -le 0 ] || usage_error "LibriSpeech set(s) ${missing[*]} not found under $data_dir: pass --data-dir or run stage 0 (download)"
  echo "== stage 0 (download $(join_and "${missing[@]}"))"
  for set in "${missing[@]}"; do download "$url_base/$set.tar.gz" "$data_dir"; done
elif [ "$stage" -le 0 ]; then
  echo "== stage 0 (download): every set found under $data_dir, skipping"
fi

# A config whose train_manifest is not a .jsonl file trains on shards of the pooled sets.
train_data=$data/train.jsonl
grep -Eq '^ *train_manifest: *[^ ]+\.jsonl' "$config" || train_data=$data/shards/train
stage_left_out=true run_stage 1 "prepare manifests" "$data" \
  asr prepare librispeech --data-dir "$data_dir" --out "$data" --splits "${sets[@]}"
if [ "$train_data" != "$data/train.jsonl" ]; then  # its own marker: a later config may need it
  run_stage 1 "write shards" "$train_data" \
    asr shard --manifest "$data/train.jsonl" --out "$train_data"
fi
tokenizer=$data/bpe$vocab_size
run_stage 2 "BPE tokenizer ($vocab_size)" "$tokenizer" \
  asr tokenizer --manifest "$data/train.jsonl" --kind bpe --vocab-size "$vocab_size" \
  --out "$tokenizer"
cmvn_dir=$(cmvn_dir "$config" "$data")
cmvn_stage 3 "$config" "$cmvn_dir" --manifest "$data/train.jsonl" \
  --max-utterances "$cmvn_utterances"

model_dir=$exp/$(basename "$config" .yaml)
fit_stage 4 "$config" "$model_dir" \
  --data.train_manifest "$train_data" --data.val_manifest "$data/$dev_set.jsonl" \
  --data.test_manifest "$data/${test_list[0]}.jsonl" --data.tokenizer "$tokenizer" \
  --model.init_args.frontend.init_args.normalize.init_args.stats_path "$cmvn_dir/cmvn.json"
average_stage 5 "$model_dir" "$data/$dev_set.jsonl"
decode_stage 6 "$model_dir" "$data" "${test_list[@]}"
results_stage 7 "$model_dir" "$config" "${test_list[@]}"
lm_stages 8 "$lm_config" "$exp/lm_bpe$vocab_size" "$model_dir" "$config" "$data" "$tokenizer" \
  "$dev_set" "${test_list[@]}"
