#!/usr/bin/env bash
# Stops the e2e servers an earlier device call left (models under /tmp/hostsync-* or a GPU test's $OUT): they would
# answer on the next call's ports. Each server leads its own process group (the e2e starts it in a new
# session), so the group goes: SGLang's scheduler and detokenizer children too. Sourced or run; $1: a log file.
STRAY="sglang.launch_server --model-path /"
if pgrep -f "$STRAY" > /dev/null; then
  echo "stopping e2e servers an earlier call left: $(pgrep -f "$STRAY" | tr '\n' ' ')" | tee -a "${1:-/dev/null}"
  for pid in $(pgrep -f "$STRAY"); do kill -KILL -- "-$pid" 2> /dev/null || kill -KILL "$pid" 2> /dev/null; done
  sleep 5
fi
