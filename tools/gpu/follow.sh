#!/usr/bin/env bash
# Follow, from a later device call, work that an earlier call started under setsid on the
# same machine (a search per GPU, say), and bring back what exists so far.
#   bash tools/gpu/follow.sh STATE SECONDS [DONE ...]
# STATE: the folder the work writes to (each search's OUT below it). Stops at once when
# STATE is missing: the machine was given back between calls and this one is bare.
# Every minute, each run's last progress lines; it returns when every DONE file exists
# (paths below STATE) or SECONDS pass. STATE's small files (no weights) go to $OUT/state.tgz
# every minute and at the end, so a call cut short by the session's device time, or a lost
# machine, still brings back what was done. A DONE file left by earlier work on a warm
# machine ends the wait at once: the call that starts the work removes its DONE first.
set -uo pipefail
state=$1 seconds=$2; shift 2
[ -d "$state" ] || { echo "no $state: this machine is fresh, the earlier call's work is gone"; exit 3; }
pack() { (cd "$state" && find . -type f -size -4M -not -path './repo/*' -not -name '*.pt' -not -name '*.safetensors' \
           | tar czf "${OUT:-/tmp}/state.tgz" -T -); }
trap pack EXIT
done_all() { local f; for f in "$@"; do [ -e "$state/$f" ] || return 1; done; return 0; }
end=$(( $(date +%s) + seconds ))
while (( $(date +%s) < end )); do
  if (( $# )) && done_all "$@"; then echo "done: $*"; break; fi
  left=$(( end - $(date +%s) )); sleep $(( left < 60 ? (left > 0 ? left : 0) : 60 ))
  echo "-- $(date +%T)"
  pack
  for log in "$state"/queue*.log; do [ -f "$log" ] && grep "^== " "$log" | tail -1; done
  for log in "$state"/*/run_sh.log; do
    [ -f "$log" ] && { echo "${log%/run_sh.log}:"; grep -E "^(gen |winner)" "$log" | tail -2; }
  done
done
for f in "$state"/*/compare.txt; do [ -f "$f" ] && { echo "== $f"; tail -n 12 "$f"; }; done
exit 0
