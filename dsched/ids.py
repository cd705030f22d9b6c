"""Names of things every part of dsched agrees on: operators and instances.

An instance is ``(app, operator, instance index)`` everywhere: in a report, a
cap directive, a cgroup path (``<app>/<worker>/<operator>-<index>`` under the
agent's root), the decision record and a placement plan. Its text form
``app/operator/index`` is what humans and JSON see.
"""

from __future__ import annotations

from typing import NamedTuple


# Keys are NamedTuples rather than dataclasses: an epoch hashes and compares
# them for every instance many times, and tuples do that in C.
class OperatorKey(NamedTuple):
    app: str
    operator: str

    def __str__(self) -> str:
        return f"{self.app}/{self.operator}"


class InstanceKey(NamedTuple):
    app: str
    operator: str
    instance: int

    @property
    def operator_key(self) -> OperatorKey:
        return OperatorKey(self.app, self.operator)

    @property
    def id(self) -> str:
        """The text form, ``app/operator/index``."""
        return instance_id(self.app, self.operator, self.instance)

    def __str__(self) -> str:
        return self.id

    @classmethod
    def parse(cls, text: str) -> InstanceKey:
        """``app/operator/index`` back into a key; ValueError naming the text otherwise."""
        parts = text.split("/") if isinstance(text, str) else []
        if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2].isdigit():
            raise ValueError(f"instance id must be app/operator/index, got {text!r}")
        return cls(parts[0], parts[1], int(parts[2]))


def instance_id(app: str, operator: str, index: int) -> str:
    """The instance's identity as text: ``app/operator/index``."""
    return f"{app}/{operator}/{index}"
