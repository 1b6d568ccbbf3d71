#!/bin/bash
cat > /app/greet.py <<'EOF'
import sys


def greet(name):
    return f"Hello, {name}!"


if __name__ == "__main__":
    print(greet(sys.argv[1]))
EOF
