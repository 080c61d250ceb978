#!/usr/bin/env bash
# yes/no recipe: the smallest end-to-end run, about a minute on a 2-core CPU.
#
#   bash recipes/yesno/run.sh [--stage N] [--stop-stage M] [--data-dir DIR] [--data DIR]
#                             [--exp DIR] [--config FILE] [--force] [--url URL]
#                             [--beam-size N] [--ctc-weight W] [--average N]
#                             [-- ASR-FIT-OPTIONS...]
#
#   0  download                only if the corpus is not found: --url (OpenSLR 1) into
#                              data/yesno/download/
#   1  prepare manifests       data/yesno/{train,dev,test}.jsonl (26 / 5 / 29 recordings), and
#                              data/yesno/train_shifted.jsonl: train + word-shifted copies
#                              (recipes/yesno/shift.py: every training recording starts with NO)
#   2  train the tokenizer     data/yesno/tokenizer/ (characters)
#   3  CMVN statistics         data/yesno/cmvn.json (8 kHz, 40 mel bands, as the config)
#   4  train                   exp/yesno/<config>/         (resumes from last.ckpt if present)
#   5  average checkpoints     exp/yesno/<config>/avg.ckpt (best 5 by dev WER),
#                              finished on dev (asr finalize)
#   6  decode dev and test     exp/yesno/<config>/decode_{dev,test}/ (metrics, errors, plots)
#   7  results table           exp/yesno/<config>/RESULTS.md, printed
#
# --data-dir: the waves_yesno folder (default ../shared/corpora/yesno/waves_yesno). --config:
# default conf/yesno/transformer.yaml. A finished stage leaves a marker (<out>/.done-<stage>)
# and is skipped when re-run; --force re-runs it. A stage that failed halfway left no marker,
# so it simply runs again. Options after `--` go to `asr fit` (stage 4).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=recipes/lib/stages.sh
source "$here/../lib/stages.sh"

stage=0
data_dir="$root/../shared/corpora/yesno/waves_yesno"
data=data/yesno
exp=exp/yesno
config=conf/yesno/transformer.yaml
url=https://www.openslr.org/resources/1/waves_yesno.tar.gz

recipe_option() {
  case "$1" in
    --config) need_value "$@"; config=$(config_path "$2"); consumed=2 ;;
    --url) need_value "$@"; url=$2; consumed=2 ;;
  esac
}
parse_options "$@"

cd "$root"
require_asr
mkdir -p "$data"
downloaded=$data/download/waves_yesno
if [ ! -d "$data_dir" ] && [ -d "$downloaded" ]; then data_dir=$downloaded; fi
# Stage 0 has no marker: the corpus is there or not.
if [ "$stage" -le 1 ] && [ ! -d "$data_dir" ]; then
  [ "$stage" -le 0 ] || usage_error "yes/no corpus not found at $data_dir: pass --data-dir or run stage 0 (download)"
  echo "== stage 0 (download $url): no corpus at $data_dir"
  download "$url" "$data/download"
  data_dir=$downloaded
elif [ "$stage" -le 0 ]; then
  echo "== stage 0 (download): corpus found at $data_dir, skipping"
fi

prepare() {  # the corpus folder an argument: another folder is another stage 1
  asr prepare yesno --data-dir "$1" --out "$data" || left_out $? "$data/summary.json"
  $(asr_python) "$here/shift.py" "$data/train.jsonl" "$data/train_shifted.jsonl"
}
stage_older="prepare manifests: prepare" run_stage 1 "prepare manifests" "$data" \
  prepare "$data_dir"
run_stage 2 "tokenizer" "$data" \
  asr tokenizer --manifest "$data/train.jsonl" --kind char --out "$data/tokenizer"
cmvn_stage 3 "$config" "$data" --manifest "$data/train.jsonl"

model_dir=$exp/$(basename "$config" .yaml)
fit_stage 4 "$config" "$model_dir" \
  --data.train_manifest "$data/train_shifted.jsonl" --data.val_manifest "$data/dev.jsonl" \
  --data.test_manifest "$data/test.jsonl" --data.tokenizer "$data/tokenizer" \
  --model.init_args.frontend.init_args.normalize.init_args.stats_path "$data/cmvn.json"
average_stage 5 "$model_dir" "$data/dev.jsonl"
decode_stage 6 "$model_dir" "$data" dev test
results_stage 7 "$model_dir" "$config" dev test
