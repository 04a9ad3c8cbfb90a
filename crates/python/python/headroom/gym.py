"""A headroom world as a Gymnasium environment.

One ``step`` is one chunk: one block of the model (3 latent frames; 12 video frames,
the first block 9). The model denoises a block as a whole, so the action (the camera
keys held) holds over the block. The observation is the block's last frame; all of its
frames are in ``info["frames"]``. No reward is invented: it is 0 unless a wrapper gives
one. ``reset`` opens a new session from the model's own first frame, or from
``options={"image": ...}`` (a numpy array, a PIL image or a path).

``WorldEnv`` is registered as ``headroom/World-v0``; ``WorldVectorEnv(n)`` steps n
worlds as one batched round of the engine (each world's frames are the bytes it makes
alone), also reached by ``gymnasium.make_vec("headroom/World-v0", num_envs=n,
vectorization_mode="vector_entry_point")``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

import headroom

#: The camera keys of the action, in order: move forward / left / back / right, pitch
#: up, yaw left, pitch down, yaw right.
KEYS = ("w", "a", "s", "d", "i", "j", "k", "l")

#: The environment id.
ENV_ID = "headroom/World-v0"


def register() -> None:
    """Registers ``headroom/World-v0`` (and its vector entry point) with Gymnasium."""
    if ENV_ID in gymnasium.registry:
        return
    gymnasium.register(
        id=ENV_ID,
        entry_point="headroom.gym:WorldEnv",
        vector_entry_point="headroom.gym:WorldVectorEnv",
        max_episode_steps=100,
        disable_env_checker=True,
    )


def keys_of(action: Any) -> str:
    """The keys an action holds: ``MultiBinary`` over :data:`KEYS` to ``"wd"``."""
    bits = np.asarray(action).reshape(-1)
    if bits.shape != (len(KEYS),):
        raise ValueError(f"action: must be {len(KEYS)} bits over {KEYS}, got shape {bits.shape}")
    return "".join(k for k, b in zip(KEYS, bits) if b)


def _session_seed(rng: np.random.Generator) -> int:
    """The session's noise seed, drawn from the environment's generator."""
    return int(rng.integers(0, 2**63 - 1))


class _World:
    """One world: its session, its step count and the seed it was opened with."""

    def __init__(self, engine: headroom.Engine, width: Optional[int], height: Optional[int]):
        self.engine = engine
        self.width = width
        self.height = height
        self.session: Optional[headroom.Session] = None
        self.steps = 0

    def open(self, seed: int, image: Any = None) -> np.ndarray:
        """A new session from ``image`` (default: the model's first frame); its first frame."""
        self.close()
        self.session = self.engine.session(
            image=image, seed=seed, frames="until-stop", width=self.width, height=self.height
        )
        self.steps = 0
        return self.engine.first_frame(image=image, width=self.width, height=self.height)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


class WorldEnv(gymnasium.Env):
    """A world model as an environment: camera keys in, the world's frames out.

    ``engine`` is shared when given (an engine serves one session per world); otherwise
    one is loaded from ``model`` and ``engine_kwargs`` (``headroom.Engine``'s arguments).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 16}

    def __init__(
        self,
        model: str = "world",
        width: Optional[int] = None,
        height: Optional[int] = None,
        max_episode_steps: Optional[int] = None,
        render_mode: Optional[str] = None,
        engine: Optional[headroom.Engine] = None,
        **engine_kwargs: Any,
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode: must be None or 'rgb_array', got {render_mode!r}")
        self.render_mode = render_mode
        self.engine = engine if engine is not None else headroom.Engine(model, **engine_kwargs)
        native = self.engine.native_size or (416, 240)
        self.width = width or native[0]
        self.height = height or native[1]
        self.max_episode_steps = max_episode_steps
        self.observation_space = spaces.Box(0, 255, (self.height, self.width, 3), np.uint8)
        self.action_space = spaces.MultiBinary(len(KEYS))
        self._world = _World(self.engine, self.width, self.height)
        self._last: Optional[np.ndarray] = None

    def reset(
        self, *, seed: Optional[int] = None, options: Optional[dict] = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        image = (options or {}).get("image")
        obs = self._world.open(_session_seed(self.np_random), image)
        self._last = obs
        return obs, {"frames": obs[None]}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        session = self._world.session
        if session is None:
            raise gymnasium.error.ResetNeeded("call reset() before step()")
        session.interact(keys=keys_of(action))
        chunk = next(session)
        return self._result(chunk)

    def _result(self, chunk: headroom.Chunk) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._world.steps += 1
        obs = np.array(chunk.frames[-1])
        self._last = obs
        truncated = self.max_episode_steps is not None and self._world.steps >= self.max_episode_steps
        info = {"frames": chunk.frames, "chunk": chunk.index}
        return obs, 0.0, False, bool(truncated), info

    def render(self) -> Optional[np.ndarray]:
        return None if self._last is None else np.array(self._last)

    def clone_state(self) -> dict:
        """The world at this step (ALE's ``cloneState``): ``restore_state`` branches from it."""
        session = self._world.session
        if session is None:
            raise gymnasium.error.ResetNeeded("call reset() before clone_state()")
        return {
            "session": session.snapshot(),
            "steps": self._world.steps,
            "last": None if self._last is None else np.array(self._last),
        }

    def restore_state(self, state: dict) -> None:
        """Goes on from ``state`` (from ``clone_state``): the same actions make the same frames."""
        self._world.close()
        self._world.session = self.engine.resume(state["session"])
        self._world.steps = state["steps"]
        self._last = state["last"]

    def close(self) -> None:
        self._world.close()


class WorldVectorEnv(VectorEnv):
    """``num_envs`` worlds on one engine, stepped as one batched round per step.

    Each world's frames are the bytes the same world makes alone (the engine's batched
    rounds never mix rows), so a step of the vector equals ``num_envs`` single steps.
    A truncated world resets on the next step (``AutoresetMode.NEXT_STEP``).
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int = 1,
        model: str = "world",
        width: Optional[int] = None,
        height: Optional[int] = None,
        max_episode_steps: Optional[int] = None,
        engine: Optional[headroom.Engine] = None,
        **engine_kwargs: Any,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs: must be at least 1, got {num_envs}")
        engine_kwargs.setdefault("max_sessions", num_envs)
        self.engine = engine if engine is not None else headroom.Engine(model, **engine_kwargs)
        native = self.engine.native_size or (416, 240)
        self.width = width or native[0]
        self.height = height or native[1]
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        self.single_observation_space = spaces.Box(0, 255, (self.height, self.width, 3), np.uint8)
        self.single_action_space = spaces.MultiBinary(len(KEYS))
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._worlds = [_World(self.engine, self.width, self.height) for _ in range(num_envs)]
        self._rngs: list[np.random.Generator] = [np.random.default_rng() for _ in range(num_envs)]
        self._needs_reset = np.zeros(num_envs, dtype=bool)

    def reset(
        self,
        *,
        seed: Optional[int | Sequence[Optional[int]]] = None,
        options: Optional[dict] = None,
    ) -> tuple[np.ndarray, dict]:
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"seed: {len(seeds)} seeds for {self.num_envs} environments")
        image = (options or {}).get("image")
        obs = []
        for i, s in enumerate(seeds):
            if s is not None:
                self._rngs[i] = np.random.default_rng(s)
            obs.append(self._worlds[i].open(_session_seed(self._rngs[i]), image))
        self._needs_reset[:] = False
        return np.stack(obs), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        actions = np.asarray(actions)
        obs: list[Optional[np.ndarray]] = [None] * self.num_envs
        stepping = []
        for i, world in enumerate(self._worlds):
            if self._needs_reset[i] or world.session is None:
                obs[i] = world.open(_session_seed(self._rngs[i]))
                continue
            world.session.interact(keys=keys_of(actions[i]))
            stepping.append(i)
        truncated = np.zeros(self.num_envs, dtype=bool)
        frames: list[Optional[np.ndarray]] = [None] * self.num_envs
        if stepping:
            chunks = headroom.next_chunks([self._worlds[i].session for i in stepping])
            for i, chunk in zip(stepping, chunks):
                world = self._worlds[i]
                world.steps += 1
                obs[i] = np.array(chunk.frames[-1])
                frames[i] = chunk.frames
                truncated[i] = (
                    self.max_episode_steps is not None and world.steps >= self.max_episode_steps
                )
        self._needs_reset = truncated.copy()
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        return np.stack(obs), rewards, terminated, truncated, {"frames": frames}

    def close_extras(self, **kwargs: Any) -> None:
        for world in self._worlds:
            world.close()


__all__ = ["ENV_ID", "KEYS", "WorldEnv", "WorldVectorEnv", "keys_of", "register"]
