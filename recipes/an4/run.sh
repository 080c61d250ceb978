#!/usr/bin/env bash
# AN4 recipe: numbered, re-runnable stages over the `asr` package.
#
#   bash recipes/an4/run.sh [--quick] [--stage N] [--stop-stage M] [--model transformer|rnn]
#                           [--data-dir DIR] [--exp DIR] [--force]
#                           [--beam-size N] [--ctc-weight W] [--average N]
#
#   1  prepare manifests       data/an4/{train,dev,test}.jsonl
#   2  train the tokenizer     data/an4/tokenizer/
#   3  CMVN statistics         data/an4/cmvn.json
#   4  train                   exp/an4/<model>/            (resumes from last.ckpt if present)
#   5  average checkpoints     exp/an4/<model>/avg.ckpt    (best 5 by dev WER)
#   6  decode dev and test     exp/an4/<model>/decode_{dev,test}/ (metrics, errors, plots)
#   7  results table           exp/an4/<model>/RESULTS.md rows, printed
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
beam_size=10
ctc_weight=0.3
average=5

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
    --beam-size) beam_size=$2; shift 2 ;;
    --ctc-weight) ctc_weight=$2; shift 2 ;;
    --average) average=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

cd "$root"
command -v asr >/dev/null || { echo "run.sh: 'asr' not on PATH: run 'make install' and activate .venv" >&2; exit 2; }
if [ ! -e "$data_dir" ]; then
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
overrides+=(--model.init_args.frontend.init_args.normalize.init_args.stats_path "$data/cmvn.json")
if [ "$quick" = true ]; then
  model_dir=$exp/${model}_quick
else
  model_dir=$exp/$model
fi
ckpt_dir=$model_dir/checkpoints
resume=()
[ -f "$ckpt_dir/last.ckpt" ] && resume=(--ckpt_path last)  # a stage that stopped halfway resumes
run_stage 4 "train ($config)" "$model_dir" \
  asr fit --config "$config" "${overrides[@]}" --trainer.default_root_dir "$model_dir" "${resume[@]}"
run_stage 5 "average the best $average checkpoints" "$model_dir" \
  asr average --last "$ckpt_dir/last.ckpt" --best "$average" --out "$model_dir/avg.ckpt"

decode() {
  for split in dev test; do
    asr evaluate --checkpoint "$model_dir/avg.ckpt" --manifest "$data/$split.jsonl" \
      --out "$model_dir/decode_$split" --beam-size "$beam_size" --ctc-weight "$ctc_weight"
  done
}
run_stage 6 "decode dev and test (beam $beam_size, CTC weight $ctc_weight)" "$model_dir" decode

results() {
  python - "$model_dir" "$config" "$beam_size" "$ctc_weight" <<'PY'
import json, sys
from pathlib import Path
model_dir, config, beam, ctc = sys.argv[1:]
rows = []
for split in ("dev", "test"):
    m = json.loads((Path(model_dir) / f"decode_{split}" / "metrics.json").read_text())
    rows.append(f"| {config} | {split} | beam {beam}, ctc {ctc} | {m['wer']:.1f} | {m['cer']:.1f} "
                f"| {m['real_time_factor']:.3f} |")
table = "| config | split | decoding | WER % | CER % | RTF |\n|---|---|---|---|---|---|\n"
text = table + "\n".join(rows) + "\n"
(Path(model_dir) / "RESULTS.md").write_text(text)
print(text)
print(f"alignment plots: {model_dir}/decode_dev/alignments/ and {model_dir}/decode_test/alignments/")
PY
}
run_stage 7 "results" "$model_dir" results
