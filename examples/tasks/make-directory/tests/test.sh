#!/bin/bash
# Reward 1 when /app/output is a directory, else 0.
# Always ends by writing /logs/verifier/reward.json (anything missing scores 0).
export PATH=/usr/local/bin:/usr/bin:/bin
mkdir -p /logs/verifier
reward=0
if [ -d /app/output ] && [ ! -L /app/output ]; then reward=1; fi
rm -f /logs/verifier/reward.txt
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
