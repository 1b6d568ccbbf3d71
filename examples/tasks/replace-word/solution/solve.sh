#!/bin/bash
python3 - <<'EOF'
from pathlib import Path
notes = Path("/app/notes.txt")
notes.write_text(notes.read_text().replace("colour", "color"))
EOF
