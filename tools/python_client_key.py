"""A Python realtime-video client, written the way vLLM-Omni's clients are (the
`websockets` package, the key in an `Authorization: Bearer` header), against two running
`headroom serve`s: one started with `--api-key KEY`, one without. It checks that the keyed
server refuses the client without the key (HTTP 401) and streams it, with the key, the
same bytes and events the open server streams.

    headroom serve --model tiny --port 18123 --api-key sk-local-1 &
    headroom serve --model tiny --port 18124 &
    python tools/python_client_key.py ws://127.0.0.1:18123 ws://127.0.0.1:18124 sk-local-1

Needs `pip install websockets` (any venv; the reference venv has it).
"""

import asyncio
import hashlib
import json
import sys

import websockets

START = {"type": "session.start", "model": "tiny", "num_frames": 21, "seed": 7,
         "width": 64, "height": 48}


async def stream(base, key):
    """Streams one session; returns the SHA-256 of its binary frames and its event types."""
    kw = {"max_size": None}
    if key is not None:
        kw["additional_headers"] = {"Authorization": f"Bearer {key}"}
    async with websockets.connect(f"{base}/v1/realtime/video", **kw) as ws:
        await ws.send(json.dumps(START))
        digest, events = hashlib.sha256(), []
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                digest.update(msg)
                continue
            event = json.loads(msg)
            events.append(event["type"])
            if event["type"] in ("session.done", "error"):
                return digest.hexdigest(), events


async def main(keyed, open_, key):
    try:
        await stream(keyed, None)
        sys.exit("the keyed server accepted a client without the key")
    except websockets.InvalidStatus as refused:
        status = refused.response.status_code
        print(f"without the key: HTTP {status}")
        if status != 401:
            sys.exit("expected 401")
    with_key = await stream(keyed, key)
    unkeyed = await stream(open_, None)
    print(f"with the key:    {with_key[0][:16]}… {with_key[1]}")
    print(f"open server:     {unkeyed[0][:16]}… {unkeyed[1]}")
    if with_key != unkeyed:
        sys.exit("the keyed stream differs from the open server's")
    print("same bytes and events")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    asyncio.run(main(*sys.argv[1:]))
