#!/usr/bin/env python3
"""Writes a few valid inputs per fuzz target into <out>/<target>/ (standard library only).

    python3 fuzz/seeds/make_seeds.py fuzz/work/seeds

The fuzzers start from these, and the minimised corpora in fuzz/corpus/ grow from them.
Pickles that name torch globals are made with stand-in `torch` modules, so no torch is
needed; the zip layout follows torch.save (stored entries under `archive/`).
"""
import base64
import collections
import io
import json
import os
import pickle
import struct
import sys
import types
import zipfile
import zlib

OUT = sys.argv[1] if len(sys.argv) > 1 else "fuzz/work/seeds"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def copy(target, name, path):
    with open(os.path.join(ROOT, path), "rb") as f:
        put(target, name, f.read())


# ---- stand-in torch for pickling checkpoints -------------------------------------------
torch = types.ModuleType("torch")
torch_utils = types.ModuleType("torch._utils")
sys.modules["torch"] = torch
sys.modules["torch._utils"] = torch_utils
torch._utils = torch_utils


def _make_storage(name):
    cls = type(name, (), {})
    cls.__module__ = "torch"
    setattr(torch, name, cls)
    return cls


STORAGE = {
    k: _make_storage(k)
    for k in ["FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage",
              "LongStorage", "IntStorage", "ByteStorage", "BoolStorage"]
}
SIZES = {"FloatStorage": 4, "DoubleStorage": 8, "HalfStorage": 2, "BFloat16Storage": 2,
         "LongStorage": 8, "IntStorage": 4, "ByteStorage": 1, "BoolStorage": 1}


def _rebuild_tensor_v2(*a):
    raise NotImplementedError


def _rebuild_parameter(*a):
    raise NotImplementedError


_rebuild_tensor_v2.__module__ = "torch._utils"
_rebuild_parameter.__module__ = "torch._utils"
torch_utils._rebuild_tensor_v2 = _rebuild_tensor_v2
torch_utils._rebuild_parameter = _rebuild_parameter


class Storage:
    def __init__(self, kind, key, numel):
        self.kind, self.key, self.numel = kind, key, numel


class Tensor:
    def __init__(self, storage, offset, size, param=False):
        self.storage, self.offset, self.size, self.param = storage, offset, size, param

    def __reduce_ex__(self, proto):
        stride, s = [], 1
        for d in reversed(self.size):
            stride.insert(0, s)
            s *= d
        inner = (_rebuild_tensor_v2,
                 (self.storage, self.offset, tuple(self.size), tuple(stride), False,
                  collections.OrderedDict()))
        if self.param:
            return (_rebuild_parameter, (Tensor(self.storage, self.offset, self.size), False,
                                         collections.OrderedDict()))
        return inner


class TorchPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", STORAGE[obj.kind], obj.key, "cpu", obj.numel)
        return None


def torch_pickle(obj, protocol=2):
    buf = io.BytesIO()
    TorchPickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()


def pth(state, storages, root="archive"):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(f"{root}/data.pkl", torch_pickle(state))
        z.writestr(f"{root}/byteorder", "little")
        for key, data in storages.items():
            z.writestr(f"{root}/data/{key}", data)
        z.writestr(f"{root}/version", "3\n")
    return buf.getvalue()


# ---- pickle ---------------------------------------------------------------------------
plain = {"segments": [{"address": 1 << 40, "total_size": 2 << 20, "stream": 0,
                       "blocks": [{"size": 512, "state": "active_allocated",
                                   "frames": [{"filename": "a.py", "line": 3, "name": "f"}]}]}],
         "device_traces": [[]], "neg": -5, "big": 1 << 62, "f": 1.5, "t": (1, 2, 3),
         "b": b"\x00\x01", "none": None, "yes": True, "set": {1, 2}}
for proto in (2, 3, 4):
    put("pickle", f"plain_p{proto}", pickle.dumps(plain, protocol=proto))
shared = [1, 2]
put("pickle", "memo_shared", pickle.dumps({"a": shared, "b": shared, "c": (shared, shared)}, 2))
put("pickle", "torch_state", torch_pickle(collections.OrderedDict(
    w=Tensor(Storage("FloatStorage", "0", 4), 0, [2, 2]))))
copy("pickle", "torch_snapshot_small", "crates/mem/tests/fixtures/torch_snapshot_small.pickle")

# ---- pth ------------------------------------------------------------------------------
f32 = struct.pack("<6f", *range(6))
put("pth", "float_state", pth(collections.OrderedDict(
    [("a.w", Tensor(Storage("FloatStorage", "0", 6), 2, [2, 2])),
     ("a.b", Tensor(Storage("FloatStorage", "0", 6), 0, [2])),
     ("step", 3)]), {"0": f32}))
put("pth", "nested_dtypes", pth({
    "ema": collections.OrderedDict(
        [("h", Tensor(Storage("HalfStorage", "1", 4), 0, [4], param=True)),
         ("l", Tensor(Storage("LongStorage", "2", 2), 0, [2, 1])),
         ("d", Tensor(Storage("DoubleStorage", "3", 1), 0, [])),
         ("u", Tensor(Storage("ByteStorage", "4", 3), 0, [3]))])},
    {"1": b"\x00" * 8, "2": b"\x01" * 16, "3": struct.pack("<d", 2.5), "4": b"abc"}, root="m"))

# ---- safetensors ----------------------------------------------------------------------


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


put("safetensors", "mixed", safetensors({
    "w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
    "h": ("F16", [3], b"\x00\x3c" * 3),
    "b": ("BF16", [1, 2], b"\x80\x3f" * 2),
    "d": ("F64", [1], struct.pack("<d", 1.0)),
    "u": ("U8", [4], b"\x01\x02\x03\x04"),
    "i": ("I64", [], struct.pack("<q", 7)),
}, {"format": "pt"}))
put("safetensors", "unsupported_i32", safetensors({"x": ("I32", [2], b"\x00" * 8)}))
put("safetensors", "empty", safetensors({}))
put("safetensors", "zero_axis", safetensors({"z": ("F16", [2, 0, 3], b"")}))

# ---- npy ------------------------------------------------------------------------------


def npy(descr, shape, raw, version=1):
    shape_s = "(" + "".join(f"{d}, " for d in shape).rstrip(" ") + ")" if len(shape) != 1 \
        else f"({shape[0]},)"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_s}, }}"
    pre = 6 + 2 + (2 if version == 1 else 4)
    header += " " * ((64 - (pre + len(header) + 1) % 64) % 64) + "\n"
    size = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + size + header.encode() + raw


put("npy", "f4_2x3", npy("<f4", [2, 3], struct.pack("<6f", *range(6))))
put("npy", "f8_3", npy("<f8", [3], struct.pack("<3d", 1, 2, 3)))
put("npy", "f2_scalar", npy("<f2", [], b"\x00\x3c"))
put("npy", "u1_v2", npy("|u1", [4], b"abcd", version=2))
put("npy", "i8_v3", npy("<i8", [1, 1], struct.pack("<q", -1), version=3))
put("npy", "zero_axis", npy("<f2", [2, 0, 3], b""))

# ---- camera ---------------------------------------------------------------------------
for i, s in enumerate(["wwaa-d", "w+d.s+a", "ijkl", "W+D+", ""]):
    put("camera", f"keys_{i}", b"\x00" + s.encode())
ident = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
moved = [[0, -1, 0, 1], [1, 0, 0, 2], [0, 0, 1, 3], [0, 0, 0, 1]]
put("camera", "trajectory", b"\x01" + json.dumps(
    {"poses": [ident, moved], "intrinsics": [[500, 500, 416, 240]] * 2}).encode())
put("camera", "trajectory_poses_only", b"\x01" + json.dumps({"poses": [ident]}).encode())
poses = npy("<f4", [2, 4, 4], struct.pack("<32f", *(sum(ident, []) + sum(moved, []))))
intr = npy("<f4", [2, 4], struct.pack("<8f", *([500, 500, 416, 240] * 2)))
put("camera", "lingbot", b"\x02" + struct.pack("<I", len(poses)) + poses + intr)

# ---- config ---------------------------------------------------------------------------
copy("config", "transformer", "models/world/transformer/config.json")
copy("config", "vae", "models/world/vae/config.json")
copy("config", "text_encoder", "crates/text/tests/fixtures/text_encoder/config.json")
put("config", "empty", "{}")

# ---- image ----------------------------------------------------------------------------


def png(w, h, color_type, bit_depth, rows, plte=None):
    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    raw = b"".join(b"\x00" + r for r in rows)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth,
                                                           color_type, 0, 0, 0))
    if plte:
        out += chunk(b"PLTE", plte)
    return out + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


pngs = {
    "rgb_3x2": png(3, 2, 2, 8, [bytes(range(9)), bytes(range(9, 18))]),
    "gray_4x1": png(4, 1, 0, 8, [b"\x00\x40\x80\xff"]),
    "rgba16_1x1": png(1, 1, 6, 16, [b"\x01\x02\x03\x04\x05\x06\xff\xff"]),
    "palette_2x2": png(2, 2, 3, 8, [b"\x00\x01", b"\x01\x00"], plte=b"\xff\x00\x00\x00\xff\x00"),
    "sliver_1x64": png(1, 64, 0, 8, [b"\x80"] * 64),
    "sliver_1x256": png(1, 256, 0, 8, [b"\x80"] * 256),
}
for name, data in pngs.items():
    put("image", name, data)
jpeg_path = os.environ.get("HEADROOM_FUZZ_JPEG")
jpeg = open(jpeg_path, "rb").read() if jpeg_path else None
if jpeg:
    put("image", "small_jpeg", jpeg)

# ---- image_url ------------------------------------------------------------------------


def url(side_w, side_h, mime, data):
    return bytes([side_w, side_h]) + f"data:{mime};base64,".encode() + base64.b64encode(data)


put("image_url", "png", url(0, 0, "image/png", pngs["rgb_3x2"]))
put("image_url", "png_wide", url(100, 56, "image/PNG;charset=x", pngs["sliver_1x64"]))
# A thin image covering a wide frame: once a 2.8 GB scale before the crop (fixed).
put("image_url", "thin_cover", url(255, 0, "image/png", pngs["sliver_1x256"]))
if jpeg:
    put("image_url", "jpeg", url(1, 2, "image/jpeg", jpeg))
put("image_url", "https", b"\x00\x00https://example.com/a.png")

# ---- protocol -------------------------------------------------------------------------
msgs = [
    {"type": "session.start", "model": "small", "prompt": "a cat", "width": 416, "height": 240,
     "num_frames": 21, "fps": 16, "seed": 7, "num_inference_steps": 4, "flow_shift": 5.0,
     "format": "m4s",
     "image_reference": {"image_url": {"url": "data:image/png;base64,AAAA"}},
     "extra_params": {"camera_action_script": [["w", "wd", ["a", "s"]], ["-", "i", "jk"]],
                      "overlap": True, "camera_guidance": 2.0, "decoder": "tiny"}},
    {"type": "session.start", "size": "832x480", "sampling_params": {"seed": 3.0, "fps": 24},
     "extra_params": {"flow_shift": 3}},
    {"type": "session.interaction", "interaction": {
        "event_id": "e1", "transition_chunks": 2, "event": {
            "prompt": "turn", "multi_modal_data": {"camera": {
                "mode": "target", "data": {"translation": [1, 0, 0],
                                           "rotation": [0, 0.7071, 0, 0.7071]}}}}}},
    {"type": "session.interaction", "interaction": {"event": {"multi_modal_data": {
        "camera": {"mode": "velocity", "data": {"translation": [0, 0, 0.1]}}}}}},
    {"type": "session.ping"},
    {"type": "session.stop"},
]
for i, m in enumerate(msgs):
    put("protocol", f"msg_{i}", json.dumps(m))
