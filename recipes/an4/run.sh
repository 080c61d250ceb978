#!/usr/bin/env bash
# AN4 recipe: numbered, re-runnable stages over the `asr` package.
#
#   bash recipes/an4/run.sh [--quick] [--stage N] [--stop-stage M]
#                           [--model transformer_robust|conformer|conformer_streaming|transformer|rnn]
#                           [--data-dir DIR] [--an4-url URL] [--data DIR] [--exp DIR] [--force]
#                           [--tokenizer char|bpe|unigram] [--vocab-size N]
#                           [--beam-size N] [--ctc-weight W]
#                           [--average N] [--lm-weight W] [--robustness]
#                           [-- ASR-FIT-OPTIONS...]
#
#   0  download                only if --data-dir is not found: --an4-url (CMU's
#                              an4_sphere.tar.gz, 64 MB) to data/an4/download/
#   1  prepare manifests       data/an4/{train,dev,test}.jsonl
#   2  train the tokenizer     data/an4/tokenizer/ (bpe or unigram: --vocab-size, default 100)
#   3  CMVN statistics         data/an4/cmvn.json (through the config's level normaliser
#                              and features: asr cmvn --config); data/an4/as_recorded/cmvn.json
#                              for a config without one (conformer_streaming)
#   4  train                   exp/an4/<model>/            (resumes from last.ckpt if present)
#   5  average checkpoints     exp/an4/<model>/avg.ckpt    (best 5 by dev WER), which then
#                              is finished on dev (asr finalize): it decodes by default as
#                              stage 6 does, with calibrated confidences and alignment maps
#   6  decode dev and test     exp/an4/<model>/decode_{dev,test}/ (metrics, errors, plots);
#                              beam 10, CTC weight chosen on dev: 0.5 for the Transformers
#                              and Conformers (quick or not), 0.3 for the RNN (RESULTS.md)
#   7  results table           exp/an4/<model>/RESULTS.md: WER and CER tables, printed
# With --lm-weight W > 0 (shallow fusion of a character LSTM LM, conf/an4/lm.yaml):
#   8  train the LM            exp/an4/lm/ on the training transcripts (under a minute)
#   9  decode with the LM      exp/an4/<model>/decode_{dev,test}_lm/, and the results table
# With --robustness:
#  10  robustness table        exp/an4/<model>/robustness_test/robustness.md: test WER under
#                              level, noise, babble, reverberation, telephone and speed
#                              changes (asr robustness; about 15 decodes of the test set)
#
# --model: conf/an4/<model>.yaml. The default, transformer_robust, is the Transformer made robust
# to noise, rooms and the telephone band (waveform augmentation from epoch 120 of 300; test
# WER 6.4); conformer is the best on clean audio (5.4) and not robust; --quick trains
# conf/an4/<model>_quick.yaml (default transformer: what `make demo` runs).
# --data-dir: the an4 folder (etc/ and wav/), its parent, or an AN4 .tar.gz (default
# ../shared/corpora/an4, else the tarball stage 0 downloaded). A finished stage leaves a
# marker (<out>/.done-<stage>) and is skipped when re-run; --force re-runs it. A stage that
# failed halfway left no marker, so it simply runs again; stage 1 goes on past audio it
# cannot use, with a warning naming it. Options after `--` go to `asr fit`
# (stage 4), e.g. -- --trainer.max_epochs 2, or -- --config conf/an4/augment.yaml for the
# waveform augmentation from epoch 0 (any model; it costs clean WER).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=recipes/lib/stages.sh
source "$here/../lib/stages.sh"

stage=0
quick=false
robustness=false
model="" # default after parsing: it depends on --quick
data_dir="$root/../shared/corpora/an4"
an4_url=http://www.speech.cs.cmu.edu/databases/an4/an4_sphere.tar.gz
data=data/an4
exp=exp/an4
tokenizer_kind=char
vocab_size=100
ctc_weight="" # default after parsing: it depends on --model

recipe_option() {
  case "$1" in
    --quick) quick=true; consumed=1 ;;
    --robustness) robustness=true; consumed=1 ;;
    --model) need_value "$@"; model=$2; consumed=2 ;;
    --tokenizer)
      need_value "$@"; need_choice "$1" "$2" char bpe unigram; tokenizer_kind=$2; consumed=2 ;;
    --vocab-size) need_positive "$@"; vocab_size=$((10#$2)); vocab_given=$1; consumed=2 ;;
    --lm-weight) need_lm_weight "$@"; lm_weight=$(canonical_number "$2"); consumed=2 ;;
    --an4-url) need_value "$@"; an4_url=$2; consumed=2 ;;
  esac
}
vocab_given=""
parse_options "$@"
need_sized_tokenizer
if [ "$quick" = true ]; then
  model=${model:-transformer}
  config=conf/an4/${model}_quick.yaml
  model_dir=$exp/${model}_quick
else
  model=${model:-transformer_robust}
  config=conf/an4/$model.yaml
  model_dir=$exp/$model
fi
[ -f "$root/$config" ] || usage_error "no config $config for --model $model$([ "$quick" = true ] && echo " --quick")"
if [ -z "$ctc_weight" ]; then
  if [ "$model" = rnn ]; then ctc_weight=0.3; else ctc_weight=0.5; fi
fi

cd "$root"
require_asr
downloaded=$data/download/an4_sphere.tar.gz
if [ ! -e "$data_dir" ] && [ -f "$downloaded" ]; then data_dir=$downloaded; fi
# Stage 0 has no marker: the corpus is there or not. CMU publishes no checksum of the
# tarball, so what is checked is its layout: the transcripts and audio `asr prepare` reads.
if [ "$stage" -le 1 ] && [ ! -e "$data_dir" ]; then
  [ "$stage" -le 0 ] || usage_error "AN4 not found at $data_dir: pass --data-dir (the an4 folder or an AN4 .tar.gz) or run stage 0 to download $an4_url"
  echo "== stage 0 (download $an4_url): AN4 not found at $data_dir"
  fetch_tarball "$an4_url" "$downloaded" '*an4/etc/an4_train.transcription' \
    '*an4/etc/an4_test.transcription' '*an4/wav/*' || {
    echo "$(basename "$0"): no AN4 corpus: fetch $an4_url yourself and pass --data-dir PATH" >&2
    exit 1
  }
  data_dir=$downloaded
elif [ "$stage" -le 0 ]; then
  echo "== stage 0 (download): AN4 found at $data_dir, skipping"
fi
mkdir -p "$data"

stage_left_out=true run_stage 1 "prepare manifests" "$data" \
  asr prepare an4 --data-dir "$data_dir" --out "$data"
tokenizer_options=(--kind "$tokenizer_kind")
[ "$tokenizer_kind" = char ] || tokenizer_options+=(--vocab-size "$vocab_size")
run_stage 2 "tokenizer" "$data" \
  asr tokenizer --manifest "$data/train.jsonl" "${tokenizer_options[@]}" --out "$data/tokenizer"
cmvn_dir=$(cmvn_dir "$config" "$data")
cmvn_stage 3 "$config" "$cmvn_dir" --manifest "$data/train.jsonl"

fit_stage 4 "$config" "$model_dir" \
  --data.train_manifest "$data/train.jsonl" --data.val_manifest "$data/dev.jsonl" \
  --data.test_manifest "$data/test.jsonl" --data.tokenizer "$data/tokenizer" \
  --model.init_args.frontend.init_args.normalize.init_args.stats_path "$cmvn_dir/cmvn.json"
average_stage 5 "$model_dir" "$data/dev.jsonl"
decode_stage 6 "$model_dir" "$data" dev test
results_stage 7 "$model_dir" "$config" dev test

lm_stages 8 conf/an4/lm.yaml "$exp/lm" "$model_dir" "$config" "$data" "$data/tokenizer" dev dev test

if [ "$robustness" = true ]; then
  robustness_stage 10 "$model_dir" "$data" test
fi
