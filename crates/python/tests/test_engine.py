"""The engine from Python: the same bytes as `headroom generate`, frames as numpy,
steering between chunks, the GIL released and Ctrl-C stopping a chunk."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import headroom


def frames_of(session):
    return [np.array(c.frames) for c in session]


@pytest.mark.parametrize(
    "model,args",
    [
        ("tiny", dict(width=48, height=32, frames=21, seed=7)),
        ("world", dict(frames=21, seed=7, actions="wwdd+ll")),
    ],
)
def test_session_frames_equal_generate_byte_for_byte(model, args, cli, tmp_path):
    flags = ["generate", "--model", model, "--frames", str(args["frames"]), "--seed", "7"]
    if "width" in args:
        flags += ["--width", str(args["width"]), "--height", str(args["height"])]
    if "actions" in args:
        flags += ["--actions", args["actions"]]
    cli(*flags, "--out", str(tmp_path / "cli.y4m"))
    cli(*flags, "--out", str(tmp_path / "png"))
    engine = headroom.Engine(model)
    with engine.session(**args) as session:
        chunks = list(session)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert [c.frames.shape[0] for c in chunks] == [9] + [12] * (len(chunks) - 1)
    written = headroom.write_video(tmp_path / "py.y4m", chunks)
    assert written == args["frames"]
    assert (tmp_path / "py.y4m").read_bytes() == (tmp_path / "cli.y4m").read_bytes()
    # The PNG frames hold the RGB bytes themselves.
    from PIL import Image

    video = np.concatenate([c.frames for c in chunks])
    pngs = sorted((tmp_path / "png").iterdir())
    assert len(pngs) == len(video)
    for frame, png in zip(video, pngs):
        assert np.array_equal(frame, np.asarray(Image.open(png).convert("RGB")))


def test_chunks_are_read_only_uint8_views_with_timings_and_memory(world):
    with world.session(frames=9) as session:
        assert session.chunks_total == 1
        chunk = next(session)
        with pytest.raises(StopIteration):
            next(session)
    assert chunk.frames.dtype == np.uint8 and chunk.frames.shape == (9, 96, 128, 3)
    assert not chunk.frames.flags.writeable
    assert isinstance(chunk.frames.base, headroom._headroom.FrameBuffer)
    assert set(chunk.timings) == {"total", "denoise", "commit", "decode"}
    assert chunk.timings["total"] >= chunk.timings["denoise"] > 0
    assert chunk.memory["allocated_bytes.all.current"] > 0
    assert session.closed


def test_image_as_numpy_pil_or_path_conditions_alike(world, tmp_path):
    from PIL import Image

    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "first.png")
    videos = []
    for image in (pixels, Image.fromarray(pixels), tmp_path / "first.png", str(tmp_path / "first.png")):
        with world.session(image=image, frames=9) as s:
            videos.append(frames_of(s)[0])
    for v in videos[1:]:
        assert np.array_equal(v, videos[0])
    with world.session(frames=9) as s:
        own = frames_of(s)[0]
    assert not np.array_equal(own, videos[0])
    # What a session opened with the image starts from.
    assert np.array_equal(world.first_frame(image=pixels), pixels)


def test_interact_acts_from_the_next_chunk(world):
    def run(keys):
        with world.session(frames=21) as s:
            first = np.array(next(s).frames)
            if keys is not None:
                s.interact(keys=keys)
            return first, np.array(next(s).frames)

    still = run(None)
    moved = run("wl")
    assert np.array_equal(still[0], moved[0])
    assert not np.array_equal(still[1], moved[1])
    # An explicit camera, as the server's session.interaction takes it.
    with world.session(frames=21) as s:
        next(s)
        s.interact(camera={"mode": "velocity", "translation": [0, 0, 0.05], "rotation": [0, 0, 0, 1]})
        next(s)


def test_close_gives_the_session_memory_back(world):
    before = world.memory_stats()["allocated_bytes.all.current"]
    session = world.session(frames="until-stop")
    next(session)
    assert world.memory_stats()["allocated_bytes.all.current"] > before
    session.close()
    assert session.closed
    with pytest.raises(StopIteration):
        next(session)
    assert world.memory_stats()["allocated_bytes.all.current"] == before


def test_snapshot_resumes_to_the_same_bytes(world, tmp_path):
    with world.session(frames=33) as s:
        next(s)
        state = s.snapshot()
        rest = frames_of(s)
    assert state.chunks_done == 1 and state.state_bytes > 0
    with world.resume(state) as again:
        assert all(np.array_equal(a, b) for a, b in zip(frames_of(again), rest))
    state.save(tmp_path / "s.hrsnap")
    with world.resume(tmp_path / "s.hrsnap") as from_file:
        assert all(np.array_equal(a, b) for a, b in zip(frames_of(from_file), rest))


def test_the_gil_is_released_while_a_chunk_computes(world):
    counted = []
    stop = threading.Event()

    def count():
        n = 0
        while not stop.is_set():
            n += 1
            time.sleep(0.001)
        counted.append(n)

    with world.session(frames=9) as s:
        t = threading.Thread(target=count)
        t.start()
        start = time.perf_counter()
        next(s)
        elapsed = time.perf_counter() - start
        stop.set()
        t.join()
    # A thread that could not take the GIL would have counted next to nothing.
    assert elapsed > 0.05 and counted[0] > 10


def test_ctrl_c_stops_a_chunk_at_its_next_safe_point(world):
    session = world.session(frames="until-stop")
    next(session)

    def interrupt_once_computing():
        # The session refuses other threads while its chunk computes: then it is.
        while True:
            try:
                session.closed
            except RuntimeError:
                break
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt_once_computing)
    start = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        next(session)
    stopped = time.perf_counter() - start
    timer.join()
    # The session is over, as a cancelled chunk ends it under the CLI.
    with pytest.raises(StopIteration):
        next(session)
    session.close()
    assert stopped < 30.0
    # The engine goes on serving.
    with world.session(frames=9) as s:
        assert next(s).frames.shape[0] == 9


def test_batched_rounds_equal_sessions_alone_past_the_condition_settling(world):
    # The image condition settles (stops being encoded) at block 9 on `world`; sessions
    # of one first frame stepped together share its encode until then.
    engine = headroom.Engine("world", max_sessions=2)
    args = dict(frames="until-stop", width=64, height=48)
    sessions = [engine.session(seed=s, **args) for s in (1, 2)]
    rounds = [headroom.next_chunks(sessions) for _ in range(11)]
    for s in sessions:
        s.close()
    for k, seed in enumerate((1, 2)):
        with engine.session(seed=seed, **args) as alone:
            for r in rounds:
                assert np.array_equal(next(alone).frames, r[k].frames)


def test_next_chunks_gives_none_for_a_finished_session(tiny):
    engine = headroom.Engine("tiny", max_sessions=2)
    short = engine.session(width=48, height=32, frames=9)
    long = engine.session(width=48, height=32, frames=21)
    first = headroom.next_chunks([short, long])
    second = headroom.next_chunks([short, long])
    assert [c.frames.shape[0] for c in first] == [9, 9]
    assert second[0] is None and second[1].frames.shape[0] == 12
    short.close()
    long.close()


def test_set_prompt_acts_from_the_next_chunk(tiny):
    def run(prompt):
        with tiny.session(width=48, height=32, frames=21, prompt="a red door") as s:
            first = np.array(next(s).frames)
            if prompt is not None:
                s.set_prompt(prompt)
            return first, np.array(next(s).frames)

    kept, changed = run(None), run("a field of wheat")
    assert np.array_equal(kept[0], changed[0])
    assert not np.array_equal(kept[1], changed[1])
