"""The base of every spec section: unknown keys are errors, instances are immutable, and a YAML
boolean is no number (pydantic would read `port: true` as 1 and `epochs: yes` as 1.0)."""
from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

_NUMBER_ONLY: dict[tuple[type, str], bool] = {}


class BoolNumber:
    """A YAML boolean given where only a number belongs: no number type accepts it, so the
    field fails with its own path (explain.py words it as a boolean)."""

    __slots__ = ("value",)

    def __init__(self, value: bool):
        self.value = value

    def __repr__(self) -> str:
        return "true" if self.value else "false"


class Strict(BaseModel):
    """Base for every spec section."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    # A model validator, not a field one: pydantic allows no field validator on the trainer
    # tag, the discriminator of the job models' union.
    @model_validator(mode="before")
    @classmethod
    def _no_boolean_number(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        marked = {}
        for name, field in cls.model_fields.items():
            key = field.alias if field.alias in data else name
            if isinstance(data.get(key), bool) and number_only(cls, name):
                marked[key] = BoolNumber(data[key])
        return {**data, **marked} if marked else data


def number_only(model: type[BaseModel], name: str) -> bool:
    """Whether model's field takes numbers (int or float) and no boolean."""
    key = (model, name)
    if key not in _NUMBER_ONLY:
        members = _members(model.model_fields[name].annotation)
        _NUMBER_ONLY[key] = bool(members & {int, float}) and not members & {bool, Any, object}
    return _NUMBER_ONLY[key]


def _members(tp: Any) -> set:
    """The types a field's annotation accepts at its top level (Optional, unions, Annotated)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _members(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_members(a) for a in typing.get_args(tp)))
    return {tp}
