#!/bin/bash
# Reward 1 when /app/final.txt holds the draft's text and /app/draft.txt is gone, else 0.
# Always ends by writing /logs/verifier/reward.json (anything missing scores 0).
export PATH=/usr/local/bin:/usr/bin:/bin
mkdir -p /logs/verifier
reward=0
if [ ! -e /app/draft.txt ] && [ -f /app/final.txt ] \
    && [ "$(cat /app/final.txt)" = "Quarterly report: sales up 4 percent." ]; then
  reward=1
fi
rm -f /logs/verifier/reward.txt
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
