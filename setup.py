"""The packages of hookrun, found rather than listed (a new kind's folder needs no edit here); the
metadata is pyproject.toml's. conf/ ships inside the wheel as hookrun.conf."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["hookrun", "hookrun.*"]), "hookrun.conf"])
