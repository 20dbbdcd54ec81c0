"""Fixtures of the shipped model and data, the trained tiny_cnn and 8 generated shapes; a test module
takes them by name: `from shapes_fixtures import data, model`."""

from __future__ import annotations

import pytest

SHAPES = 8  # items of hookrun.data.shapes the fixtures hold


@pytest.fixture(scope="module")
def model():
    from hookrun.models.tiny_cnn import tiny_cnn

    return tiny_cnn()


@pytest.fixture(scope="module")
def data():
    from hookrun.data.shapes import shapes

    return shapes(SHAPES)
