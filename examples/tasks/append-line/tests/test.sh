#!/bin/bash
# Reward 1 when /app/log.txt is its three original lines followed by the line finished, else 0.
# Always ends by writing /logs/verifier/reward.json (anything missing scores 0).
export PATH=/usr/local/bin:/usr/bin:/bin
mkdir -p /logs/verifier
expected=$'started\nloaded config\nran jobs\nfinished'
reward=0
if [ -f /app/log.txt ] && [ "$(cat /app/log.txt)" = "$expected" ]; then reward=1; fi
rm -f /logs/verifier/reward.txt
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
