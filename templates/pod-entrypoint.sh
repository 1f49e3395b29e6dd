# dist-jobs pod entrypoint. sh runs as PID 1, which would drop SIGTERM: forward it to the
# program so the training can checkpoint. How the program's end is read is decided by
# dist_jobs.rundir.verdict, as after a SLURM step: a preemption checkpoint, a lost peer (another pod
# of the job told to stop while the program ran), a hang or a rank killed by a signal exit @REQUEUE@,
# which restartPolicy ExitCode retries (128-255); the program's own error keeps its code (1-127:
# permanent). torchrun runs as dist_jobs.train.torchrun, which exits with its first failed
# worker's code (128+N for a signal), not 1 whatever they did. The operator recreates a pod
# exiting 128-255 without limit (kubeflow/trainer#2045): the run directory counts this pod's
# starts, and past preemption.max_requeues the pod refuses to start.
python3 -m dist_jobs.rundir.attempts start || exit
stamp=$(mktemp)
# torchrun notes there which rank failed first (dist_jobs.rundir.first_failure): the verdict names it.
export DIST_JOBS_FIRST_FAILURE="$stamp.first-failure"
child=""
leaving=""
# Told to stop (the pod is deleted or preempted): say so in the run directory first (an empty
# file whose time is the note: no interpreter to start), so the other pods' programs, which fail
# once this one is gone, read as having lost a peer (dist_jobs.rundir.pod_end).
peers="${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}/peers"
trap 'leaving=--leaving; mkdir -p "$peers" 2>/dev/null && : >"$peers/${HOSTNAME:-pod}"; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
# One live run per run directory: pod rank 0 takes the lock (a replaced pod of the same job takes
# it over; DIST_JOBS_LOCK_OWNER names the job). Elastic jobs have no pod rank: the trainer's rank 0
# takes it there. No `$$` here: Kubernetes turns `$$` in a command into `$`.
lock=""
follow=""
beat=""
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
elif [ -n "${DIST_JOBS_LOCK_OWNER:-}" ] && python3 -c 'import dist_jobs.rundir.lockctl' 2>/dev/null; then
  follow=1
fi
"$@" &
child=$!
# Losing the lock (this pod was paused or cut off past the stale limit and another job took the
# run directory over) kills the program and everything under it at once: it writes nothing more.
# Pod 0 beats the lock; every other pod follows it, and stops its own program the same way.
if [ -n "$lock" ]; then
  python3 -m dist_jobs.rundir.lockctl heartbeat "${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}" "$lock" --kill-tree "$child" &
  beat=$!
elif [ -n "$follow" ]; then
  python3 -m dist_jobs.rundir.lockctl follow "${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}" --owner "$DIST_JOBS_LOCK_OWNER" --kill-tree "$child" &
  beat=$!
fi
while :; do
  wait "$child"
  rc=$?
  kill -0 "$child" 2>/dev/null || break
done
lost=""
[ -n "$beat" ] && { kill -KILL "$beat" && wait "$beat"; } 2>/dev/null
if [ -n "$lock" ]; then
  if ! python3 -m dist_jobs.rundir.lockctl check "${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}" "$lock"; then
    echo "dist-jobs: the program ended with exit code $rc; this job lost the run directory lock: exit @LOCKLOST@" >&2
    lost=--lock-lost
  fi
fi
# The verdict prints the code to exit with (its own line goes to stderr). An image without
# dist_jobs gets the old rule: a preemption checkpoint is retried, the rest keeps its code.
if ! code=$(python3 -m dist_jobs.rundir.pod_end --rc "$rc" --since "$stamp" ${lost:+"$lost"} ${leaving:+"$leaving"}); then
  code=$rc
  marker="${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}/PREEMPTED"
  if [ "$rc" -ne 0 ] && [ -e "$marker" ] && [ "$marker" -nt "$stamp" ]; then
    code=@REQUEUE@
  fi
fi
[ "$code" -eq 0 ] && python3 -m dist_jobs.rundir.attempts "done"
rm -f "$stamp" "$DIST_JOBS_FIRST_FAILURE"
if [ -n "$lock" ] && [ -z "$lost" ]; then
  python3 -m dist_jobs.rundir.lockctl release "${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}" "$lock"
fi
exit "$code"
