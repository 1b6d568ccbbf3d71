#!/bin/bash
python3 - <<'EOF'
import json
with open("/app/config.json") as f:
    config = json.load(f)
config["debug"] = True
config["port"] = 8080
with open("/app/config.json", "w") as f:
    json.dump(config, f, indent=2)
EOF
