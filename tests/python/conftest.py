"""Fixtures the offload tests share: the image dataset and a pair of daemons."""

from __future__ import annotations

import pytest

from processes import small_image_dataset, two_daemons


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """small_image_dataset(), made once per test file."""
    return small_image_dataset(tmp_path_factory.mktemp("data") / "train")


@pytest.fixture()
def daemons(request, tmp_path):
    """Two offloaders accepting the test file's TOKEN."""
    yield from two_daemons(tmp_path, request.module.TOKEN)
