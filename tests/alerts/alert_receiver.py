"""A real HTTP receiver for notifications: Alertmanager's API v2 path and a generic hook."""

from __future__ import annotations

import threading

from fastapi import FastAPI, Request


class Captured:
    """Bodies POSTed to the receiver app, in arrival order (thread-safe)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, object]] = []
        self.lock = threading.Lock()

    def bodies(self, path: str) -> list:
        with self.lock:
            return [body for p, body in self.posts if p == path]


def receiver_app(captured: Captured) -> FastAPI:
    """A real HTTP receiver: Alertmanager's ``POST /api/v2/alerts`` and a generic ``/hook``."""
    app = FastAPI()

    @app.post("/api/v2/alerts")
    async def alertmanager(request: Request) -> dict:
        body = await request.json()  # read before the lock: held across an await, a second post on
        with captured.lock:  # the same event loop would block the loop on it, and the first never resume
            captured.posts.append(("/api/v2/alerts", body))
        return {}

    @app.post("/hook")
    async def hook(request: Request) -> dict:
        body = await request.json()  # read before the lock: held across an await, a second post on
        with captured.lock:  # the same event loop would block the loop on it, and the first never resume
            captured.posts.append(("/hook", body))
        return {}

    return app
