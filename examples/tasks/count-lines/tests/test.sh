#!/bin/bash
# Reward 1 when /app/count.txt holds the line count of the original /app/data.txt, else 0.
# Always ends by writing /logs/verifier/reward.json (anything missing scores 0).
export PATH=/usr/local/bin:/usr/bin:/bin
mkdir -p /logs/verifier
reward=0
if [ -f /app/count.txt ] && [ "$(tr -d '[:space:]' < /app/count.txt)" = "17" ]; then reward=1; fi
rm -f /logs/verifier/reward.txt
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
