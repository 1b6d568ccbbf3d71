"""``python -m harness_grpo.envs NAME --port P``: serve one bundled environment (see ``serving``)."""

from harness_grpo.envs.serving import main

if __name__ == "__main__":
    main()
