# Stage machinery shared by recipes/<corpus>/run.sh; sourced, never run.
#
# A recipe sets `here` (its own directory) and `root` (the repository), sources this file,
# sets its defaults, defines `recipe_option` for its own options (see parse_options), calls
# `parse_options "$@"`, then runs its stages with run_stage and the shared stages below.
#
# Stages are numbered. A finished stage leaves a marker `<dir>/.done-<N>` and is skipped when
# the recipe is re-run; --force re-runs it (training afresh). A stage that failed (or was
# killed) halfway left no marker, so it simply runs again; training resumes from its
# last.ckpt. A prepare stage whose `asr prepare` left broken inputs out (exit status 1) warns
# and goes on without them.

# Defaults of the options every recipe has; a recipe may change them after sourcing.
stage=1
stop_stage=100
force=false
beam_size=10
ctc_weight=0.3
average=5
lm_checkpoint="" # set by a recipe's LM stage: decode_splits then fuses it (decode_<split>_lm)
lm_weight=0
fit_args=()      # after `--`: extra `asr fit` options, e.g. -- --trainer.max_epochs 5
current_stage="" # the stage running now, named by the failure message
stages_in_range="" # stages asked for that were met (run or skipped); empty before the options

# parse_options ARGS...: the common options, and the recipe's own through `recipe_option`.
# `recipe_option "$@"` is called first for each option: it sets `consumed` to the number of
# words it used (0: not one of its options). Paths given on the command line are taken
# relative to the directory the recipe was started from.
parse_options() {
  first_stage=$stage # a recipe's default: 0 where it has a download stage
  while [ $# -gt 0 ]; do
    consumed=0
    if declare -F recipe_option >/dev/null; then recipe_option "$@"; fi
    if [ "$consumed" -eq 0 ]; then common_option "$@"; fi
    shift "$consumed"
  done
  # Found now, not when the stage that uses them comes after hours of training.
  if [ "$stage" -gt "$stop_stage" ]; then
    usage_error "--stage $stage is after --stop-stage $stop_stage: no stage to run"
  fi
  if [ -n "${config:-}" ] && [ ! -f "$config" ] && [ ! -f "$root/$config" ]; then
    usage_error "no config $config"
  fi
  stages_in_range=0
}

common_option() {
  consumed=2
  case "$1" in
    --stage) need_int "$@"; stage=$((10#$2)) ;;
    --stop-stage) need_int "$@"; stop_stage=$((10#$2)) ;;
    --data-dir) need_value "$@"; data_dir=$(absolute "$2") ;;
    --data) need_value "$@"; data=$(absolute "$2") ;;
    --exp) need_value "$@"; exp=$(absolute "$2") ;;
    --beam-size) need_positive "$@"; beam_size=$((10#$2)) ;;
    --ctc-weight) need_weight "$@"; ctc_weight=$(canonical_number "$2") ;;
    --average) need_positive "$@"; average=$((10#$2)) ;;
    --force) force=true; consumed=1 ;;
    --) shift; fit_args=("$@"); fit_paths; consumed=$(($# + 1)) ;;
    -h|--help) usage; exit 0 ;;
    *) usage_error "unknown option $1 (see --help)" ;;
  esac
}

# fit_paths: each `--config FILE` (or `--config=FILE`) of `fit_args` as `config_path` finds
# it, as two words, and each other value that names a file or folder from the starting
# directory as `from_start` gives it: the stages run from the repository, where a path from
# the starting directory would name another file, or none.
fit_paths() {
  local given=(${fit_args[@]+"${fit_args[@]}"}) i arg
  fit_args=()
  for ((i = 0; i < ${#given[@]}; i++)); do
    arg=${given[i]}
    if [ "$arg" = --config ] && [ $((i + 1)) -lt ${#given[@]} ]; then
      i=$((i + 1))
      fit_args+=(--config "$(config_path "${given[i]}")")
    elif [ "${arg#--config=}" != "$arg" ]; then
      fit_args+=(--config "$(config_path "${arg#--config=}")")
    elif [ "${arg:0:2}" = -- ] && [ "${arg#*=}" != "$arg" ]; then
      fit_args+=("${arg%%=*}=$(from_start "${arg#*=}")")
    elif [ "${arg:0:2}" = -- ]; then
      fit_args+=("$arg")
    else
      fit_args+=("$(from_start "$arg")")
    fi
  done
}

# fit_extras: " + FILE" for each config after `--`, which makes another model of the
# recipe's config (stage 4's name, the results' title).
fit_extras() {
  local i
  for ((i = 0; i + 1 < ${#fit_args[@]}; i++)); do
    if [ "${fit_args[i]}" = --config ]; then printf ' + %s' "${fit_args[i + 1]}"; fi
  done
}

# need_sized_tokenizer: a usage error where --vocab-size (recorded in `vocab_given`) was given
# with the char tokenizer, which has no size to set (asr tokenizer refuses it too).
need_sized_tokenizer() {
  if [ "$tokenizer_kind" = char ] && [ -n "${vocab_given:-}" ]; then
    usage_error "--vocab-size sets a bpe or unigram tokenizer's size: give --tokenizer bpe or unigram"
  fi
}

# need_value OPTION [VALUE...]: a usage error unless the option has a value, not an empty one
# (`--data "$UNSET"` would be the folder the recipe runs in).
need_value() {
  if [ $# -lt 2 ] || [ "${2:0:2}" = "--" ]; then usage_error "$1 needs a value"; fi
  if [ -z "$2" ]; then usage_error "$1 needs a value, got an empty one"; fi
}

# need_int OPTION [VALUE...]: a usage error unless the option has a whole number (of at most
# nine digits: longer ones overflow the shell's comparisons).
need_int() {
  need_whole 0 "$@"
}

# need_positive OPTION [VALUE...]: a usage error unless the option has a whole number >= 1.
need_positive() {
  need_whole 1 "$@"
}

need_whole() {
  local least=$1
  shift
  need_value "$@"
  need_digits "$@"
  if [ "${#2}" -gt 9 ] || [ "$((10#$2))" -lt "$least" ]; then
    usage_error "$1 needs a whole number from $least to 999999999, got '$2'"
  fi
}

# need_digits OPTION VALUE: a usage error unless VALUE is a whole number (of any size).
need_digits() {
  case "$2" in
    '' | *[!0-9]*) usage_error "$1 needs a whole number, got '$2'" ;;
  esac
}

# need_number OPTION [VALUE...]: a usage error unless the option has a number >= 0.
need_number() {
  need_value "$@"
  if ! awk -v w="$2" 'BEGIN { exit !(w ~ /^[0-9]*\.?[0-9]+$/) }'; then
    usage_error "$1 needs a number >= 0, got '$2'"
  fi
}

# need_lm_weight OPTION [VALUE...]: a usage error unless the option has a number in [0, 100]
# (the LM weights `asr` takes), found before the LM is trained.
need_lm_weight() {
  need_number "$@"
  if ! awk -v w="$2" 'BEGIN { exit !(w <= 100) }'; then
    usage_error "$1 needs a number in [0, 100], got '$2'"
  fi
}

# need_choice OPTION VALUE CHOICE...: a usage error unless VALUE is one of the CHOICEs.
need_choice() {
  local option=$1 value=$2 choice
  shift 2
  for choice in "$@"; do [ "$value" = "$choice" ] && return 0; done
  usage_error "$option needs one of $*, got '$value'"
}

# canonical_number VALUE: one spelling of a number ("0.50" and "00.5" are "0.5", "1.0" is
# "1"), so that a stage's options compare equal however they were typed.
canonical_number() {
  printf '%s\n' "$1" | sed -E 's/^0*([0-9])/\1/; s/^\./0./; s/(\.[0-9]*[1-9])0+$/\1/; s/\.0*$//'
}

# need_weight OPTION [VALUE...]: a usage error unless the option has a number in [0, 1].
need_weight() {
  need_value "$@"
  if ! awk -v w="$2" 'BEGIN { exit !(w ~ /^[0-9]*\.?[0-9]+$/ && w >= 0 && w <= 1) }'; then
    usage_error "$1 needs a number in [0, 1], got '$2'"
  fi
}

# absolute PATH: PATH against the directory the recipe was started from, without `.`, `..`,
# doubled or trailing slashes (links kept), so that one folder is one path in stage markers.
absolute() {
  local path=$1
  [ "${path:0:1}" = / ] || path=$start_dir/$path
  realpath -m -s -- "$path" 2>/dev/null || printf '%s\n' "$path"
}

# config_path PATH: a config file as given from the starting directory, or else from the
# repository root (conf/...); relative to the root when inside it.
config_path() {
  local path=$1
  if [ "${path:0:1}" != / ] && [ -f "$start_dir/$path" ]; then path=$(absolute "$path"); fi
  printf '%s\n' "${path#"$root"/}"
}

# from_start VALUE: a relative path from the starting directory as `config_path` gives a
# config: one with a `/` in it (not a URL such as hf://owner/name, nor a list or a dict),
# there or not (else a path missing there would name the repository's file, which may be
# another data set), and a name with a `.` in it (init.ckpt, not a class path) where that
# file is there; any other value (`cpu`, `1e-3`) as it is.
from_start() {
  local value=$1
  case "$value" in
    /* | "~"* | *://* | "["* | "{"*) ;;
    */*) value=$(absolute "$value"); value=${value#"$root"/} ;;
    *.*) if [ -e "$start_dir/$value" ]; then value=$(absolute "$value"); value=${value#"$root"/}; fi ;;
  esac
  printf '%s\n' "$value"
}

# usage: the recipe's leading comment block.
usage() {
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

usage_error() {
  echo "$(basename "$0"): $1" >&2
  exit 2
}

require_asr() {
  command -v asr >/dev/null || {
    echo "$(basename "$0"): 'asr' not on PATH: run 'make install' and activate .venv" >&2
    exit 2
  }
}

# asr_python: a Python that imports the `asr` on PATH (the interpreter of its script).
asr_python() {
  local script candidate
  script=$(command -v asr)
  for candidate in "$(sed -n '1s/^#! *//p' "$script")" python3 python; do
    # shellcheck disable=SC2086  # "/usr/bin/env python3" is two words
    if [ -n "$candidate" ] && $candidate -c 'import asr' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  echo "$(basename "$0"): no Python that imports asr (tried $script's interpreter)" >&2
  return 2
}

# run_stage N NAME MARKER_DIR COMMAND...: skip when done as now (its name, which holds the
# options its command function reads, e.g. the beam, and its command), mark when it succeeds.
# Done otherwise (another config, beam, weight into the same folder): a usage error, not a
# skip that claims the new options. With `stage_left_out=true`, the command is `asr prepare`
# and its exit status 1 a warning (see left_out).
run_stage() {
  local n=$1 name=$2 dir=$3
  shift 3
  local marker=$dir/.done-$n command record
  seen_dir "$dir"
  if [ "$n" -lt "$stage" ] || [ "$n" -gt "$stop_stage" ]; then return 0; fi
  stages_in_range=$((stages_in_range + 1))
  command=$(stage_command "$@")
  record="$name: ${stage_record:-$command}" # stage_record: a caller's own identity of it
  if [ -f "$marker" ] && [ "$force" = false ]; then
    local then
    then=$(stage_command "$(cat "$marker")")
    # stage_older: a caller's older record of it, as it was (it named no options)
    if [ "$then" != "${stage_older-}" ] && ! same_stage "$then" "$record" "$name: $command" \
      "$command"; then
      usage_error "stage $n was done otherwise ($marker):
  then: $then
  now:  $record
give --stage $n --force to run it again (and the stages after it), or another --exp/--data"
    fi
    echo "== stage $n ($name): done already, skipping ($marker)"
    warn_if_older "$n" "$marker"
    return 0
  fi
  echo "== stage $n ($name)"
  mkdir -p "$dir"
  # A stage run again (forced) writes anew what those after it read: until they run again,
  # they no more pass for done than it does, should it stop halfway.
  local later
  if [ -f "$marker" ]; then
    for later in "$dir"/.done-*; do
      if [[ ${later##*/.done-} =~ ^[0-9]+$ ]] && [ "${later##*/.done-}" -gt "$n" ]; then
        rm -f "$later"
      fi
    done
  fi
  rm -f "$marker"
  stage_stamp="$dir/.started"  # what the stage writes is newer (see left_out)
  touch "$stage_stamp"
  current_stage="$n ($name)"
  local started=$SECONDS job
  # The stage runs as a job of its own: SIGTERM or Ctrl-C to the recipe then stops its
  # commands too, where a killed shell would leave them running, orphaned. SIGKILL takes no
  # trap: a watch in the job's group stops it once the recipe is no longer its parent.
  set -m
  (
    set +m
    # A handler, not the default: the shell, killed at once, would leave `wait "$job"` below
    # returning while its command still shuts down (bash runs it once the command ended).
    trap 'exit 143' TERM HUP
    local stage=$BASHPID
    if [ "$(parent_of "$stage")" = "$$" ]; then # else no way to tell: no watch
      while [ "$(parent_of "$stage")" = "$$" ]; do sleep 1; done && kill -TERM 0 &
      trap "kill $! 2>/dev/null || true" EXIT
    fi
    "$@" # not in a condition: a function's failing command still stops it (set -e)
  ) &
  job=$!
  set +m
  trap "stop_job $job TERM 143" TERM
  trap "stop_job $job INT 130" INT
  trap "stop_job $job TERM 129" HUP # the terminal closed (nohup: ignored, no trap)
  local status=0
  wait "$job" || status=$?
  trap - TERM INT HUP
  if [ "$status" -ne 0 ] && [ "${stage_left_out:-}" = true ]; then
    left_out "$status" "$dir/summary.json" || exit "$status"
  elif [ "$status" -ne 0 ]; then
    exit "$status"
  fi
  current_stage=""
  printf '%s\n' "$record" >"$marker"
  echo "== stage $n ($name): done in $((SECONDS - started)) s"
}

# parent_of PID: the parent process id of PID (empty where neither /proc nor ps tells).
parent_of() {
  if [ -r "/proc/$1/stat" ]; then
    local stat
    stat=$(<"/proc/$1/stat") || return 0
    set -- ${stat##*) } # after "pid (name) ": state, parent, ...
    echo "$2"
  elif command -v ps >/dev/null; then
    ps -o ppid= -p "$1" | tr -d ' '
  fi
}

# left_out STATUS SUMMARY: `asr prepare`'s exit status 1, inputs it listed and left out with
# the manifests of the rest written, as a warning: Kaldi's data preparation drops a bad
# utterance and goes on. Only where SUMMARY, written by this run, lists them: a crash exits 1
# too. Another status is returned, a failure still.
left_out() {
  [ "$1" -eq 1 ] && [ "$2" -nt "$stage_stamp" ] && $(asr_python) -c '
import json, sys
summary = json.load(open(sys.argv[1]))
sys.exit(not any(summary.get(k) for k in ("unusable_audio", "missing_audio", "bad_transcripts")))
' "$2" || return "$1"
  echo "warning: stage ${current_stage:-1 (prepare manifests)}: asr prepare left out the" \
    "inputs listed above ($2); the stages go on without them. Mend them, then give" \
    "--stage 1 --force to prepare them again" >&2
}

# seen_dir DIR: remembers a folder that holds stage markers (see warn_if_older).
marker_dirs=()
seen_dir() {
  local known
  for known in ${marker_dirs[@]+"${marker_dirs[@]}"}; do
    if [ "$known" = "$1" ]; then return 0; fi
  done
  marker_dirs+=("$1")
}

# warn_if_older N MARKER: a warning where an earlier stage, in a folder stage N reads, ran
# again after stage N was done (e.g. `--stage 1 --stop-stage 1 --force`): N's result may be
# built on what that stage wrote before. A forced stage drops the later markers of its own
# folder only. A stage reads the data folder (and those in it), folders of its own folder's
# line (a model's for its decodes, the decodes' for the model's results), and the folder a
# caller names in `stage_reads` (the LM's for the decodes with it), not others (the LM's for
# the model). Once: the stages after N are as old.
warned_older=false
warn_if_older() {
  local n=$1 marker=$2 dir other k own=${2%/*}/
  if [ "$warned_older" = true ]; then return 0; fi
  for dir in ${marker_dirs[@]+"${marker_dirs[@]}"}; do
    if [[ $own != "$dir/"* && $dir/ != "$own"* && $dir != "${stage_reads:-}" ]] &&
      [[ -z ${data:-} || $dir/ != "$data/"* ]]; then
      continue
    fi
    for other in "$dir"/.done-*; do
      k=${other##*/.done-}
      if [[ $k =~ ^[0-9]+$ ]] && [ "$k" -lt "$n" ] && [ "$other" -nt "$marker" ]; then
        echo "warning: stage $k ran again ($other) after stage $n was done: give" \
          "--stage $n --force to redo it (and the stages after it) on what stage $k wrote" >&2
        warned_older=true
        return 0
      fi
    done
  done
}

# stop_job PID SIGNAL STATUS: SIGNAL to the job PID's process group, then exit STATUS once it
# ended.
stop_job() {
  kill -"$2" -- "-$1" 2>/dev/null || true
  wait "$1" || true
  exit "$3"
}

# stage_command COMMAND...: a stage's command as its marker records it: resuming a fit is
# the same command as starting it, and the options after `--` (epochs, devices...) do not
# make another run of it.
stage_command() {
  local command="$*" extra=" ${fit_args[*]-}"
  command=${command// --ckpt_path last/}
  if [ "$extra" != " " ]; then command=${command%"$extra"}; fi
  printf '%s\n' "$command"
}

# same_stage THEN RECORD...: whether a marker's THEN is one of this stage's RECORDs (its
# record, then older forms of it: its name and command, the command alone), paths compared as
# `absolute` writes them. An empty marker (made by hand) passes, as do those with `--` options
# after it.
same_stage() {
  local then now
  then=$(normal_numbers "$(normal_paths "$1")")
  shift
  [ -n "$then" ] || return 0
  for now in "$@"; do
    now=$(normal_numbers "$(normal_paths "$now")")
    # options after it, not more of a path with a space in it ("a x" is not "a")
    if [ "$then" = "$now" ] || [ "${then#"$now" --}" != "$then" ]; then return 0; fi
  done
  return 1
}

# normal_numbers TEXT: TEXT with the numbers of its options (a weight, fraction, seed, size or
# count, after a space) as `canonical_number` writes them: a record of "CTC weight 0.50", from
# before options were kept so, is one of 0.5. Other numbers (of paths: seed=01) stay.
normal_numbers() {
  local o='((weight|fraction|seed|size|utterances) )'
  printf '%s\n' "$1" | sed -E -e ':a' \
    -e "s/${o}0+([0-9])/\1\3/g" -e "s/${o}\.([0-9])/\10.\3/g" \
    -e "s/${o}([0-9]+\.[0-9]*[1-9])0+(\$|[ ),])/\1\3\4/g" \
    -e "s/${o}([0-9]+)\.0*(\$|[ ),])/\1\3\4/g" -e 'ta'
}

# normal_paths TEXT: TEXT with its paths as `absolute` writes them (no `.` or `..` steps,
# doubled or trailing slashes), and relative to the repository where inside it, as the
# recipes' defaults are: a marker of `data/`, `./data` or `$root/data` is one of `data`.
normal_paths() {
  local text
  text=$(printf '%s\n' "$1" | sed -E -e ':a' \
    -e 's#/\./#/#g; s#//+#/#g; s#/\.( |$)#\1#g; s#([^ ])/( |$)#\1\2#g; s#(^| )\./#\1#g' \
    -e 's#(^| )/\.\.(/|( |$))#\1/#' \
    -e 's#/([^/ .][^/ ]*|\.[^/ .][^/ ]*)/\.\.(/|( |$))#\2#' -e 'ta')
  text=" $text"
  text=${text// "$root"\// }
  printf '%s\n' "${text# }"
}

# On failure or SIGTERM, say which stage ended and that a re-run carries on from it.
on_exit() {
  local status=$?
  if [ "$status" -eq 0 ] && [ "$stages_in_range" = 0 ] &&
    ! { [ "$first_stage" -eq 0 ] && [ "$stage" -le 0 ]; }; then # stage 0: no run_stage
    usage_error "no stage from $stage to $stop_stage ran: this recipe has none there, or runs \
them only with the option that turns them on (see --help)"
  fi
  { [ "$status" -ne 0 ] && [ -n "$current_stage" ]; } || return 0  # the script's status stays
  if [ "$status" -eq 143 ] || [ "$status" -eq 130 ] || [ "$status" -eq 129 ]; then
    local by=SIGTERM
    [ "$status" -ne 130 ] || by=Ctrl-C
    [ "$status" -ne 129 ] || by="SIGHUP (its terminal closed)"
    echo "== stage $current_stage stopped by $by (exit $status); re-run to carry on:" \
      "finished stages are skipped, training resumes from its last.ckpt" >&2
  else
    echo "== stage $current_stage failed (exit $status); fix the cause and re-run:" \
      "finished stages are skipped, this one starts again" >&2
  fi
}
trap on_exit EXIT

# cmvn_stage N CONFIG DIR OPTIONS...: stage N, `asr cmvn OPTIONS... --config CONFIG` into
# DIR/cmvn.json. Recorded by the config's level normaliser and features, not by its name: the
# statistics depend on those alone, so the models of one frontend share them.
cmvn_stage() {
  local n=$1 config=$2 dir=$3 frontend record marker then named
  shift 3
  frontend=$(frontend_of "$config")
  record="asr cmvn $* --out $dir/cmvn.json, frontend $frontend"
  # Markers of the older forms name the config that ran it: of this frontend, it is this one's.
  marker=$dir/.done-$n
  if [ -f "$marker" ]; then
    then=$(cat "$marker")
    then=${then#"CMVN statistics: "}
    named=${then##* --config }
    if [ "$then" = "asr cmvn $* --out $dir/cmvn.json --config $named" ] \
      && [ -f "$named" ] && [ "$(frontend_of "$named")" = "$frontend" ]; then
      printf '%s\n' "CMVN statistics: $record" >"$marker.new"
      touch -r "$marker" "$marker.new" # the same stage, done when it was: not newer
      mv "$marker.new" "$marker"
    fi
  fi
  stage_record=$record \
    run_stage "$n" "CMVN statistics" "$dir" asr cmvn "$@" --out "$dir/cmvn.json" --config "$config"
}

# frontend_of CONFIG: its frontend's level normaliser and features as one line of JSON
# (asr.config_check.frontend_settings; the config's file name where it names none: asr cmvn
# then says what is wrong).
frontend_of() {
  $(asr_python) - "$1" <<'PY'
import json, sys

from asr.config_check import frontend_settings

try:
    print(json.dumps(frontend_settings(sys.argv[1]), sort_keys=True, separators=(",", ":")))
except Exception:  # a broken config: asr cmvn names its fault
    print(sys.argv[1])
PY
}

# cmvn_dir CONFIG DATA: where the CMVN statistics of CONFIG's frontend live. A config without
# the level normaliser (the streaming ones: it needs whole utterances) takes statistics of the
# audio as recorded, kept apart from those at the normaliser's level.
cmvn_dir() {
  if frontend_of "$1" | grep -q LevelNormalizer; then echo "$2"; else echo "$2/as_recorded"; fi
}

# fit_stage N CONFIG MODEL_DIR OVERRIDES...: `asr fit` into MODEL_DIR, resuming from its
# last.ckpt when a previous run stopped halfway (with --force, a finished run's checkpoints are
# removed and it trains afresh); `--` options of the recipe come last.
fit_stage() {
  local n=$1 config=$2 model_dir=$3
  shift 3
  local resume=()
  resume_or_afresh "$n" "$model_dir"
  run_stage "$n" "train ($config$(fit_extras))" "$model_dir" \
    asr fit --config "$config" "$@" --trainer.default_root_dir "$model_dir" \
    ${resume[@]+"${resume[@]}"} ${fit_args[@]+"${fit_args[@]}"}
}

# resume_or_afresh N DIR: sets `resume` (declared by the caller) to `--ckpt_path last` where
# the fit of stage N into DIR stopped halfway; with --force over stage N, finished or stopped
# halfway, removes its checkpoints so that it trains afresh, as asked (asr fit refuses a new
# run beside them, and resuming would go on with the old weights). A fit afresh removes the
# logs of any run before it (asr curves and asr explore join a run's logs/version_*: the old
# run's later steps would stay), one stopped before its first checkpoint too.
resume_or_afresh() {
  local n=$1 dir=$2
  if [ "$n" -lt "$stage" ] || [ "$n" -gt "$stop_stage" ]; then return 0; fi
  if [ "$force" = true ]; then rm -rf "$dir/checkpoints" "$dir/logs"; fi
  if [ -f "$dir/checkpoints/last.ckpt" ]; then
    resume=(--ckpt_path last)
  elif [ ! -f "$dir/.done-$n" ] && ! compgen -G "$dir/checkpoints/*.ckpt" >/dev/null; then
    rm -rf "$dir/logs" # it trains afresh (a marker: it is skipped, or refused)
  fi
}

# average_stage N MODEL_DIR DEV_MANIFEST: average the best $average checkpoints into
# MODEL_DIR/avg.ckpt and finish it on DEV_MANIFEST (asr finalize): it then decodes by default
# as the recipe decodes (beam, CTC weight), so `asr transcribe` and
# `asr.load_model(...).transcribe` without options give the RESULTS rows' setting, with word
# confidences fitted on dev and the attention maps that time words best.
average_stage() {
  local n=$1 model_dir=$2 dev_manifest=$3
  local search="beam $beam_size, CTC weight $ctc_weight"
  run_stage "$n" "average the best $average, finalize on $(basename "$dev_manifest") ($search)" \
    "$model_dir" average_and_finalize "$model_dir" "$dev_manifest"
}

average_and_finalize() {
  local model_dir=$1 dev_manifest=$2
  asr average --last "$model_dir/checkpoints/last.ckpt" --best "$average" \
    --out "$model_dir/avg.ckpt"
  asr finalize --checkpoint "$model_dir/avg.ckpt" --manifest "$dev_manifest" \
    --beam-size "$beam_size" --ctc-weight "$ctc_weight" --quiet
}

# decode_stage N MODEL_DIR DATA SPLIT...: decode DATA/SPLIT.jsonl into MODEL_DIR/decode_SPLIT.
decode_stage() {
  local n=$1 model_dir=$2 data=$3
  shift 3
  run_stage "$n" "decode $(join_and "$@") (beam $beam_size, CTC weight $ctc_weight)" \
    "$model_dir" decode_splits "$model_dir" "$data" "$@"
}

decode_splits() {
  local model_dir=$1 data=$2 split suffix="" lm=()
  shift 2
  if [ -n "$lm_checkpoint" ]; then
    suffix=_lm
    lm=(--lm "$lm_checkpoint" --lm-weight "$lm_weight")
  fi
  for split in "$@"; do
    # decoded afresh: the LM decode of the model before, if any, would join its table
    [ -n "$suffix" ] || rm -rf "$model_dir/decode_${split}_lm"
    asr evaluate --checkpoint "$model_dir/avg.ckpt" --manifest "$data/$split.jsonl" \
      --out "$model_dir/decode_$split$suffix" --beam-size "$beam_size" \
      --ctc-weight "$ctc_weight" ${lm[@]+"${lm[@]}"}
  done
}

# lm_stages N LM_CONFIG LM_DIR MODEL_DIR CONFIG DATA TOKENIZER DEV SPLIT...: nothing unless
# --lm-weight > 0. Then stage N trains the LM of LM_CONFIG on DATA/train.jsonl (validated on
# DATA/DEV.jsonl) into LM_DIR, and stage N+1 decodes each SPLIT with shallow fusion of its
# last checkpoint into MODEL_DIR/decode_<SPLIT>_lm and rewrites the results table of CONFIG.
lm_stages() {
  local n=$1 lm_config=$2 lm_dir=$3 model_dir=$4 config=$5 data=$6 tokenizer=$7 dev=$8
  shift 8
  lm_wanted || return 0
  local resume=()
  resume_or_afresh "$n" "$lm_dir"
  run_stage "$n" "language model ($lm_config)" "$lm_dir" \
    asr fit --config "$lm_config" --data.train_manifest "$data/train.jsonl" \
    --data.val_manifest "$data/$dev.jsonl" --data.test_manifest "$data/${!#}.jsonl" \
    --data.tokenizer "$tokenizer" --trainer.default_root_dir "$lm_dir" ${resume[@]+"${resume[@]}"}
  lm_checkpoint=$lm_dir/checkpoints/last.ckpt
  local name="decode $(join_and "$@") with the LM (weight $lm_weight, beam $beam_size, CTC"
  name+=" weight $ctc_weight)"
  stage_reads=$lm_dir run_stage $((n + 1)) "$name" "$model_dir" \
    decode_with_lm "$model_dir" "$config" "$data" "$@"
}

# lm_wanted: whether --lm-weight asks for shallow fusion (a weight above 0; need_number
# checked it is a number).
lm_wanted() {
  awk -v w="$lm_weight" 'BEGIN { exit !(w + 0 > 0) }'
}

decode_with_lm() {
  local model_dir=$1 config=$2 data=$3
  shift 3
  need_decodes "$model_dir" "$@" # before the LM decodes, not after them: the table needs both
  decode_splits "$model_dir" "$data" "$@"
  write_results "$model_dir" "$config" "$@"
}

# need_decodes MODEL_DIR SPLIT...: fails, naming it, where a SPLIT has no
# decode_SPLIT/metrics.json: a results table without it would pass for whole.
need_decodes() {
  local split
  for split in "${@:2}"; do
    if [ ! -f "$1/decode_$split/metrics.json" ]; then
      echo "results: $split is not decoded (no $1/decode_$split/metrics.json): run its" \
        "decode stage" >&2
      return 1
    fi
  done
}

# robustness_stage N MODEL_DIR DATA SPLIT: `asr robustness` of avg.ckpt on SPLIT under its
# default conditions (level, noise, babble, reverberation, telephone band, speed), with the
# recipe's beam and CTC weight; the table goes to MODEL_DIR/robustness_SPLIT/robustness.md.
robustness_stage() {
  local n=$1 model_dir=$2 data=$3 split=$4
  run_stage "$n" "robustness of $split (level, noise, reverberation, telephone, speed)" \
    "$model_dir" asr robustness --checkpoint "$model_dir/avg.ckpt" \
    --manifest "$data/$split.jsonl" --out "$model_dir/robustness_$split" \
    --beam-size "$beam_size" --ctc-weight "$ctc_weight"
}

# results_stage N MODEL_DIR CONFIG SPLIT...: the WER/CER table, printed and in RESULTS.md;
# a row per split and decoding (decode_SPLIT, and decode_SPLIT_lm where an LM stage wrote it).
results_stage() {
  local n=$1
  shift
  run_stage "$n" "results" "$1" write_results "$@"
}

# write_results MODEL_DIR CONFIG SPLIT...: the table, titled by the configs that trained the
# model, as its training stage's marker (stage 4) names them: those of this run's options
# (CONFIG and the configs after `--`, `fit_extras`) where the marker does not say.
write_results() {
  local python title="$2$(fit_extras)" trained=""
  need_decodes "$1" "${@:3}"
  if [ -f "$1/.done-4" ]; then read -r trained <"$1/.done-4" || true; fi
  if [[ $trained == "train ("*"): "* ]]; then
    trained=${trained#"train ("}
    title=${trained%%"): "*}
  fi
  python=$(asr_python)
  $python - "$1" "$title" "${@:3}" <<'PY'
import json
import sys
from pathlib import Path

from asr.package import RESULTS_HEADER, results_row

model_dir, config, *splits = sys.argv[1:]
header = RESULTS_HEADER + "\n"

rows = {"word": [], "char": []}
settings, by_length = [], []
for split in splits:
    for suffix in ("", "_lm"):
        metrics = Path(model_dir) / f"decode_{split}{suffix}" / "metrics.json"
        if not metrics.exists():  # the LM decode of a run without --lm-weight
            continue
        m = json.loads(metrics.read_text())
        search = m["search"]  # the settings the decode ran with, not today's options
        decoding = f"beam {search['beam_size']}, ctc {search['ctc_weight']}"
        if search.get("lm_weight"):
            decoding += f", LM {search['lm_weight']}"
        name = f"decode_{split}{suffix}"
        settings.append(f"- {name}: {decoding}; RTF {m['real_time_factor']:.3f}")
        for unit in rows:
            rows[unit].append(results_row(name, m, unit))
        buckets = [b for b in m.get("by_length") or [] if b["utterances"]]
        if len(buckets) > 1:  # utterances of several lengths: where the errors are
            by_length.append(f"\n## WER by utterance length ({name})\n\n")
            by_length.append("| length | Snt | Wrd | WER | Del | Del, last 20 % of words |\n")
            by_length.append("|---" * 6 + "|\n")
            rates = ("wer", "deletion_rate", "tail_deletion_rate")  # None: no reference words
            by_length += [
                f"| {b['bucket']} | {b['utterances']} | {b['reference_words']} | "
                + " | ".join("–" if b[r] is None else f"{b[r]:.1f}" for r in rates) + " |\n"
                for b in buckets
            ]
text = f"# {config}\n\n" + "\n".join(settings) + "\n\n"
text += "## WER\n\n" + header + "\n".join(rows["word"]) + "\n\n"
text += "## CER\n\n" + header + "\n".join(rows["char"]) + "\n" + "".join(by_length)
(Path(model_dir) / "RESULTS.md").write_text(text)
print(text)
plots = " and ".join(f"{model_dir}/decode_{split}/alignments/" for split in splits)
print(f"alignment plots: {plots}")
pages = [Path(model_dir) / f"decode_{split}" / "explorer.html" for split in splits]
pages = " and ".join(str(page) for page in pages if page.exists())
if pages:
    print(f"explorers (open in a browser): {pages}")
PY
}

# join_and WORD...: "a", "a and b", "a, b and c".
join_and() {
  local text=$1
  shift
  while [ $# -gt 1 ]; do
    text+=", $1"
    shift
  done
  if [ $# -eq 1 ]; then text+=" and $1"; fi
  echo "$text"
}

# download URL DIR: fetch a tarball (http(s):// or file://, by fetch_tarball) and unpack it
# into DIR, merging with what is there. It is unpacked into a temporary folder inside DIR, then
# hard-linked into place, so a download that fails halfway adds nothing to DIR.
download() {
  mkdir -p "$2"
  local archive=$2/.download.tar.gz
  fetch_tarball "$1" "$archive" || {
    echo "(or give --data-dir where the corpus is)" >&2
    return 1
  }
  $(asr_python) - "$archive" "$2" <<'PY'
import os
import shutil
import sys
import tarfile
import tempfile

archive, dest = sys.argv[1:]


def link(src: str, dst: str) -> None:
    if not os.path.exists(dst):
        os.link(src, dst)


with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
    unpacked = os.path.join(tmp, "unpacked")
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):  # refuses absolute paths and links out of the tree
            tar.extractall(unpacked, filter="data")
        else:
            tar.extractall(unpacked)
    shutil.copytree(unpacked, dest, dirs_exist_ok=True, copy_function=link)
os.remove(archive)
PY
}

# fetch_tarball URL FILE PATTERN...: download a tarball (http(s):// or file://) to FILE as it
# is, without unpacking it, and check that it holds a member matching each PATTERN (fnmatch,
# `*` spans folders). It is written to FILE.partial and renamed when checked, so a failed or
# corrupt download leaves no FILE.
fetch_tarball() {
  echo "downloading $1 to $2"
  $(asr_python) - "$@" <<'PY'
import fnmatch
import os
import sys
import tarfile
import urllib.request

url, dest, *patterns = sys.argv[1:]
os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
partial = f"{dest}.partial"
try:
    try:
        urllib.request.urlretrieve(url, partial)
    except (OSError, ValueError) as error:  # URLError and HTTPError are OSErrors
        sys.exit(f"download of {url} failed: {error}")
    try:
        with tarfile.open(partial) as tar:
            names = tar.getnames()
    except (OSError, tarfile.TarError) as error:
        sys.exit(f"{url}: not a readable tarball ({str(error).splitlines()[0]})")
    absent = [p for p in patterns if not fnmatch.filter(names, p)]
    if absent:
        sys.exit(f"{url}: unexpected contents, nothing matches {', '.join(absent)}")
    os.replace(partial, dest)
    print(f"{dest}: {os.path.getsize(dest) / 1e6:.1f} MB, {len(names)} members")
finally:
    if os.path.exists(partial):
        os.remove(partial)
PY
}

start_dir=$(pwd)
