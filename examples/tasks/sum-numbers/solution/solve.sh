#!/bin/bash
python3 -c 'print(sum(int(line) for line in open("/app/numbers.txt") if line.strip()))' > /app/sum.txt
