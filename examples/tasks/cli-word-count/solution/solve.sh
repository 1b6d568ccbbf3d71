#!/bin/bash
cat > /app/wc.py <<'EOF'
import sys


def main(argv):
    lines_only = argv[:1] == ["-l"]
    path = argv[-1]
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        print(f"wc.py: {path}: {error.strerror}", file=sys.stderr)
        return 1
    lines = data.count(b"\n")
    if lines_only:
        print(lines)
    else:
        print(lines, len(data.split()), len(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
EOF
