"""Constraints, the key registry, and matching against advertised attributes.

Matching follows the reference (``iris.cluster.constraints`` and the router's ``backend_satisfies``):

- advertised attributes are multi-valued; a constraint holds when *any* advertised value satisfies it;
- an attribute that is not advertised fails every op except ``NOT_EXISTS`` (``NE`` included);
- strings compare stripped and case-insensitively;
- only ``device-type``, ``device-variant``, ``preemptible``, ``region`` and ``zone`` route;
  ``gpu-count`` and the TPU keys are matched by the cluster that runs the job, never by routing.

Beyond the reference, numeric-looking strings compare as numbers (``"4"`` equals ``4``), and an
ordered op against an advertised value that is not a number is simply false instead of an error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

Scalar = str | int | float


class Op(StrEnum):
    EQ = "EQ"
    NE = "NE"
    EXISTS = "EXISTS"
    NOT_EXISTS = "NOT_EXISTS"
    GT = "GT"
    GE = "GE"
    LT = "LT"
    LE = "LE"
    IN = "IN"


ORDERED_OPS = frozenset({Op.GT, Op.GE, Op.LT, Op.LE})
ALL_OPS = frozenset(Op)
_EQ_IN = frozenset({Op.EQ, Op.IN})

# Reserved directive keys: they steer submission and are never matched against attributes.
CLUSTER_KEY = "cluster"
BACKEND_KEY = "backend"
DIRECTIVE_KEYS = frozenset({CLUSTER_KEY, BACKEND_KEY})

# The fray/Iris "any region" marker: suppresses a default region and never reaches routing.
ANY_REGION = "*"

_NUMBER = re.compile(r"[+-]?\d+(\.\d+)?")


class ConstraintError(ValueError):
    """A constraint that can never be evaluated; the message names what is accepted."""


@dataclass(frozen=True, slots=True)
class KeySpec:
    key: str
    routing: bool
    allowed_ops: frozenset[Op]
    value_type: type  # str, bool or int


REGISTRY: dict[str, KeySpec] = {
    spec.key: spec
    for spec in (
        KeySpec("device-type", routing=True, allowed_ops=_EQ_IN, value_type=str),
        KeySpec("device-variant", routing=True, allowed_ops=_EQ_IN, value_type=str),
        KeySpec("preemptible", routing=True, allowed_ops=frozenset({Op.EQ}), value_type=bool),
        KeySpec("region", routing=True, allowed_ops=frozenset({Op.EQ, Op.IN, Op.EXISTS}), value_type=str),
        KeySpec("zone", routing=True, allowed_ops=_EQ_IN, value_type=str),
        KeySpec("tpu-name", routing=False, allowed_ops=ALL_OPS, value_type=str),
        KeySpec("tpu-worker-id", routing=False, allowed_ops=ALL_OPS, value_type=int),
        KeySpec("tpu-topology", routing=False, allowed_ops=ALL_OPS, value_type=str),
        KeySpec("tpu-vm-count", routing=False, allowed_ops=ALL_OPS, value_type=int),
        KeySpec("gpu-variant", routing=False, allowed_ops=ALL_OPS, value_type=str),
        KeySpec("gpu-count", routing=False, allowed_ops=ALL_OPS, value_type=int),
        KeySpec(CLUSTER_KEY, routing=False, allowed_ops=frozenset({Op.EQ}), value_type=str),
        KeySpec(BACKEND_KEY, routing=False, allowed_ops=frozenset({Op.EQ}), value_type=str),
    )
}
ROUTING_KEYS = tuple(spec.key for spec in REGISTRY.values() if spec.routing)
# Keys for which an explicit constraint replaces the one derived from the job's device.
CANONICAL_KEYS = frozenset(ROUTING_KEYS)


def normalize_value(raw: Scalar | bool) -> Scalar:
    """One comparable form for constraint literals and advertised values alike."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, int | float):
        return raw
    text = raw.strip().lower()
    if _NUMBER.fullmatch(text):
        return float(text) if "." in text else int(text)
    return text


def _names(ops: Iterable[Op]) -> str:
    return ", ".join(op.value for op in Op if op in set(ops))


class Constraint(NamedTuple):
    """``key op values``; build with :func:`make_constraint`, which validates and normalizes.

    A named tuple, so hashing and comparing one runs in C: placement groups every queued job by
    its constraints on every tick, and a dataclass's Python-level ``__hash__``/``__eq__`` made
    that the largest cost of a pass over 100,000 jobs.
    """

    key: str
    op: Op
    values: tuple[Scalar, ...] = ()

    def to_wire(self) -> dict[str, object]:
        return {"key": self.key, "op": self.op.value, "values": list(self.values)}

    def __str__(self) -> str:
        if not self.values:
            return f"{self.key} {self.op.value}"
        if self.op is Op.IN:
            return f"{self.key} IN ({', '.join(str(v) for v in self.values)})"
        return f"{self.key} {self.op.value} {self.values[0]}"


def check_op(key: str, op: str) -> Op:
    """The parsed op, if ``key`` allows it; else :class:`ConstraintError` naming the accepted ops."""
    try:
        parsed = Op(op.strip().upper())
    except ValueError:
        raise ConstraintError(f"unknown op {op!r}; accepted: {_names(Op)}") from None
    spec = REGISTRY.get(key)
    if spec is not None and parsed not in spec.allowed_ops:
        raise ConstraintError(f"{parsed.value} is not allowed for key {key!r}; accepted: {_names(spec.allowed_ops)}")
    return parsed


def check_values(key: str, op: Op, values: Sequence[Scalar | bool]) -> tuple[Scalar, ...]:
    """Normalized values, if their number and type suit ``op`` and ``key``; else :class:`ConstraintError`."""
    arity = len(values)
    if op in (Op.EXISTS, Op.NOT_EXISTS) and arity != 0:
        raise ConstraintError(f"{op.value} takes no values, got {arity}")
    if op is Op.IN and arity < 1:
        raise ConstraintError("IN takes at least one value")
    if op not in (Op.EXISTS, Op.NOT_EXISTS, Op.IN) and arity != 1:
        raise ConstraintError(f"{op.value} takes exactly one value, got {arity}")
    spec = REGISTRY.get(key)
    if key in DIRECTIVE_KEYS:
        # Peer and backend ids are names matched exactly, not attributes: never lowercased or parsed.
        normalized = tuple(v.strip() if isinstance(v, str) else normalize_value(v) for v in values)
    else:
        normalized = tuple(normalize_value(v) for v in values)
    for value in normalized:
        if isinstance(value, str) and not value:
            raise ConstraintError("values must not be empty strings")
        if op in ORDERED_OPS and isinstance(value, str):
            raise ConstraintError(f"{op.value} compares numbers only, got {value!r}; use EQ, NE or IN for strings")
        if spec is not None and spec.value_type is bool and value not in ("true", "false"):
            raise ConstraintError(f"{key} takes true or false, got {value!r}")
        if spec is not None and spec.value_type is int and not isinstance(value, int):
            raise ConstraintError(f"{key} takes integers, got {value!r}")
    return normalized


def check_key(key: str) -> str:
    key = key.strip().lower()
    if not key:
        raise ConstraintError("must be a non-empty string")
    return key


def make_constraint(key: str, op: str, values: Sequence[Scalar | bool] = ()) -> Constraint:
    """Validate and normalize one constraint; raise :class:`ConstraintError` naming what is accepted."""
    key = check_key(key)
    parsed = check_op(key, op)
    return Constraint(key, parsed, check_values(key, parsed, values))


def _holds(value: Scalar, constraint: Constraint) -> bool:
    op = constraint.op
    if op is Op.EQ:
        return value == constraint.values[0]
    if op is Op.NE:
        return value != constraint.values[0]
    if op is Op.IN:
        return value in constraint.values
    target = constraint.values[0]
    if isinstance(value, str) or isinstance(target, str):
        return False
    if op is Op.GT:
        return value > target
    if op is Op.GE:
        return value >= target
    if op is Op.LT:
        return value < target
    return value <= target


Advertised = Mapping[str, tuple[Scalar, ...]]


def normalize_advertised(raw: Mapping[str, Iterable[Scalar | bool]]) -> dict[str, tuple[Scalar, ...]]:
    return {key.strip().lower(): tuple(normalize_value(v) for v in values) for key, values in raw.items()}


def satisfies(advertised: Advertised, constraint: Constraint) -> bool:
    """Whether one backend's advertised attributes satisfy ``constraint`` (reference: backend_satisfies)."""
    values = advertised.get(constraint.key, ())
    if constraint.op is Op.EXISTS:
        return bool(values)
    if constraint.op is Op.NOT_EXISTS:
        return not values
    return any(_holds(value, constraint) for value in values)


def satisfies_all(advertised: Advertised, constraints: Iterable[Constraint]) -> bool:
    return all(satisfies(advertised, c) for c in constraints)


def is_cpu_device_type(constraint: Constraint) -> bool:
    return constraint.key == "device-type" and constraint.op is Op.EQ and constraint.values[0] == "cpu"


def routing_constraints(constraints: Iterable[Constraint]) -> tuple[Constraint, ...]:
    """The constraints a peer or local backend is matched on: routing keys only, CPU dropped."""
    return tuple(
        c
        for c in constraints
        if not is_cpu_device_type(c) and (spec := REGISTRY.get(c.key)) is not None and spec.routing
    )


def directive(constraints: Iterable[Constraint], key: str) -> str:
    """The value of the first ``key EQ value`` directive (``cluster`` or ``backend``), or ``""``."""
    for c in constraints:
        if c.key == key:
            return str(c.values[0])
    return ""


def device_constraints(device_type: str, variant: str) -> tuple[Constraint, ...]:
    """The constraints a device implies: ``device-type`` for gpu/tpu, plus a concrete variant."""
    if device_type == "cpu":
        return ()
    derived = [Constraint("device-type", Op.EQ, (device_type,))]
    if variant != "auto":
        derived.append(Constraint("device-variant", Op.EQ, (variant,)))
    return tuple(derived)


def merge_constraints(derived: Iterable[Constraint], explicit: Iterable[Constraint]) -> tuple[Constraint, ...]:
    """Derived constraints, except where an explicit one names the same canonical key (it replaces them)."""
    explicit = tuple(explicit)
    overridden = {c.key for c in explicit if c.key in CANONICAL_KEYS}
    return tuple(c for c in derived if c.key not in overridden) + explicit
