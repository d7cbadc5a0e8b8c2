"""Only the optional C forest walk lives here; everything else is in pyproject.toml.

``optional=True``: where no C compiler is found the install still succeeds and the predictor uses
its numpy walk (predictor/trees.py), which gives the same answers, only slower.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("predictor._walk", ["predictor/_walk.c"], optional=True)])
