#!/usr/bin/env bash
# Run configs and launch/mpirun.sh as a user meets them: a misconfigured launch fails in seconds, before any
# weight loads, with a message that says how to fix it; a config and the flags that override it give the
# run the flags alone would.
#   DIFFPIPE_BIN=build/diffpipe bash tests/cluster/launch_checks.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${DIFFPIPE_BIN:-$here/build/diffpipe}
export DIFFPIPE_BIN=$bin OMP_NUM_THREADS=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
tmp=$(mktemp -d /tmp/diffpipe-launch.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0
say() { printf '[launch] %s\n' "$*"; }

# expect NAME CODE PATTERN COMMAND...: COMMAND exits CODE ("nonzero" for any but 0) within 20 s and its
# output matches the extended regex PATTERN.
expect() {
  local name=$1 want=$2 pattern=$3
  shift 3
  local started code
  started=$(date +%s)
  timeout 60 "$@" > "$tmp/out" 2>&1
  code=$?
  local seconds=$(( $(date +%s) - started ))
  if { [ "$want" = nonzero ] && { [ "$code" = 0 ] || [ "$code" = 124 ]; }; } ||
     { [ "$want" != nonzero ] && [ "$code" != "$want" ]; }; then
    say "FAIL $name: exit $code, expected $want: $(tail -3 "$tmp/out")"
    failures=$((failures + 1))
  elif ! grep -Eq -- "$pattern" "$tmp/out"; then
    say "FAIL $name: output lacks /$pattern/: $(tail -3 "$tmp/out")"
    failures=$((failures + 1))
  elif [ "$seconds" -gt 20 ]; then
    say "FAIL $name: took ${seconds}s (a launch check must be immediate)"
    failures=$((failures + 1))
  else
    say "PASS $name (exit $code, ${seconds}s): $(grep -Eo -- "$pattern" "$tmp/out" | head -1)"
  fi
}

"$bin" make-tiny --out "$tmp/tiny" > /dev/null 2>&1 || { say "make-tiny failed"; exit 1; }
mpirun_sh=$here/launch/mpirun.sh
two=$here/configs/flux-dev-2gpu.json

# The wrapper's checks, each before anything starts.
expect wrong-np 2 "-np 3, but .*flux-dev-2gpu.json \(key \"ranks\"\) needs 2 rank\(s\): use -np 2" \
  "$mpirun_sh" -np 3 --config "$two" --model "$tmp/tiny"
expect missing-hostfile 2 "--hostfile $tmp/nodes: no such file\. Write one line per node" \
  "$mpirun_sh" --hostfile "$tmp/nodes" --config "$two" --model "$tmp/tiny"
expect too-many-gpus 2 "puts 8 rank\(s\) of one GPU each on a node, but this node has 2 GPU\(s\) \(DIFFPIPE_NODE_GPUS\)" \
  env DIFFPIPE_NODE_GPUS=2 "$mpirun_sh" --config "$here/configs/flux-dev-8gpu.json" --model "$tmp/tiny"
printf 'n1 slots=4\nn2 slots=4\n' > "$tmp/hosts"
expect gpus-per-node-with-hostfile 0 "8 rank\(s\) on 2 node\(s\), 4 per node.*" \
  env DIFFPIPE_NODE_GPUS=4 "$mpirun_sh" --dry-run --hostfile "$tmp/hosts" --config "$here/configs/flux-dev-8gpu.json"
expect dry-run-takes-np-from-config 0 "mpirun -np 2 .*generate --config .*flux-dev-2gpu.json" \
  env DIFFPIPE_NODE_GPUS=2 "$mpirun_sh" --dry-run --config "$two" --model "$tmp/tiny"
expect no-np-no-ranks 2 "give -np N" "$mpirun_sh" --config "$here/configs/tiny-demo.json" --model "$tmp/tiny"

# Issue 21: every number the wrapper reads is checked, and configs are type-checked, with one clear line (no
# raw bash or Python errors); user arguments are never glob-expanded; paths with spaces stay one word.
printf 'n1 slots=99999999999999999999\n' > "$tmp/huge-slots"
expect slots-huge 2 "--hostfile .*huge-slots line 1: slots=99999999999999999999: expected a whole number of slots" \
  "$mpirun_sh" --dry-run -np 2 --hostfile "$tmp/huge-slots" --model "$tmp/tiny"
printf '# nodes\nn1 slots=2\nn2 slots=abc\n' > "$tmp/abc-slots"
expect slots-abc 2 "line 3: slots=abc: expected a whole number of slots" \
  "$mpirun_sh" --dry-run -np 2 --hostfile "$tmp/abc-slots" --model "$tmp/tiny"
expect np-abc 2 "-np abc: expected a whole number of ranks" "$mpirun_sh" --dry-run -np abc --model "$tmp/tiny"
expect ranks-flag-huge 2 "--ranks 99999999999999999999: expected a whole number of ranks" \
  "$mpirun_sh" --dry-run --ranks 99999999999999999999 --model "$tmp/tiny"
expect node-gpus-abc 2 "DIFFPIPE_NODE_GPUS=abc: expected a whole number of GPUs" \
  env DIFFPIPE_NODE_GPUS=abc "$mpirun_sh" --dry-run -np 1 --device cuda --model "$tmp/tiny"
expect keepalive-bad 2 "DIFFPIPE_OOB_KEEPALIVE=5,x,5: expected three whole numbers" \
  env DIFFPIPE_OOB_KEEPALIVE=5,x,5 "$mpirun_sh" --dry-run -np 2 --hostfile "$tmp/hosts" --model "$tmp/tiny"
echo '{"ranks": 1e23}' > "$tmp/ranks-huge.json"
expect config-ranks-1e23 2 "ranks-huge.json: key \"ranks\": expected a whole number of ranks .* got 1e\+23" \
  "$mpirun_sh" --dry-run --config "$tmp/ranks-huge.json" --model "$tmp/tiny"
echo '[{"ranks": 2}]' > "$tmp/array.json"
expect config-array 2 "array.json: a run config is a JSON object .* got an array" \
  "$mpirun_sh" --dry-run -np 2 --config "$tmp/array.json" --model "$tmp/tiny"
echo '{"ranks": 2, "steps": 4, "ranks": 3}' > "$tmp/twice.json"
expect config-key-twice 2 "twice.json: key \"ranks\" appears twice" \
  "$mpirun_sh" --dry-run --config "$tmp/twice.json" --model "$tmp/tiny"
# generate refuses a bad config before any work: exit 3, "input" in core/exit_codes.h.
expect generate-config-key-twice 3 "twice.json: key 'ranks' appears twice in the top-level object" \
  "$bin" generate --config "$tmp/twice.json" --model "$tmp/tiny"
# The SLURM job body reads configs the same way (run here without SLURM: it fails before any launch).
expect job-config-array 2 "CONFIG=.*array.json: a run config is a JSON object" \
  env LAUNCHER=srun CONFIG="$tmp/array.json" DIFFPIPE_HOME="$here" OUT_DIR="$tmp/job-array" bash "$here/cluster/slurm/job.sh"
expect job-config-ranks-1e23 2 "key \"ranks\": expected a whole number of ranks" \
  env LAUNCHER=srun CONFIG="$tmp/ranks-huge.json" DIFFPIPE_HOME="$here" OUT_DIR="$tmp/job-huge" bash "$here/cluster/slurm/job.sh"
expect job-tasks-abc 2 "SLURM_NTASKS=abc: expected a whole number" \
  env LAUNCHER=srun SLURM_NTASKS=abc DIFFPIPE_HOME="$here" OUT_DIR="$tmp/job-abc" bash "$here/cluster/slurm/job.sh"
# A "*" in DIFFPIPE_MPIRUN_ARGS reaches mpirun as "*", however many files the folder holds.
mkdir -p "$tmp/glob" && touch "$tmp/glob/a.txt" "$tmp/glob/b.txt"
expect mpirun-args-no-glob 0 '--mca foo [\\][*] ' \
  env -C "$tmp/glob" DIFFPIPE_MPIRUN_ARGS="--mca foo *" "$mpirun_sh" --dry-run -np 1 --model "$tmp/tiny"
# The job body with the mpirun launcher (no SLURM needed for one task): OUT_DIR with a space holds the result,
# named by the job, when neither the config nor GENERATE_ARGS gives an "out"; the submit folder stays empty;
# a "*" in GENERATE_ARGS is one prompt, not the folder's file names.
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d.pop("out"); d["steps"] = 1; json.dump(d, open(sys.argv[2], "w"))' \
  "$here/configs/tiny-demo.json" "$tmp/no-out.json"
mkdir -p "$tmp/submit" && touch "$tmp/submit/x.txt" "$tmp/submit/y.txt"
expect job-out-dir-with-space 0 "wrote $tmp/out dir/diffpipe-local.h5" \
  env -C "$tmp/submit" LAUNCHER=mpirun CONFIG="$tmp/no-out.json" MODEL="$tmp/tiny" OUT_DIR="$tmp/out dir" \
  DIFFPIPE_HOME="$here" GENERATE_ARGS="--prompt *" bash "$here/cluster/slurm/job.sh"
if [ -f "$tmp/out dir/diffpipe-local.h5" ] && [ "$(ls -A "$tmp/submit")" = "$(printf 'x.txt\ny.txt')" ] &&
   grep -q "generate: 1 prompt(s)" "$tmp/out dir/logs/run0"/*/rank.0/stderr; then
  say "PASS job-out-dir-contents: the result in OUT_DIR, the submit folder untouched, '*' one prompt"
else
  say "FAIL job-out-dir-contents: $(find "$tmp/out dir" "$tmp/submit" -maxdepth 1 2>&1 | tr '\n' ' ')"
  failures=$((failures + 1))
fi

# generate's own check of the config's world size, on every rank, before the model folder is opened.
sed 's/"device": "cpu"/"ranks": 3, "device": "cpu"/' "$here/configs/tiny-demo.json" > "$tmp/three.json"
expect generate-wrong-world nonzero "three.json \(key \"ranks\"\\) needs 3 rank\(s\), but the MPI world has 2: start it with .mpirun -np 3" \
  mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS "$bin" generate --config "$tmp/three.json" --model "$tmp/missing" \
  --out "$tmp/never.h5"
expect generate-alone nonzero "needs 3 rank\(s\), but this process runs alone" \
  "$bin" generate --config "$tmp/three.json" --model "$tmp/tiny" --out "$tmp/never.h5"
[ ! -e "$tmp/never.h5" ] || { say "FAIL a refused run wrote its output"; failures=$((failures + 1)); }

# Config errors through the real command: the key and the file are named.
echo '{"steps": 4, "device_map": "auto"}' > "$tmp/typo.json"
expect config-unknown-key 3 "typo.json: unknown key 'device_map' \(did you mean 'device-map'" \
  "$bin" generate --config "$tmp/typo.json" --model "$tmp/tiny"
echo '{"steps": "4"}' > "$tmp/type.json"
expect config-wrong-type 3 "type.json: key 'steps': expected an integer, got a string" \
  "$bin" generate --config "$tmp/type.json" --model "$tmp/tiny"

# Every shipped config is a valid one for this build: with the world-size check lifted (--ranks 0), generate
# (and --device cpu, a prompt) gets past the config to the model folder, missing here, before failing.
for config in "$here"/configs/*.json; do
  name=$(basename "$config" .json)
  "$bin" generate --config "$config" --ranks 0 --device cpu --prompt "a cat" --model "$tmp/no-model" \
    > "$tmp/$name.log" 2>&1
  if grep -q "no-model" "$tmp/$name.log" && ! grep -Eq "unknown key|expected (an?|true)" "$tmp/$name.log"; then
    say "PASS config-valid $name"
  else
    say "FAIL config-valid $name: $(tail -2 "$tmp/$name.log")"
    failures=$((failures + 1))
  fi
done

# A config plus overriding flags is the run that the flags alone describe; the wrapper's 2 ranks give the
# same latents as one process.
# Bit-identical: h5diff compares the stored values themselves (-d 0: any difference counts); h5dump's text
# keeps 6 significant digits and cannot tell float32 values one ulp apart.
same_latents() { h5diff -q -d 0 "$1" "$2" /latents /latents > /dev/null 2>&1; }
"$bin" generate --config "$here/configs/tiny-demo.json" --model "$tmp/tiny" --steps 2 --prompt "a red fox" \
  --out "$tmp/config.h5" > "$tmp/config.log" 2>&1
"$bin" generate --model "$tmp/tiny" --device cpu --dtype fp32 --height 128 --width 192 --steps 2 --seed 42 \
  --max-sequence-length 32 --microbatch-size 1 --prompt "a red fox" --output-type latent --out "$tmp/flags.h5" \
  > "$tmp/flags.log" 2>&1
if [ -f "$tmp/config.h5" ] && same_latents "$tmp/config.h5" "$tmp/flags.h5"
then say "PASS config-plus-overrides equals flags"
else say "FAIL config-plus-overrides: $(tail -2 "$tmp/config.log") $(tail -2 "$tmp/flags.log")"; failures=$((failures + 1))
fi
"$mpirun_sh" -np 2 --config "$here/configs/tiny-demo.json" --model "$tmp/tiny" --steps 2 --prompt "a red fox" \
  --out "$tmp/wrapper.h5" > "$tmp/wrapper.log" 2>&1
if [ -f "$tmp/wrapper.h5" ] && same_latents "$tmp/config.h5" "$tmp/wrapper.h5"
then say "PASS wrapper-two-ranks equals one process"
else say "FAIL wrapper-two-ranks: $(tail -3 "$tmp/wrapper.log")"; failures=$((failures + 1))
fi

[ "$failures" = 0 ] || { say "$failures check(s) failed"; exit 1; }
say "all checks passed"
