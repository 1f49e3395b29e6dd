# dist-jobs pod entrypoint. sh runs as PID 1, which would drop SIGTERM: forward it to the
# program so the training can checkpoint. torchrun does not pass a child's exit code through,
# so a preemption checkpoint committed during this run (marker newer than our start) becomes
# exit @REQUEUE@, which restartPolicy ExitCode retries (128-255); other failures stay permanent,
# except the code the first failing process left in DIST_JOBS_EXIT_NOTE (@REQUEUE@: a lost peer).
# The operator recreates a pod exiting 128-255 without limit (kubeflow/trainer#2045): the run
# directory counts this pod's starts, and past preemption.max_requeues the pod refuses to start.
python3 -m dist_jobs.rundir.attempts start || exit
stamp=$(mktemp)
notes=$(mktemp -d)
DIST_JOBS_EXIT_NOTE="$notes/first-failure"
export DIST_JOBS_EXIT_NOTE
child=""
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
# One live run per run directory: pod rank 0 takes the lock (a replaced pod of the same job takes
# it over; DIST_JOBS_LOCK_OWNER names the job). Elastic jobs have no pod rank: the trainer's rank 0
# takes it there. No `$$` here: Kubernetes turns `$$` in a command into `$`.
lock=""
if [ "${PET_NODE_RANK:-}" = 0 ]; then
  if python3 -c 'import dist_jobs.rundir.lockctl' 2>/dev/null; then
    # 32 hex digits, the length of the trainer's own tokens (uuid4().hex): rank 0 shares the token
    # with every rank in a fixed-size all_reduce, so a longer one is a collective mismatch.
    lock=$(tr -d - </proc/sys/kernel/random/uuid)
    python3 -m dist_jobs.rundir.lockctl acquire "${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}" --backend k8s --token "$lock" || exit 2
    export DIST_JOBS_LOCK_TOKEN="$lock"
  else
    echo "dist-jobs: python3 has no dist_jobs: running without the run directory lock" >&2
  fi
fi
"$@" &
child=$!
# Losing the lock (this pod was paused or cut off past the stale limit and another job took the
# run directory over) kills the program and everything under it at once: it writes nothing more.
if [ -n "$lock" ]; then
  python3 -m dist_jobs.rundir.lockctl heartbeat "${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}" "$lock" --kill-tree "$child" &
  beat=$!
fi
while :; do
  wait "$child"
  rc=$?
  kill -0 "$child" 2>/dev/null || break
done
if [ -n "$lock" ]; then
  { kill -KILL "$beat" && wait "$beat"; } 2>/dev/null
  if ! python3 -m dist_jobs.rundir.lockctl check "${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}" "$lock"; then
    echo "dist-jobs: the program ended with exit code $rc; this job lost the run directory lock: exit @LOCKLOST@" >&2
    rc=@LOCKLOST@
    rm -rf "$stamp" "$notes"
    exit "$rc"
  fi
fi
noted=$(cat "$DIST_JOBS_EXIT_NOTE" 2>/dev/null)
case "$noted" in
  '' | *[!0-9]*) ;;
  *) [ "$rc" -ne 0 ] && rc=$noted ;;
esac
marker="${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}/PREEMPTED"
if [ -e "$marker" ] && [ "$marker" -nt "$stamp" ]; then
  rc=@REQUEUE@
fi
[ "$rc" -eq 0 ] && python3 -m dist_jobs.rundir.attempts "done"
rm -rf "$stamp" "$notes"
if [ -n "$lock" ]; then
  python3 -m dist_jobs.rundir.lockctl release "${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}" "$lock"
fi
exit "$rc"
