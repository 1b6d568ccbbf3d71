#!/bin/bash
# Reward 1 when every colour in /app/notes.txt became color and nothing else changed, else 0.
# Always ends by writing /logs/verifier/reward.json (anything missing scores 0).
export PATH=/usr/local/bin:/usr/bin:/bin
mkdir -p /logs/verifier
expected=$'color chart\nthe color of the sea\nno change here\ncolor, color everywhere'
reward=0
if [ -f /app/notes.txt ] && [ "$(cat /app/notes.txt)" = "$expected" ]; then reward=1; fi
rm -f /logs/verifier/reward.txt
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
