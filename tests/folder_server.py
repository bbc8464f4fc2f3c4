"""A folder served over HTTP on 127.0.0.1, for tests whose stand-in is a package or wheel index
(the per-commit wheel server, PyPI's files): the real client code fetches from it."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def serve_folder(root: Path) -> Iterator[str]:
    """Serve ``root`` until the block ends; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
