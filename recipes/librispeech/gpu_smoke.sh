#!/usr/bin/env bash
# GPU smoke test of the LibriSpeech Conformer (conf/librispeech/conformer.yaml) on every GPU of
# this machine, in under 10 minutes: a LibriSpeech-layout folder (default: Mini LibriSpeech from
# ../shared/corpora) made into manifests and shards, a BPE tokenizer and CMVN statistics, a few
# hundred DDP steps reading the shards, 20 dev utterances decoded. It prints the measured
# training throughput (audio seconds per second per GPU, from the epoch clock of rank 0), the
# time the steps waited for data and each GPU's mean utilisation: the figures docs/scaling.md
# estimates where no GPU was at hand.
#
#   bash recipes/librispeech/gpu_smoke.sh [--data-dir DIR] [--out DIR] [--steps N]
#                                         [--batch-seconds S] [--workers N] [--vocab-size N]
#                                         [--accelerator gpu|cpu] [-- ASR-FIT-OPTIONS...]
#
# --data-dir: a folder with a train-* and a dev-* set in the LibriSpeech layout (default
# ../shared/corpora/mini_librispeech/LibriSpeech, else ../shared/corpora/librispeech_sample).
# --out: scratch folder (default exp/librispeech_gpu_smoke; data/ and model/ below it), removed
# and made afresh: an existing one is taken only where an earlier smoke run made it.
# --steps: optimizer steps (300). --batch-seconds: padded audio per GPU and batch (600).
# --workers: loader workers per GPU (4). --accelerator cpu runs the same path on the CPU
# (with --steps 5, a check of the script, not a measurement).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
data_dir=""
out=$root/exp/librispeech_gpu_smoke
steps=300
batch_seconds=600
workers=4
vocab_size=256
accelerator=gpu
fit_args=()

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }
refuse() { echo "$(basename "$0"): $*" >&2; exit 2; }
# whole LEAST OPTION VALUE...: VALUE, a whole number of at least LEAST (found now, not once
# the data are prepared); an option without a value is refused
whole() {
  [ $# -ge 3 ] || refuse "$2 needs a value"
  case "$3" in '' | *[!0-9]*) refuse "$2 needs a whole number, got '$3'" ;; esac
  [ "${#3}" -le 9 ] && [ "$((10#$3))" -ge "$1" ] || refuse "$2 needs a whole number from $1 to 999999999, got '$3'"
}
# given OPTION VALUE...: refused where VALUE is missing or empty
given() { [ $# -ge 2 ] && [ -n "$2" ] || refuse "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    # as given from here (it runs from the repository); a link is kept, as `rm -rf` takes it
    --data-dir) given "$@"; data_dir=$(realpath -m -s -- "$2"); shift 2 ;;
    --out) given "$@"; out=$(realpath -m -s -- "$2"); shift 2 ;;
    --steps) whole 1 "$@"; steps=$((10#$2)); shift 2 ;;
    --batch-seconds)
      [ $# -ge 2 ] && awk -v s="$2" 'BEGIN { exit !(s ~ /^[0-9]*\.?[0-9]+$/ && s > 0) }' ||
        refuse "--batch-seconds needs a number above 0, got '${2:-}'"
      batch_seconds=$2; shift 2 ;;
    --workers) whole 0 "$@"; workers=$((10#$2)); shift 2 ;;
    --vocab-size) whole 5 "$@"; vocab_size=$((10#$2)); shift 2 ;;
    --accelerator)
      case "${2:-}" in gpu | cpu) accelerator=$2; shift 2 ;; *) refuse "--accelerator needs gpu or cpu, got '${2:-}'" ;; esac ;;
    --) shift; fit_args=("$@"); break ;;
    *) echo "$(basename "$0"): unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
if [ -z "$data_dir" ]; then
  for candidate in "$root/../shared/corpora/mini_librispeech/LibriSpeech" \
    "$root/../shared/corpora/librispeech_sample/LibriSpeech"; do
    [ -d "$candidate" ] && { data_dir=$candidate; break; }
  done
fi
[ -n "$data_dir" ] && [ -d "$data_dir" ] || {
  echo "$(basename "$0"): no LibriSpeech-layout folder: pass --data-dir" >&2
  exit 2
}
# --out is removed and made afresh: never a folder that holds this one, the data or the
# code, nor one within the code but exp/ (compared where links lead)
top=$(realpath -m -- "$out")
top=${top%/} # "" for /
for kept in "$PWD" "$data_dir" "$root"; do
  case "$(realpath -m -- "$kept")/" in
    "$top"/*)
      echo "$(basename "$0"): --out $out holds $kept, and is removed first: give a scratch folder" >&2
      exit 2 ;;
  esac
done
code=$(realpath -m -- "$root")
case "$top/" in
  "$code"/exp/?*) ;; # a folder below exp/, not exp/ itself
  "$code"/*) echo "$(basename "$0"): --out $out lies in the repository: give one below exp/ or elsewhere" >&2; exit 2 ;;
esac
# an existing --out is removed only where a smoke run made it: its marker, or nothing but
# what one writes
marker=.gpu_smoke
[ ! -e "$out" ] || [ -d "$out" ] || refuse "--out $out is a file, not a folder"
if [ -d "$out" ] && [ ! -e "$out/$marker" ]; then
  while IFS= read -r entry; do
    case "$entry" in data | model) ;; *)
      refuse "--out $out holds $entry, which no smoke run wrote, and is removed first: give a new folder" ;;
    esac
  done < <(ls -A -- "$out")
fi
command -v asr >/dev/null || { echo "$(basename "$0"): asr is not on PATH (make install)" >&2; exit 2; }
first_set() {  # the first folder named $1-* under $data_dir, or nothing
  local d
  for d in "$data_dir"/"$1"-*/; do
    if [ -d "$d" ]; then basename "$d"; return 0; fi
  done
}
train_set=$(first_set train)
dev_set=$(first_set dev)
[ -n "$dev_set" ] || dev_set=$train_set  # a one-set sample: a smoke test, not a result
[ -n "$train_set" ] || { echo "$(basename "$0"): no train-* set in $data_dir" >&2; exit 2; }

cd "$root"
data=$out/data
model=$out/model
started=$SECONDS
echo "== data: $train_set (train), $dev_set (dev) from $data_dir"
rm -rf "$out"
mkdir -p "$out" && touch "$out/$marker"
asr prepare librispeech --data-dir "$data_dir" --out "$data" --splits $(printf '%s\n' "$train_set" "$dev_set" | sort -u)
asr shard --manifest "$data/$train_set.jsonl" --out "$data/shards" --shard-hours 0.1 --quiet
asr tokenizer --manifest "$data/$train_set.jsonl" --kind bpe --vocab-size "$vocab_size" \
  --out "$data/bpe$vocab_size"
asr cmvn --manifest "$data/$train_set.jsonl" --max-utterances 500 --out "$data/cmvn.json" \
  --config conf/librispeech/conformer.yaml
head -n 20 "$data/$dev_set.jsonl" >"$data/dev20.jsonl"
echo "== data ready in $((SECONDS - started)) s"

devices=-1 device=cuda  # every GPU
[ "$accelerator" = cpu ] && devices=1 device=cpu
fit_started=$SECONDS
sampler=""
if [ "$accelerator" = gpu ] && command -v nvidia-smi >/dev/null; then
  mkdir -p "$model"  # every GPU's utilisation each second of asr fit, for the mean below
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 \
    >"$model/gpu_utilisation.csv" &
  sampler=$!
  trap 'kill "$sampler" 2>/dev/null || true' EXIT
fi
asr fit --config conf/librispeech/conformer.yaml \
  --data.train_manifest "$data/shards" --data.val_manifest "$data/dev20.jsonl" \
  --data.test_manifest "$data/dev20.jsonl" --data.tokenizer "$data/bpe$vocab_size" \
  --model.init_args.frontend.init_args.normalize.init_args.stats_path "$data/cmvn.json" \
  --data.max_batch_seconds "$batch_seconds" --data.num_workers "$workers" \
  --model.init_args.lr_scheduler.init_args.warmup_steps $((steps / 2 + 1)) \
  --trainer.accelerator "$accelerator" --trainer.devices "$devices" --trainer.max_steps "$steps" --trainer.max_epochs -1 \
  --trainer.enable_progress_bar false --trainer.log_every_n_steps 10 \
  --epoch_clock.path "$model/epochs.json" --trainer.default_root_dir "$model" \
  ${fit_args[@]+"${fit_args[@]}"}
[ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true
echo "== training: $((SECONDS - fit_started)) s"

asr evaluate --checkpoint "$model/checkpoints/last.ckpt" --manifest "$data/dev20.jsonl" \
  --out "$model/decode_dev20" --beam-size 10 --ctc-weight 0.3 --device "$device" --quiet \
  --no-explorer
"$(head -n 1 "$(command -v asr)" | sed 's/^#! *//')" - "$model/epochs.json" <<'EOF'
import json, sys

epochs = json.load(open(sys.argv[1]))
later = epochs[1:] or epochs  # the first epoch pays for compilation and worker start-up
audio, steps = sum(e["audio"] for e in later), sum(e["steps"] for e in later)
# Validation (20 decoded utterances each epoch) is left out: the smoke test's epochs are
# short, so it would weigh far more here than beside a 960 h epoch.
validation = sum(e["validation"] for e in later)
wall, waited = sum(e["wall"] for e in later) - validation, sum(e["data"] for e in later)
print(f"== throughput (rank 0, epochs {len(epochs) - len(later) + 1}-{len(epochs)}): "
      f"{audio / steps:,.0f} audio seconds per second of training steps per GPU; "
      f"{audio / wall:,.0f} per second of training wall time ({validation:.1f} s of "
      f"validation besides)")
print(f"== waiting for data: {waited:.1f} s of {wall:.1f} s (more than a few %: more workers)")
EOF
if [ -s "$model/gpu_utilisation.csv" ]; then
  awk -F', ' '{ n[$1]++; u[$1] += $2; if ($3 > m[$1]) m[$1] = $3 }
    END { for (g in n) printf "== GPU %s: %.0f %% busy on average during asr fit, %d MiB at most\n", g, u[g] / n[g], m[g] }' \
    "$model/gpu_utilisation.csv" | sort
fi
echo "== done in $((SECONDS - started)) s"
