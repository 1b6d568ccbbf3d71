"""The embedded CPU inference engine: vLLM's OpenAI HTTP contract on transformers.

``EmbeddedEngine`` loads a model and runs the compute thread (``generator``);
``server`` exposes it over HTTP (``EngineServer``, ``ServerThread``), streaming
chat completions as vLLM does (``streaming``), with vLLM's ``/tokenize`` and
prime-rl's token-in chat route (``/v1/chat/completions/tokens``);
``python -m harness_grpo.engine`` runs it as a process.
"""

from harness_grpo.engine.embedded import EmbeddedEngine
from harness_grpo.engine.errors import EngineError
from harness_grpo.engine.generator import Completion
from harness_grpo.engine.sampling import SamplingParams
from harness_grpo.engine.server import EngineServer, ServerThread, build_app

__all__ = [
    "Completion",
    "EmbeddedEngine",
    "EngineError",
    "EngineServer",
    "SamplingParams",
    "ServerThread",
    "build_app",
]
