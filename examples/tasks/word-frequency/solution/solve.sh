#!/bin/bash
python3 - <<'EOF'
import collections
import re
words = re.findall(r"[a-z]+", open("/app/text.txt").read().lower())
with open("/app/top.txt", "w") as out:
    for word, _ in collections.Counter(words).most_common(3):
        out.write(word + "\n")
EOF
