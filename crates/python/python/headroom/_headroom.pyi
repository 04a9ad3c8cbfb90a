"""Type stubs of the headroom extension module (crates/python/src)."""

import os
from typing import Any, Iterable, Iterator, Literal, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

__version__: str

_Path = Union[str, "os.PathLike[str]"]
_Size = Union[int, str]
_Image = Union[npt.NDArray[np.uint8], _Path, Any]  # a numpy array, a path or a PIL image
_Frames = Union[int, Literal["until-stop"]]

class RequestError(ValueError):
    """A request field breaks a rule; ``field`` names it."""

    field: str

class OutOfMemoryError(MemoryError):
    """Out of memory, or a session refused for want of room."""

    planned_bytes: Optional[int]
    free_bytes: Optional[int]
    kind: Literal["out_of_memory", "planned_peak", "memory", "kv_pages"]

class CheckpointError(RuntimeError):
    """A checkpoint or snapshot cannot be read, or does not fit this engine."""

    kind: str

class Cancelled(RuntimeError):
    """A chunk was stopped by its cancel token; the session is over."""

class EngineError(RuntimeError):
    """The engine failed (not the request, not the memory, not a file)."""

class FrameBuffer:
    """The engine's frame tensor behind a frames array (its ``base``)."""

class Chunk:
    """One chunk of video."""

    @property
    def index(self) -> int: ...
    @property
    def frames(self) -> npt.NDArray[np.uint8]:
        """``uint8 [T, H, W, 3]``, read-only (9 frames first, then 12)."""
    @property
    def timings(self) -> dict[str, float]:
        """Seconds: ``total``, ``denoise``, ``commit``, ``decode``."""
    @property
    def memory(self) -> dict[str, int]:
        """``memory_stats()`` after the chunk's decode."""

class SessionState:
    """A session at a chunk boundary, in host memory (``Session.snapshot()``)."""

    @property
    def chunks_done(self) -> int: ...
    @property
    def state_bytes(self) -> int: ...
    def save(self, path: _Path) -> int:
        """Writes a ``.hrsnap`` file; returns its bytes."""

class Session(Iterator[Chunk]):
    """A streaming session: iterate it for chunks; steer it between them."""

    block_frames: int
    def __iter__(self) -> "Session": ...
    def __next__(self) -> Chunk: ...
    def interact(
        self,
        keys: Optional[Union[str, Sequence[str]]] = None,
        camera: Optional[dict[str, Any]] = None,
        frame: int = 0,
    ) -> None: ...
    def set_prompt(self, prompt: str) -> None: ...
    def snapshot(self) -> SessionState: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Session": ...
    def __exit__(self, *args: Any) -> bool: ...
    @property
    def id(self) -> str: ...
    @property
    def chunks_done(self) -> int: ...
    @property
    def chunks_total(self) -> Optional[int]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def engine(self) -> "Engine": ...

class Engine:
    """A loaded model serving sessions (the flags of ``headroom generate``)."""

    def __init__(
        self,
        model: str = "world",
        device: str = "cpu",
        dtype: Optional[Literal["f32", "bf16"]] = None,
        decoder: Optional[Literal["full", "tiny"]] = None,
        weights: Optional[Literal["native", "fp8", "int8"]] = None,
        threads: Optional[int] = None,
        policy: Optional[str] = None,
        allocator: Optional[Literal["planned", "pytorch", "expandable"]] = None,
        *,
        capacity: Optional[_Size] = None,
        kv_budget: Optional[_Size] = None,
        max_sessions: Optional[int] = None,
        tiny_decoder: Optional[_Path] = None,
        transformer: Optional[str] = None,
        plan_cache: Optional[_Path] = None,
    ) -> None: ...
    def session(
        self,
        prompt: Optional[str] = None,
        image: Optional[_Image] = None,
        seed: int = 0,
        frames: Optional[_Frames] = None,
        actions: Optional[Union[str, Sequence[str]]] = None,
        width: Optional[int] = None,
        height: Optional[int] = None,
        *,
        steps: int = ...,
        flow_shift: float = ...,
        overlap: bool = ...,
        reuse_last_step_kv: bool = ...,
        camera_guidance: float = ...,
        decoder: Literal["full", "tiny"] = ...,
        text_embeds: npt.NDArray[np.float32] = ...,
    ) -> Session: ...
    def resume(self, state: Union[SessionState, _Path]) -> Session: ...
    def memory_stats(self) -> dict[str, int]: ...
    def memory_snapshot(self) -> dict[str, Any]: ...
    def record_memory_history(self, max_entries: int = ...) -> None: ...
    def reset_peak_memory_stats(self) -> None: ...
    def first_frame(
        self,
        image: Optional[_Image] = None,
        width: Optional[int] = None,
        height: Optional[int] = None,
    ) -> npt.NDArray[np.uint8]: ...
    @property
    def native_size(self) -> Optional[tuple[int, int]]: ...
    @property
    def model(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def resident_bytes(self) -> int: ...

def plan(
    model: str = "lingbot-world-v2-14b",
    width: Optional[int] = None,
    height: Optional[int] = None,
    frames: Optional[_Frames] = None,
    tp: int = 1,
    sp: int = 1,
    capacity: Optional[_Size] = None,
    policies: Optional[Union[str, Sequence[str]]] = None,
    *,
    allocator: str = "planned",
    dtype: str = "auto",
    weights: str = "native",
    decoder: str = "full",
    tiny_decoder: Optional[_Path] = None,
    transformer: Optional[str] = None,
    kv_fraction: Optional[float] = None,
    chunks: Optional[int] = None,
    measure: bool = False,
) -> dict[str, Any]: ...
def replay(
    trace: _Path,
    allocator: str = "planned",
    policy: str = "before-decode",
    *,
    capacity: Optional[_Size] = None,
    max_split_size: Optional[_Size] = None,
    snapshot: Optional[_Path] = None,
) -> dict[str, Any]: ...
def write_video(path: _Path, frames: Iterable[Union[Chunk, npt.NDArray[np.uint8]]]) -> int: ...
def next_chunks(sessions: Sequence[Session]) -> list[Optional[Chunk]]:
    """The next chunk of each session as one batched round (``None``: it had finished).

    A session that fails raises its error, whose ``chunks`` holds the others' chunks.
    """
def threads() -> int: ...
