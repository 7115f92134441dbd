"""The HTTP floors bench_server measures bucketsearch against, each served by uvicorn with the
same settings as the server (issue 13, item 4):

* ``raw_asgi``: a plain ASGI callable that reads the request body and answers a fixed small
  JSON document: uvicorn's own cost (HTTP parsing, the socket, the event loop);
* ``fastapi_echo()``: a FastAPI app whose one endpoint echoes a small JSON object (the body is
  parsed and validated into a ``dict``, the answer serialized): the framework's floor for a
  JSON endpoint.

    uvicorn --app-dir bench floor_apps:raw_asgi
    uvicorn --app-dir bench --factory floor_apps:fastapi_echo

Both answer any path and method of POST ``/echo``; bench_server sends them the JSON body of a
single-query search.
"""
from __future__ import annotations

from typing import Any

ANSWER = b'{"ok":true}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]


async def raw_asgi(scope, receive, send) -> None:
    """Read the body, answer ``{"ok":true}`` (lifespan messages acknowledged)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def fastapi_echo():
    """``POST /echo``: the JSON object sent, validated as a dict and sent back."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/echo")
    async def echo(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    @app.get("/readyz")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    return app
