# shellcheck shell=bash
# Sourced by up.sh and down.sh. One of them at a time: test sessions may call them concurrently.
# lock TAG: take the cluster lock on fd 9, or exit 1 after 600 s with TAG in the message.
lock() {
  mkdir -p /run/lock
  exec 9>/run/lock/dist-jobs-slurm.lock
  flock -w 600 9 || { echo "[$1] ERROR: another up.sh/down.sh held the lock for 600 s" >&2; exit 1; }
}
