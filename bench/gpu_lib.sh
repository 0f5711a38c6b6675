# Functions of bench/gpu_check.sh, in their own file so that tests can source them and drive
# one step or the packing at a time (tests/test_gpu_check.py). Sourced, never run.
#
# The caller sets OUT_DIR (results folder), SUMMARY (its summary.txt) and KILL_S (seconds
# between timeout's TERM and KILL), and reads `failed` (1 once a step failed) and STEP_STATUS.

failed=0
STEP_NAMES=()
STEP_LIMITS=()
STEP_CMDS=()

note() { echo "$*" | tee -a "$SUMMARY"; }

# add_step NAME SECONDS CMD...: put a step in the plan; its command is kept shell-quoted, so the
# dry run prints exactly what the real run executes.
add_step() {
  local name=$1 limit=$2 arg cmd=""; shift 2
  for arg in "$@"; do  # plain words as they are, anything else quoted by printf %q
    if [[ "$arg" =~ ^[A-Za-z0-9_./=:,@+-]+$ ]]; then cmd+="$arg "; else cmd+="$(printf '%q' "$arg") "; fi
  done
  STEP_NAMES+=("$name")
  STEP_LIMITS+=("$limit")
  STEP_CMDS+=("${cmd% }")
}

# run_step NAME SECONDS QUOTED_CMD: run under `timeout`, log to $OUT_DIR/NAME.log, show its tail,
# and classify: exit 0 passed; exit 3 with a last line "SKIPPED: why" skipped (a fact of the
# machine, such as ncu unable to read counters: not a failure); 124/137 timed out; else failed.
run_step() {
  local name=$1 limit=$2 cmd=$3
  local log="$OUT_DIR/$name.log" start rc took last
  note "== $name (limit ${limit} s): $cmd"
  start=$(date +%s)
  eval "timeout --kill-after=$KILL_S $limit $cmd" > "$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  tail -n 40 "$log"
  last=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)
  if [ "$rc" -eq 0 ]; then
    STEP_STATUS="passed"
  elif [ "$rc" -eq 3 ] && [[ "$last" == SKIPPED:* ]]; then
    STEP_STATUS="skipped (${last#SKIPPED: })"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    STEP_STATUS="TIMED OUT (limit ${limit} s)"
    failed=1
  else
    STEP_STATUS="FAILED (exit $rc)"
    failed=1
  fi
  note "   $name: $STEP_STATUS in ${took} s; log: $log"
}

# check_out DIR: what the device tool brings back from $OUT: at most 8 files, 16 MiB each,
# 64 MiB together, no deeper than DIR/a/b/file, names of letters, digits, '.', '_', '-'.
check_out() {
  local dir=$1 n bad total
  n=$(find "$dir" -type f | wc -l)
  total=$(find "$dir" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  bad=$(find "$dir" -mindepth 1 | sed "s|^$dir/||" | grep -v -E '^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,2}$')
  if [ "$n" -gt 8 ] || [ "$total" -gt $((64 << 20)) ] || [ -n "$bad" ] \
     || [ -n "$(find "$dir" -type f -size +16M)" ]; then
    note "check_out: $dir does NOT fit the device tool's limits: $n files, $total bytes; $bad"
    return 1
  fi
  note "check_out: $dir fits: $n files (at most 8), $total bytes (at most 64 MiB, 16 each)"
}

# pack_out DIR: $OUT_DIR as DIR/gpu-results.tar.gz (at most 15 MiB: files over 1 MiB are left
# out, and named, if the whole folder is larger), plus summary.txt, environment.txt and any of
# peer.txt, ncu_bytes.csv that exist, side by side: the ones to read first.
pack_out() {
  local dir=$1 tarball=$1/gpu-results.tar.gz parent base big
  parent=$(dirname "$OUT_DIR")
  base=$(basename "$OUT_DIR")
  tar -czf "$tarball" -C "$parent" "$base"
  if [ "$(stat -c %s "$tarball")" -gt $((15 << 20)) ]; then
    big=$(cd "$parent" && find "$base" -type f -size +1M)
    note "pack_out: over 15 MiB; left out of the tarball: $big"
    (cd "$parent" && find "$base" -type f -size -1025k -print0 | tar -czf "$tarball" --null -T -)
  fi
  for f in "$SUMMARY" "$OUT_DIR/environment.txt" "$OUT_DIR/peer/peer.txt" \
           "$OUT_DIR/ncu/ncu_bytes.csv"; do
    if [ -f "$f" ]; then cp "$f" "$dir/"; fi
  done
  check_out "$dir"
  local rc=$?
  cp "$SUMMARY" "$dir/"  # again, with check_out's line
  return $rc
}
