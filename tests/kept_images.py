"""Removing the images the docker tests make, for the test files that make them."""

from __future__ import annotations

import os


def keep_test_images() -> bool:
    """REPRO_KEEP_TEST_IMAGES=1 keeps them for the next session's layer cache."""
    return os.environ.get("REPRO_KEEP_TEST_IMAGES") == "1"


def remove_unless_kept(docker_client, ref: str, *, force: bool = False) -> None:
    """Remove one of the suite's images (by tag or id) once its tests are done, unless
    ``keep_test_images()``; one already gone is fine, one still in use is left, said."""
    import docker.errors

    if keep_test_images():
        return
    try:
        docker_client.images.remove(ref, force=force)
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:  # e.g. still used by a container: say so, go on
        print(f"test images: {ref} left in place: {exc}")
