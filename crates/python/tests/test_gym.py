"""A world as a Gymnasium environment: registered, checked by check_env, one chunk a
step, branching through clone_state / restore_state, and a vector of worlds stepped as
one batched round equal to the same worlds stepped alone."""

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import headroom
import headroom.gym as hg

ACTIONS = np.array(
    [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0, 0, 1],
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],
    ],
    dtype=np.int8,
)


@pytest.fixture(scope="module")
def env():
    env = gymnasium.make("headroom/World-v0", max_episode_steps=3)
    yield env
    env.close()


def test_check_env_passes(env):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, skip_render_check=False)


def test_a_step_is_a_chunk_and_truncates_at_max_episode_steps(env):
    obs, info = env.reset(seed=5)
    assert env.observation_space.contains(obs)
    assert np.array_equal(obs, env.unwrapped.engine.first_frame())
    sizes = []
    for i in range(3):
        obs, reward, terminated, truncated, info = env.step(ACTIONS[i])
        assert env.observation_space.contains(obs)
        assert reward == 0.0 and not terminated
        assert np.array_equal(obs, info["frames"][-1])
        sizes.append(info["frames"].shape[0])
        assert truncated == (i == 2)
    assert sizes == [9, 12, 12]


def test_reset_takes_an_image(env):
    pixels = np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    obs, _ = env.reset(seed=1, options={"image": pixels})
    assert np.array_equal(obs, pixels)
    a = env.step(ACTIONS[0])[0]
    env.reset(seed=1)
    b = env.step(ACTIONS[0])[0]
    assert not np.array_equal(a, b)


def test_clone_state_branches_a_world(env):
    env.reset(seed=2)
    env.step(ACTIONS[0])
    state = env.unwrapped.clone_state()
    left = [env.step(ACTIONS[1])[0] for _ in range(2)]
    env.unwrapped.restore_state(state)
    again = [env.step(ACTIONS[1])[0] for _ in range(2)]
    env.unwrapped.restore_state(state)
    right = env.step(ACTIONS[2])[0]
    assert all(np.array_equal(a, b) for a, b in zip(left, again))
    assert not np.array_equal(left[0], right)


def test_a_vectorised_step_of_4_equals_4_single_steps():
    venv = gymnasium.make_vec(
        "headroom/World-v0", num_envs=4, vectorization_mode="vector_entry_point"
    )
    assert isinstance(venv.unwrapped, hg.WorldVectorEnv)
    obs, _ = venv.reset(seed=20)
    steps = [venv.step(ACTIONS), venv.step(ACTIONS[::-1])]
    assert steps[0][0].shape == (4, 96, 128, 3)
    assert (steps[0][1] == 0).all() and not steps[0][3].any()
    engine = venv.unwrapped.engine
    venv.close()
    single = hg.WorldEnv(engine=engine)
    for i in range(4):
        first, _ = single.reset(seed=20 + i)
        assert np.array_equal(first, obs[i])
        for k, actions in enumerate([ACTIONS, ACTIONS[::-1]]):
            o, _, _, _, info = single.step(actions[i])
            assert np.array_equal(o, steps[k][0][i]), (i, k)
            assert np.array_equal(info["frames"], steps[k][4]["frames"][i])
    single.close()


def test_the_vector_resets_a_truncated_world_on_the_next_step():
    venv = hg.WorldVectorEnv(2, max_episode_steps=1)
    obs, _ = venv.reset(seed=0)
    _, _, _, truncated, _ = venv.step(ACTIONS[:2])
    assert truncated.all()
    again, rewards, _, truncated, _ = venv.step(ACTIONS[:2])
    assert np.array_equal(again, obs) and not truncated.any() and (rewards == 0).all()
    venv.close()


def test_a_bad_action_names_its_shape(env):
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(np.zeros(3, dtype=np.int8))
