#!/bin/bash
# Reward 1 when /app/adults.csv is the header plus the rows with age >= 18 in order, else 0.
# Always ends by writing /logs/verifier/reward.json (anything missing scores 0).
export PATH=/usr/local/bin:/usr/bin:/bin
mkdir -p /logs/verifier
expected=$'name,age\nAna,34\nChloe,18\nEli,52\nGus,21'
reward=0
if [ -f /app/adults.csv ] && [ "$(tr -d '\r' < /app/adults.csv)" = "$expected" ]; then reward=1; fi
rm -f /logs/verifier/reward.txt
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
