"""headroom from Python: the engine of ``headroom generate``, PyTorch's memory names,
the planner of ``headroom plan``, the replay of ``headroom mem replay``, and (in
:mod:`headroom.gym`) a world as a Gymnasium environment.

>>> import headroom
>>> engine = headroom.Engine("world")
>>> for chunk in engine.session(frames=21):
...     print(chunk.index, chunk.frames.shape)
0 (9, 96, 128, 3)
1 (12, 96, 128, 3)
"""

from headroom._headroom import (
    Cancelled,
    CheckpointError,
    Chunk,
    Engine,
    EngineError,
    OutOfMemoryError,
    RequestError,
    Session,
    SessionState,
    __version__,
    next_chunks,
    plan,
    replay,
    threads,
    write_video,
)

__all__ = [
    "Cancelled",
    "CheckpointError",
    "Chunk",
    "Engine",
    "EngineError",
    "OutOfMemoryError",
    "RequestError",
    "Session",
    "SessionState",
    "__version__",
    "next_chunks",
    "plan",
    "replay",
    "threads",
    "write_video",
]


def _register_gym() -> None:
    """Registers ``headroom/World-v0`` with Gymnasium when it is installed."""
    import importlib.util

    if importlib.util.find_spec("gymnasium") is None:
        return
    from headroom.gym import register

    register()


_register_gym()
