# dist-jobs pod entrypoint. sh runs as PID 1, which would drop SIGTERM: forward it to the
# program so the training can checkpoint. torchrun does not pass a child's exit code through,
# so a preemption checkpoint committed during this run (marker newer than our start) becomes
# exit @REQUEUE@, which restartPolicy ExitCode retries (128-255); other failures stay permanent.
stamp=$(mktemp)
child=""
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
"$@" &
child=$!
while :; do
  wait "$child"
  rc=$?
  kill -0 "$child" 2>/dev/null || break
done
marker="${DIST_JOBS_CHECKPOINT_DIR}/${DIST_JOBS_RUN}/PREEMPTED"
if [ -e "$marker" ] && [ "$marker" -nt "$stamp" ]; then
  rc=@REQUEUE@
fi
rm -f "$stamp"
exit "$rc"
