#!/usr/bin/env bash
# AN4 recipe: numbered, re-runnable stages over the `asr` package.
#
#   bash recipes/an4/run.sh [--quick] [--stage N] [--stop-stage M] [--model transformer|rnn]
#                           [--data-dir DIR] [--exp DIR] [--force]
#
#   1  prepare manifests       data/an4/{train,dev,test}.jsonl
#   2  train the tokenizer     data/an4/tokenizer/
#   3  CMVN statistics         data/an4/cmvn.json
#   4  train                   exp/an4/<model>/
#
# A finished stage leaves a marker (<out>/.done-<stage>) and is skipped when re-run; --force
# re-runs it. A stage that failed halfway left no marker, so it simply runs again.
set -euo pipefail

stage=1
stop_stage=100
quick=false
force=false
model=transformer
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
data_dir="$root/../shared/corpora/an4"
data=data/an4
exp=exp/an4
tokenizer_kind=char

while [ $# -gt 0 ]; do
  case "$1" in
    --stage) stage=$2; shift 2 ;;
    --stop-stage) stop_stage=$2; shift 2 ;;
    --quick) quick=true; shift ;;
    --force) force=true; shift ;;
    --model) model=$2; shift 2 ;;
    --data-dir) data_dir=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --exp) exp=$2; shift 2 ;;
    --tokenizer) tokenizer_kind=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

cd "$root"
command -v asr >/dev/null || { echo "run.sh: 'asr' not on PATH: run 'make install' and activate .venv" >&2; exit 2; }
if [ ! -d "$data_dir" ]; then
  echo "run.sh: AN4 not found at $data_dir. Download http://www.speech.cs.cmu.edu/databases/an4/an4_sphere.tar.gz and pass --data-dir PATH (the .tar.gz works too)." >&2
  exit 2
fi
mkdir -p "$data"

# run_stage N NAME MARKER_DIR COMMAND...: skip when done, mark when it succeeds.
run_stage() {
  local n=$1 name=$2 dir=$3; shift 3
  if [ "$n" -lt "$stage" ] || [ "$n" -gt "$stop_stage" ]; then return 0; fi
  if [ -f "$dir/.done-$n" ] && [ "$force" = false ]; then
    echo "== stage $n ($name): done already, skipping ($dir/.done-$n)"; return 0
  fi
  echo "== stage $n ($name)"
  mkdir -p "$dir"
  "$@"
  touch "$dir/.done-$n"
}

run_stage 1 "prepare manifests" "$data" \
  asr prepare an4 --data-dir "$data_dir" --out "$data"
run_stage 2 "tokenizer" "$data" \
  asr tokenizer --manifest "$data/train.jsonl" --kind "$tokenizer_kind" --out "$data/tokenizer"
run_stage 3 "CMVN statistics" "$data" \
  asr cmvn --manifest "$data/train.jsonl" --out "$data/cmvn.json"

config=conf/an4/$model.yaml
overrides=(--data.train_manifest "$data/train.jsonl" --data.val_manifest "$data/dev.jsonl"
           --data.test_manifest "$data/test.jsonl" --data.tokenizer "$data/tokenizer")
if [ "$quick" = true ]; then
  config=conf/an4/${model}_quick.yaml
fi
run_stage 4 "train ($config)" "$exp/$model" \
  asr fit --config "$config" "${overrides[@]}" --trainer.default_root_dir "$exp/$model"
