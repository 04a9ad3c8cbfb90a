"""Bad input raises the named exception: ValueError naming the field, MemoryError with
the planned and free bytes, FileNotFoundError / headroom.CheckpointError for files."""

import pytest

import headroom


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(width=50), "width"),
        (dict(frames=10), "num_frames"),
        (dict(steps=0), "steps"),
        (dict(actions="wq"), "actions"),
        (dict(prompt="a red door"), "prompt"),
        (dict(decoder="huge"), "decoder"),
        (dict(image=__import__("numpy").zeros((96, 128, 4), "uint8")), "image"),
    ],
)
def test_a_bad_request_is_a_value_error_naming_the_field(world, kwargs, field):
    with pytest.raises(ValueError) as err:
        world.session(**kwargs)
    assert isinstance(err.value, headroom.RequestError)
    assert field in err.value.field.split("/")
    assert field in str(err.value)


def test_an_unknown_argument_is_a_type_error(world):
    with pytest.raises(TypeError, match="colour"):
        world.session(colour="red")
    with pytest.raises(TypeError):
        world.session(image=42)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(model="no-such-model"), "model"),
        (dict(policy="sometimes"), "policy"),
        (dict(allocator="magic"), "allocator"),
        (dict(dtype="f8"), "dtype"),
        (dict(weights="int3"), "weights"),
        (dict(device="tpu"), "device"),
        (dict(capacity="lots"), "capacity"),
        (dict(threads=0), "threads"),
    ],
)
def test_a_bad_engine_argument_is_a_value_error_naming_it(kwargs, field):
    kwargs.setdefault("model", "tiny")
    with pytest.raises(ValueError) as err:
        headroom.Engine(**kwargs)
    assert err.value.field == field


def test_a_session_that_does_not_fit_is_a_memory_error_with_its_bytes():
    engine = headroom.Engine("world", capacity="80MiB")
    with pytest.raises(MemoryError) as err:
        engine.session(frames=33)
    e = err.value
    assert isinstance(e, headroom.OutOfMemoryError)
    assert e.kind == "planned_peak"
    assert e.planned_bytes > e.free_bytes >= 0
    # Refused whole: the engine serves a session that fits.
    assert engine.memory_stats()["num_ooms"] == 0


def test_missing_files_are_file_not_found():
    with pytest.raises(FileNotFoundError):
        headroom.Engine("./no/such/folder")
    with pytest.raises(FileNotFoundError):
        headroom.Engine("tiny", tiny_decoder="/no/such/taew2_1.pth")
    with pytest.raises(FileNotFoundError):
        headroom.replay("/no/such/trace.pickle")


def test_a_bad_snapshot_is_a_checkpoint_error(world, tmp_path):
    with pytest.raises(FileNotFoundError):
        world.resume(tmp_path / "missing.hrsnap")
    (tmp_path / "junk.hrsnap").write_bytes(b"not a snapshot at all" * 10)
    with pytest.raises(headroom.CheckpointError) as err:
        world.resume(tmp_path / "junk.hrsnap")
    assert err.value.kind in {"corrupt", "truncated", "version"}
    # A snapshot of another model does not fit this engine.
    tiny = headroom.Engine("tiny")
    with tiny.session(width=48, height=32, frames=21) as s:
        next(s)
        s.snapshot().save(tmp_path / "tiny.hrsnap")
    with pytest.raises(headroom.CheckpointError) as err:
        world.resume(tmp_path / "tiny.hrsnap")
    assert err.value.kind == "mismatch"


def test_a_bad_checkpoint_is_a_checkpoint_error(tmp_path):
    import shutil

    from conftest import ROOT

    folder = tmp_path / "world"
    for part in ("transformer", "vae"):
        shutil.copytree(ROOT / "models" / "world" / part, folder / part)
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 1 << 16])
    with pytest.raises(headroom.CheckpointError):
        headroom.Engine(str(folder))
    # A folder without its weights is a checkpoint that cannot be read, naming them.
    weights.unlink()
    with pytest.raises(headroom.CheckpointError, match="safetensors"):
        headroom.Engine(str(folder))


def test_steering_a_scripted_session_names_the_rule(world):
    with world.session(frames=21, actions="ww") as s:
        with pytest.raises(ValueError) as err:
            s.interact(keys="w")
    assert err.value.field == "interaction"
    with world.session(frames=9) as s:
        with pytest.raises(ValueError) as err:
            s.interact(keys="wq")
        assert err.value.field == "keys"
        with pytest.raises(ValueError):
            s.set_prompt("a field of wheat")
