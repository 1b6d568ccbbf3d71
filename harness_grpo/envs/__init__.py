"""OpenEnv environments that run offline: servers, clients and TRL-style tool classes.

Each environment is served by OpenEnv's ``create_app`` with concurrent sessions
(``python -m harness_grpo.envs NAME --port 8001``) and speaks the wire format of the OpenEnv
environment it mirrors, so client code written for that environment runs with only its imports
changed:

========  ==============================  ===============================  =====================
name      mirrors (OpenEnv ``envs/``)      client, action                   tool class
========  ==============================  ===============================  =====================
echo      ``echo_env`` (EchoAction)        ``EchoEnv``, ``EchoAction``       ``EchoToolEnv``
wordle    ``textarena_env``, Wordle-v0     ``TextArenaEnv``, ``TextArenaAction``  ``WordleToolEnv``
sudoku    ``textarena_env``, Sudoku-v0     ``TextArenaEnv``, ``TextArenaAction``  ``SudokuToolEnv``
catch     ``openspiel_env``, catch         ``OpenSpielEnv``, ``OpenSpielAction``  ``CatchToolEnv``
========  ==============================  ===============================  =====================

Clients are ``EpisodeClient``s (``harness_grpo.envs.sessions``): one WebSocket session per
episode, and ``SessionLostError`` instead of a silent reconnect into a fresh game. Tool classes
follow TRL's ``environment_factory`` rules: public methods are the tools, ``reset(**row)`` returns
the first observation as text, ``reward`` and ``done`` are attributes.
"""
