"""A one-file image made with `docker import`: nothing to pull and no debootstrap, for the
docker tests that only tag an image or create (not run) containers from it."""

from __future__ import annotations

import io
import tarfile
import uuid


def import_one_file_image(client, repository: str) -> str:
    """`repository:<random tag>` holding one README; the caller removes it."""
    data = b"repro-kit test image\n"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("README")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    tag = uuid.uuid4().hex[:12]
    client.api.import_image_from_data(buffer.getvalue(), repository=repository, tag=tag)
    return f"{repository}:{tag}"
