#!/bin/bash
python3 - <<'EOF'
import csv
with open("/app/people.csv", newline="") as src, open("/app/adults.csv", "w", newline="") as dst:
    rows = csv.reader(src)
    out = csv.writer(dst, lineterminator="\n")
    out.writerow(next(rows))
    out.writerows(row for row in rows if int(row[1]) >= 18)
EOF
