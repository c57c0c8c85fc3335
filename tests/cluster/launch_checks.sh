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
expect config-unknown-key 1 "typo.json: unknown key 'device_map' \(did you mean 'device-map'" \
  "$bin" generate --config "$tmp/typo.json" --model "$tmp/tiny"
echo '{"steps": "4"}' > "$tmp/type.json"
expect config-wrong-type 1 "type.json: key 'steps': expected an integer, got a string" \
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
