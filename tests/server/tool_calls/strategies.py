"""Hypothesis strategies shared by the tool-call tests: JSON values, function names, argument objects."""

from __future__ import annotations

from hypothesis import strategies as st

# text that stresses trimming and UTF-8 cuts: whitespace of several kinds, 2-, 3- and 4-byte characters
TRICKY_CHARS = " \n\t\u3000aZé東🌧\"\\{}:,"

JSON_SCALARS = (st.none() | st.booleans() | st.integers(-10**6, 10**6)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(TRICKY_CHARS, max_size=6))

JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(TRICKY_CHARS, max_size=4),
                                                                                 inner, max_size=3),
    max_leaves=8,
)

ARGUMENTS = st.dictionaries(st.text(TRICKY_CHARS, max_size=5), JSON_VALUES, max_size=4)

FUNCTION_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True)
