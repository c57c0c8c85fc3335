# shellcheck shell=bash
# The body of cluster/slurm/*.sbatch, sourced by them with LAUNCHER=srun or mpirun set: checks the job against
# the run config, starts `diffpipe generate` on every task, forwards the preemption warning, checkpoints,
# requeues on the checkpoint exit code and resumes. Settings come from the environment (sbatch passes the
# submitter's):
#   CONFIG            run config (configs/*.json); its "ranks" must equal the job's tasks
#   MODEL             the diffusers FLUX folder (or give --model in GENERATE_ARGS)
#   GENERATE_ARGS     more generate flags, split at spaces and never glob-expanded (they override the config's
#                     keys)
#   OUT_DIR           outputs, checkpoints and per-rank logs (default: out/JOBID under the submit dir). The
#                     images or latents go inside it: the config's "out" (and "report", "report-json") when
#                     relative, else diffpipe-JOBID.png (.h5 for --output-type latent); an absolute path, or
#                     --out/--report/--report-json in GENERATE_ARGS, is used as given
#   CHECKPOINT_EVERY  steps between periodic checkpoints (default 10); a signal checkpoints at the next step too
#   DIFFPIPE_BIN      the diffpipe executable (default: build/diffpipe under the repository)
# Exit codes: generate's; 75 (EX_TEMPFAIL) means "checkpointed on a signal": the job is requeued and the rerun
# resumes from OUT_DIR/checkpoints.

job_log() { printf '[diffpipe job %s] %s\n' "${SLURM_JOB_ID:-?}" "$*" >&2; }
job_fail() {
  job_log "error: $*"
  exit 2
}

readonly checkpointed_exit_code=75
repo=${DIFFPIPE_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}
[ -x "$repo/launch/mpirun.sh" ] || job_fail "$repo is not a diffpipe checkout: submit from the repository root" \
  "or set DIFFPIPE_HOME"
bin=${DIFFPIPE_BIN:-$repo/build/diffpipe}
[ -x "$bin" ] || job_fail "$bin is not built (bash launch/setup.sh, or set DIFFPIPE_BIN)"
# Every number read from the environment is checked: bash arithmetic on "abc" or 20 digits gives raw errors.
whole_number() { [[ $2 =~ ^(0|[1-9][0-9]{0,5})$ ]] || job_fail "$1=$2: expected a whole number"; }
tasks=${SLURM_NTASKS:-1}
restart=${SLURM_RESTART_COUNT:-0}
whole_number SLURM_NTASKS "$tasks"
whole_number SLURM_RESTART_COUNT "$restart"
whole_number CHECKPOINT_EVERY "${CHECKPOINT_EVERY:-10}"
job_name=${SLURM_JOB_ID:-local}
out_dir=${OUT_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/out/$job_name}
checkpoint_dir=$out_dir/checkpoints
log_dir=$out_dir/logs/run$restart  # one folder per (re)run, one file per rank
mkdir -p "$checkpoint_dir" "$log_dir" || job_fail "cannot create $out_dir"

# GENERATE_ARGS as words: split at white space, never glob-expanded (a "*" stays a "*").
extra_args=()
read -r -d '' -a extra_args <<<"${GENERATE_ARGS:-}" || true
given_in_args() {  # whether GENERATE_ARGS sets flag $1 (as "--flag value" or "--flag=value")
  local word
  for word in "${extra_args[@]}"; do
    [ "$word" = "$1" ] || [[ $word == "$1="* ]] && return 0
  done
  return 1
}
value_in_args() {  # the value GENERATE_ARGS gives flag $1, or nothing
  local i
  for ((i = 0; i < ${#extra_args[@]}; i++)); do
    if [ "${extra_args[i]}" = "$1" ] && [ $((i + 1)) -lt ${#extra_args[@]} ]; then printf '%s' "${extra_args[i + 1]}"; fi
    if [[ ${extra_args[i]} == "$1="* ]]; then printf '%s' "${extra_args[i]#"$1="}"; fi
  done
}

args=()
config_ranks="" config_out="" config_output_type="" config_report="" config_report_json=""
if [ -n "${CONFIG:-}" ]; then
  [ -f "$CONFIG" ] || job_fail "CONFIG=$CONFIG: no such file (the run configs are in $repo/configs)"
  # Type-checked as generate checks it (an array, "ranks": 1e23, a key given twice are refused here).
  fields_file=$(mktemp)
  if ! python3 "$repo/launch/config_fields.py" "$CONFIG" > "$fields_file" 2> "$fields_file.err"; then
    message=$(cat "$fields_file.err")
    rm -f "$fields_file" "$fields_file.err"
    job_fail "CONFIG=$message"
  fi
  mapfile -d '' -t config_fields < "$fields_file"
  rm -f "$fields_file" "$fields_file.err"
  config_ranks=${config_fields[0]} config_out=${config_fields[2]} config_output_type=${config_fields[3]}
  config_report=${config_fields[4]} config_report_json=${config_fields[5]}
  [ "$config_ranks" != 0 ] || config_ranks=""
  # The config's world size against the job's tasks, before any rank starts: a mismatch would load weights
  # on every node and then fail.
  if [ -n "$config_ranks" ] && [ "$config_ranks" != "$tasks" ]; then
    job_fail "$CONFIG needs $config_ranks rank(s) (key \"ranks\") but the job has $tasks task(s): submit with" \
             "sbatch -n $config_ranks (one task per GPU, e.g. --ntasks-per-node=4 -N $(( (config_ranks + 3) / 4 )))"
  fi
  args+=(--config "$CONFIG")
fi
[ -n "${MODEL:-}" ] && args+=(--model "$MODEL")
# Outputs inside OUT_DIR, so that two jobs never write the same file: the config's relative paths are taken
# inside it, and without any "out" the result is named by the job id.
output_type=$(value_in_args --output-type)
output_type=${output_type:-${config_output_type:-png}}
inside_out_dir() {  # flag config-value: --flag OUT_DIR/value for a relative config value GENERATE_ARGS leaves alone
  given_in_args "$1" && return 0
  [ -n "$2" ] && [[ $2 != /* ]] && args+=("$1" "$out_dir/$2")
  return 0
}
if ! given_in_args --out; then
  if [ -z "$config_out" ]; then
    case "$output_type" in latent) extension=h5 ;; *) extension=png ;; esac
    args+=(--out "$out_dir/diffpipe-$job_name.$extension")
  fi
  inside_out_dir --out "$config_out"
fi
inside_out_dir --report "$config_report"
inside_out_dir --report-json "$config_report_json"
args+=("${extra_args[@]}")
# Checkpoints (--checkpoint-dir/--checkpoint-every/--resume) came with a later build than some in use: a build
# without them runs the job unprotected rather than failing on an unknown flag.
# The help is read whole before it is searched: under pipefail, `--help | grep -q` fails whenever grep stops
# reading before diffpipe has written its (long) help, and the job would run without checkpoints.
generate_help=$("$bin" generate --help 2>/dev/null || true)
if grep -q -- --checkpoint-dir <<<"$generate_help"; then
  args+=(--checkpoint-dir "$checkpoint_dir" --checkpoint-every "${CHECKPOINT_EVERY:-10}")
  # A rerun after a requeue continues from the newest valid checkpoint instead of step 0.
  if [ "$restart" -gt 0 ] && [ -n "$(ls -A "$checkpoint_dir" 2>/dev/null)" ]; then
    args+=(--resume "$checkpoint_dir")
    job_log "rerun $restart: resuming from $checkpoint_dir"
  fi
else
  job_log "warning: $bin has no --checkpoint-dir: a preemption or requeue restarts this job from step 0"
fi

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

case "${LAUNCHER:-srun}" in
  srun)
    # Debian's Open MPI (and most builds) find their peers through PMIx only: without it every task would
    # be a world of one. Fail here, in the job log, before any task starts.
    mpi_plugins=$(srun --mpi=list 2>&1 || true)
    grep -q pmix <<<"$mpi_plugins" || job_fail "this SLURM has no PMIx plugin (srun --mpi=list): install" \
      "it (Debian: slurmd ships mpi_pmix) or submit cluster/slurm/generate-mpirun.sbatch, which starts ranks with mpirun"
    launch=(srun --mpi=pmix --kill-on-bad-exit=1 --output "$log_dir/rank%t.log" --error "$log_dir/rank%t.log")
    # Since SLURM 22.05 srun no longer inherits the job's --cpus-per-task: under task/affinity each rank would be
    # bound to one CPU and load its weights with one reader (5 GB/s, where 8 read about 35).
    if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then launch+=(--cpus-per-task="$SLURM_CPUS_PER_TASK"); fi
    # GPU binding: each task sees only its own GPU(s) when the job asked for GPUs.
    if [ -n "${SLURM_GPUS_PER_TASK:-}${SLURM_GPUS_ON_NODE:-}" ]; then launch+=(--gpus-per-task=1 --gpu-bind=single:1); fi
    launch+=("$bin" generate)
    ;;
  mpirun)
    # mpirun takes the allocation's nodes and slots from SLURM; launch/mpirun.sh checks -np against the
    # config and the node's GPUs, and maps local rank r to GPU r.
    # --mpirun-arg keeps the log folder one word, whatever OUT_DIR holds (spaces included).
    launch=(env DIFFPIPE_BIN="$bin" "$repo/launch/mpirun.sh" --mpirun-arg --output-filename --mpirun-arg "$log_dir"
            -np "$tasks")
    ;;
  *) job_fail "LAUNCHER=${LAUNCHER:-}: expected srun or mpirun" ;;
esac

# The preemption warning (--signal=B:USR1@SECONDS) and scontrol requeue/scancel (SIGTERM) reach this shell;
# diffpipe checkpoints at its next step boundary on SIGUSR1 and exits 75. srun and mpirun forward SIGUSR1 to
# every rank.
launcher_pid=""
# shellcheck disable=SC2317  # called by the trap below
forward_checkpoint_signal() {
  job_log "signal received: asking the ranks to checkpoint"
  [ -n "$launcher_pid" ] && kill -USR1 "$launcher_pid" 2>/dev/null
}
trap forward_checkpoint_signal USR1 TERM

job_log "node(s) ${SLURM_JOB_NODELIST:-$(hostname)}, $tasks task(s), ${LAUNCHER:-srun}, logs in $log_dir"
"${launch[@]}" "${args[@]}" &
launcher_pid=$!
# `wait` returns early when a trapped signal arrives: wait again until the launcher has really ended.
code=0
while :; do
  wait "$launcher_pid"
  code=$?
  kill -0 "$launcher_pid" 2>/dev/null || break
done
trap - USR1 TERM

if [ "$code" -eq "$checkpointed_exit_code" ]; then
  job_log "checkpointed on a signal (exit $code): requeueing job ${SLURM_JOB_ID:-?} to resume"
  if [ -n "${SLURM_JOB_ID:-}" ] && scontrol requeue "$SLURM_JOB_ID"; then exit 0; fi
  job_fail "could not requeue; resume by hand with GENERATE_ARGS=\"--resume $checkpoint_dir\""
fi
if [ "$code" -ne 0 ]; then
  job_log "generate failed (exit $code); the end of each rank's log:"
  for f in "$log_dir"/rank*.log "$log_dir"/*/rank.*/stderr; do
    [ -f "$f" ] && { echo "== $f" >&2; tail -n 5 "$f" >&2; }
  done
fi
exit "$code"
