"""Sphinx configuration of the attngeom API reference (``make docs``).

The reference is built from the docstrings of the installed package; numpydoc renders
their Parameters / Returns / Examples sections. ``make docs`` and the test suite build it
with warnings as errors.
"""
import attngeom

project = "attngeom"
author = "the attngeom developers"
copyright = "2025-2026, the attngeom developers"
release = attngeom.__version__
version = release

extensions = ["sphinx.ext.autodoc", "sphinx.ext.mathjax", "numpydoc"]
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()  # validation runs in tests/test_docs.py
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = []
suppress_warnings = []
