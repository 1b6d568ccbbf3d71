#!/bin/bash
# Reward 1 when /app/fruits.txt holds its original lines in alphabetical order, else 0.
# Always ends by writing /logs/verifier/reward.json (anything missing scores 0).
export PATH=/usr/local/bin:/usr/bin:/bin
mkdir -p /logs/verifier
expected=$'apple\nbanana\ncherry\nkiwi\nmango\npear'
reward=0
if [ -f /app/fruits.txt ] && [ "$(cat /app/fruits.txt)" = "$expected" ]; then reward=1; fi
rm -f /logs/verifier/reward.txt
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
