#!/bin/bash
# Reward = fraction of nine hidden cases (three per function) that mean/median/variance get right.
# check.py prints one JSON line of rewards; anything else (crash, timeout) scores 0.
export PATH=/usr/local/bin:/usr/bin:/bin
mkdir -p /logs/verifier
result=$(cd / && timeout 50 python3 -E -s /tests/check.py 2>/logs/verifier/check-stderr.txt | tail -n 1)
case "$result" in
  '{"reward": '*'}') ;;
  *) result='{"reward": 0}' ;;
esac
rm -f /logs/verifier/reward.txt
printf '%s\n' "$result" > /logs/verifier/reward.json
