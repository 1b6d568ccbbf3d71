"""Grades /app/config.json: 0.5 for debug=true, 0.5 for port=8080, all only if the other keys are untouched."""

import json

UNCHANGED = {"name": "inventory-service", "workers": 4, "log_level": "info"}


def grade() -> dict:
    try:
        with open("/app/config.json") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {"reward": 0, "debug": 0, "port": 0, "preserved": 0}
    if not isinstance(config, dict):
        return {"reward": 0, "debug": 0, "port": 0, "preserved": 0}
    debug = int(config.get("debug") is True)
    port = int(type(config.get("port")) is int and config["port"] == 8080)
    preserved = int(
        set(config) == {"debug", "port", *UNCHANGED}
        and all(config[key] == value and type(config[key]) is type(value) for key, value in UNCHANGED.items())
    )
    return {"reward": preserved * (debug + port) / 2, "debug": debug, "port": port, "preserved": preserved}


print(json.dumps(grade()))
