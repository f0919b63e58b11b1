"""What the recovery passes' per-node records share: their fields, as plain data, are their build.json form."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any


class PlainRecord:
    """A frozen dataclass whose ``to_json`` is its fields as they are (``dataclasses.asdict``)."""

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json."""
        return asdict(self)  # type: ignore[call-overload]  # subclasses are dataclasses
