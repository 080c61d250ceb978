#!/usr/bin/env bash
# Mini LibriSpeech recipe: the LibriSpeech recipe (recipes/librispeech/run.sh, same stages and
# options) on 4-5 hours of read English, with configs sized for a 2-core CPU.
#
#   bash recipes/mini_librispeech/run.sh [--model conformer|transformer|rnn] [LIBRISPEECH-OPTIONS...]
#
# Data: ../shared/corpora/mini_librispeech when present (train-clean-5, 22 speakers, 4.4 h;
# dev-clean-5, 2 other speakers; Ogg Opus), else the official Mini LibriSpeech from OpenSLR 31
# (train-clean-5, dev-clean-2), downloaded by stage 0 to data/mini_librispeech/download.
# Defaults: the Conformer (the best of the three here: recipes/mini_librispeech/RESULTS.md),
# the BPE size of the model's config (stage 2: 128 for the Conformer, chosen on dev; 256 for
# the others), CMVN through the config's frontend (stage 3), conf/mini_librispeech/<model>.yaml
# (stage 4), dev decoded with beam 10 and CTC
# weight 0.5, chosen on dev (stage 6); with --lm-weight W (0.4 chosen on dev), stages 8-9
# train conf/mini_librispeech/lm.yaml and decode with it. Any LibriSpeech option after these
# overrides them, e.g. --vocab-size 512, --stage 4, --ctc-weight 0.3, or
# `-- --trainer.max_epochs 1`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
shared=$root/../shared/corpora/mini_librispeech

for arg in "$@"; do
  if [ "$arg" = -h ] || [ "$arg" = --help ]; then
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
    echo; echo "LibriSpeech options (recipes/librispeech/run.sh):"
    exec bash "$root/recipes/librispeech/run.sh" --help
  fi
done

model=conformer
rest=() # the options for recipes/librispeech/run.sh; --model anywhere before `--`
while [ $# -gt 0 ]; do
  case "$1" in
    --model)
      if [ $# -lt 2 ] || [ "${2:0:2}" = -- ]; then
        echo "$(basename "$0"): --model needs a value" >&2
        exit 2
      fi
      model=$2
      shift 2 ;;
    --) rest+=("$@"); break ;;
    *) rest+=("$1"); shift ;;
  esac
done
set -- ${rest[@]+"${rest[@]}"}
config=conf/mini_librispeech/$model.yaml
[ -f "$root/$config" ] || { echo "$(basename "$0"): no config $config (--model conformer|transformer|rnn)" >&2; exit 2; }

if [ -d "$shared/LibriSpeech/dev-clean-5" ]; then
  sets=(--data-dir "$shared" --train-sets train-clean-5 --dev-set dev-clean-5
    --test-sets dev-clean-5)
else
  sets=(--data-dir "$root/data/mini_librispeech/download" --train-sets train-clean-5
    --dev-set dev-clean-2 --test-sets dev-clean-2 --url-base https://www.openslr.org/resources/31)
fi
exec bash "$root/recipes/librispeech/run.sh" "${sets[@]}" \
  --ctc-weight 0.5 --lm-config conf/mini_librispeech/lm.yaml --data "$root/data/mini_librispeech" \
  --exp "$root/exp/mini_librispeech" --config "$config" "$@"
