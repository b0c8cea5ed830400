"""resource.Quantity parsing (k8s.io/apimachinery/pkg/api/resource) for scheduling."""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
    "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18), "Ki": Decimal(2**10), "Mi": Decimal(2**20),
    "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def parse(value: str | int | float) -> Decimal:
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError(f"quantities must match the regular expression '{_QUANTITY.pattern}'")
    return Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]
