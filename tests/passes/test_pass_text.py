"""One formatter for passes: ``str(pass)`` is the pipeline text, and it parses back to an equal pass.

Every registered pass is built with a non-default value of each of its options (one at a time and
all together); strings that hold the pipeline text's own characters (``=``, ``,``, braces, quotes,
spaces) or read as another kind must come back unchanged.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

import cuvil.passes  # noqa: F401  (registers the built-in passes)
from cuvil.passes.base import Pass, PassError, all_passes, format_pass
from cuvil.passes.convert_precision import ConvertPrecision
from cuvil.passes.layout import LAYOUTS
from cuvil.passes.manager import format_pipeline, parse_pipeline

# options whose values are checked by the pass: a valid value other than the default
VALID: dict[tuple[str, str], list[Any]] = {
    ("convert-precision", "dtype"): ["bf16"],
    ("convert-precision", "overrides"): ["softmax=f32", "node:a,b {c}=d \"e\"=f32; softmax = bf16"],
    ("convert-layout", "convs"): ["all"],
}
# options with a single valid value today: there is no non-default value to write
SINGLE_VALUED = {("convert-layout", "layout"): LAYOUTS}
TRICKY_STRINGS = ["x=y", "a,b", "{c}", "with space", '"quoted"', "none", "true", "12", "1e3", "", "plain"]


def non_default_values(cls: type[Pass], field: dataclasses.Field[Any], hint: Any) -> list[Any]:
    key = (cls.name, field.name)
    if key in VALID:
        return VALID[key]
    if hint is bool:
        return [not field.default]
    if hint is int:
        return [field.default + 1, field.default * 3 + 2]
    if hint is float:
        return [field.default * 2 + 0.25, 1e-7]
    if hint is str:
        return [s for s in TRICKY_STRINGS if s != field.default]
    raise AssertionError(f"{cls.name}: option {field.name} has type {hint}; give it values in VALID")


def option_cases() -> list[Any]:
    cases = []
    for name, cls in sorted(all_passes().items()):
        if not cls.__module__.startswith("cuvil."):  # passes other tests register for themselves
            continue
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if (name, f.name) in SINGLE_VALUED:
                continue
            for v in non_default_values(cls, f, hints[f.name]):
                cases.append(pytest.param(cls, f.name, v, id=f"{name}-{f.name}={v!r}"))
    return cases


@pytest.mark.parametrize(("cls", "option", "value"), option_cases())
def test_every_option_value_prints_and_parses_back(cls: type[Pass], option: str, value: Any) -> None:
    p = cls(**{option: value})
    text = str(p)
    assert text == format_pass(p) == format_pipeline([p])
    assert text != cls.name  # the option is not at its default: it is written
    assert parse_pipeline(text) == [p], text
    assert parse_pipeline(f"dce,{text},cse") == [all_passes()["dce"](), p, all_passes()["cse"]()]


@pytest.mark.parametrize("name", sorted(n for n, c in all_passes().items() if c.__module__.startswith("cuvil.")))
def test_all_options_at_once(name: str) -> None:
    cls = all_passes()[name]
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: non_default_values(cls, f, hints[f.name])[-1] for f in dataclasses.fields(cls)
              if (name, f.name) not in SINGLE_VALUED}
    p = cls(**kwargs)
    assert parse_pipeline(str(p)) == [p], str(p)


def test_single_valued_options_have_only_their_default() -> None:
    """When such an option gains a second valid value, it belongs in VALID above."""
    for (name, option), values in SINGLE_VALUED.items():
        field = next(f for f in dataclasses.fields(all_passes()[name]) if f.name == option)
        assert tuple(values) == (field.default,), (name, option, values)


def test_convert_precision_overrides_print_quoted() -> None:
    p = ConvertPrecision(overrides="softmax=f32")
    assert str(p) == 'convert-precision{overrides="softmax=f32"}'
    assert parse_pipeline(str(p)) == [p]


def test_the_unquoted_text_is_refused() -> None:
    # what an unquoted value with '=' would read as: the parser stops at the second '='
    with pytest.raises(PassError, match="expected"):
        parse_pipeline("convert-precision{overrides=softmax=f32}")
