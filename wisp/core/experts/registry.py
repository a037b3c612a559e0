"""One registry per axis of variation (residencies, miss policies): a dict from name to class, filled by a
decorator that also gives the class its `name`."""

from __future__ import annotations


def registrar(table: dict):
    """`@registrar(TABLE)("name")` on a class: TABLE["name"] = the class, and the class's `name` is "name"."""
    def register_as(name: str):
        def register(cls):
            cls.name = name
            table[name] = cls
            return cls
        return register
    return register_as
