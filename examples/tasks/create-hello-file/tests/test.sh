#!/bin/bash
# Reward 1 when /app/hello.txt holds the word hello (trailing newline allowed), else 0.
# Always ends by writing /logs/verifier/reward.json (anything missing scores 0).
export PATH=/usr/local/bin:/usr/bin:/bin
mkdir -p /logs/verifier
reward=0
if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = "hello" ]; then reward=1; fi
rm -f /logs/verifier/reward.txt
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
