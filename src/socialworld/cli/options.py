"""Command-line options generated from the config dataclasses (the ``HfArgumentParser`` convention
on Typer): every field of a config, nested configs included, is one option whose help is the
field's ``metadata["help"]`` and whose default is the default config's value.

- ``Literal`` fields become choices: a typo fails while the command line is parsed, before any
  work starts (a tuple or list of them is checked when the config is built, still before any work).
- ``tuple``/``list`` fields are repeatable options that also split on commas (``--tiers L0,L1``),
  unless the field's metadata says ``"commas": False`` (file paths may hold commas).
- ``bool`` fields are ``--x/--no-x`` flags.
- A nested config's field keeps its own name (``--gating`` for ``LoopConfig.sleep.gating``) unless
  another field of the tree has that name; then it is prefixed with its parent (``--sleep-seed``).
- ``--config FILE`` reads a stored config (a run's ``config.yaml``, or any YAML/JSON with the
  config's fields): its values replace the defaults and options given on the command line win.
  A file's values pass the same type and choice checks. A stored run's file of an earlier version
  is read in this version's form first (the command's ``migrate``: for ``loop`` and ``bench``,
  :func:`socialworld.learn.runconfig.migrate`); a field the file lacks takes the default.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

import typer
from rich.markup import escape

from socialworld.config import Bound, FieldError, violation


@dataclass(frozen=True)
class Leaf:
    """One config field as one option."""

    path: tuple[str, ...]
    """the field's path from the root config, e.g. ``("sleep", "gating")``"""
    name: str
    """the Python parameter name (the option is ``--`` + it with dashes)"""
    hint: Any
    """the field's type"""
    kind: Any
    """the option's Python type for Typer"""
    default: Any
    help: str
    choices: tuple[str, ...] | None
    many: bool
    """a tuple or list field: a repeatable option"""
    commas: bool
    """a repeatable option whose values also split on commas"""
    container: type | None
    """tuple or list (or None)"""
    check: Bound | None = None
    """the range the field declares (``metadata["check"]``), shown in the help and checked with the option's name"""


types_union = type(int | None)
"""``X | None``'s type (``typing.Union`` spells the other form)"""


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types_union) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else tp), True
    return tp, False


def leaves(cls: type) -> list[Leaf]:
    """Every field of config type ``cls`` (nested dataclass fields flattened), with the option it becomes."""
    raw: list[tuple[tuple[str, ...], Any, Any, dataclasses.Field]] = []

    def walk(c: type, inst: Any, path: tuple[str, ...]) -> None:
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            tp = hints[f.name]
            value = getattr(inst, f.name)
            if dataclasses.is_dataclass(tp):
                walk(tp, value, path + (f.name,))  # type: ignore[arg-type]
            else:
                raw.append((path + (f.name,), tp, value, f))

    walk(cls, cls(), ())
    counts: dict[str, int] = {}
    for path, *_ in raw:
        counts[path[-1]] = counts.get(path[-1], 0) + 1
    out = []
    for path, hint, value, f in raw:
        name = path[-1] if len(path) == 1 or counts[path[-1]] == 1 else "_".join(path)
        tp, optional = _unwrap_optional(hint)
        origin = typing.get_origin(tp)
        container = None
        if origin in (tuple, list):
            container = origin
            tp = typing.get_args(tp)[0]
        choices = tuple(str(a) for a in typing.get_args(tp)) if typing.get_origin(tp) is Literal else None
        base = str if choices or tp in (Path,) else tp
        if base not in (str, int, float, bool) or (optional and choices and not container):
            raise TypeError(f"{cls.__name__}.{'.'.join(path)}: no command-line form for {hint!r}")
        if container:
            kind: Any = Optional[list[base]]  # type: ignore[valid-type]
            value = None if value is None else [str(v) if choices else v for v in value]
        elif optional:
            kind = Optional[base]  # type: ignore[valid-type]
            value = None if value is None else str(value) if tp is Path else value
        elif choices:
            kind = Literal[choices]  # Typer makes it a click.Choice: a typo fails while parsing
        else:
            kind = base
        out.append(Leaf(path, name, hint, kind, value, f.metadata.get("help", ""), choices, container is not None,
                        container is not None and f.metadata.get("commas", True), container, f.metadata.get("check")))
    return out


def _option(leaf: Leaf, aliases: dict[str, str]) -> Any:
    flag = "--" + leaf.name.replace("_", "-")
    decls = [flag] + ([aliases[leaf.name]] if leaf.name in aliases else [])
    if leaf.kind is bool:
        decls = [f"{flag}/--no-{leaf.name.replace('_', '-')}"]
    help_ = leaf.help
    if leaf.choices and leaf.many:  # checked when the config is built (a repeatable option also splits on commas)
        help_ += f" (any of: {', '.join(leaf.choices)})"
    if leaf.check is not None:
        help_ += f" ({leaf.check})"
    shown: Any = ("none" if not leaf.default else ",".join(map(str, leaf.default))) if leaf.many else True
    # Typer renders help as rich markup: '[scale]' or '[default: ...]' in the text would vanish as tags
    return typer.Option(leaf.default, *decls, help=escape(help_), show_default=shown)


def config_params(cls: type, aliases: dict[str, str] | None = None) -> list[inspect.Parameter]:
    """The Typer parameters of ``cls``'s fields plus ``--config``."""
    ps = [inspect.Parameter(leaf.name, inspect.Parameter.KEYWORD_ONLY, annotation=leaf.kind, default=_option(leaf, aliases or {}))
          for leaf in leaves(cls)]
    ps.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                                default=typer.Option(None, "--config", help=(
                                    "a stored config (a run's config.yaml, YAML or JSON) whose values replace the "
                                    "defaults; options given here win"), exists=True, dir_okay=False)))
    return ps


def read_config_file(path: Path, cls: type, ignore: tuple[str, ...] = (),
                     migrate: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None) -> dict[str, Any]:
    """A stored config's fields, nested as in ``cls``; a key that is no field of ``cls`` fails,
    naming the file and the key (``ignore`` lists recorded top-level keys that are not fields;
    ``migrate`` reads a stored run's file of an earlier version in this version's form)."""
    from socialworld.world.spec import read_yaml

    doc = read_yaml(path)  # a missing, unreadable or malformed file: one line naming it
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a config file holds a mapping of field names to values")
    if migrate is not None:
        doc = migrate(doc, path)

    def check(c: type, d: dict, where: str) -> dict:
        fields = {f.name: f for f in dataclasses.fields(c)}
        hints = typing.get_type_hints(c)
        out = {}
        for k, v in d.items():
            if k in ignore and not where:
                continue
            if k not in fields:
                raise ValueError(f"{path}: {where}{k} is not a field of {c.__name__} (fields: {', '.join(fields)})")
            if dataclasses.is_dataclass(hints[k]):
                if not isinstance(v, dict):
                    raise ValueError(f"{path}: {where}{k} holds a mapping of {hints[k].__name__}'s fields")
                out[k] = check(hints[k], v, f"{where}{k}.")
            else:
                out[k] = v
        return out

    return check(cls, doc, "")


def _lookup(doc: dict, path: tuple[str, ...]) -> Any:
    node: Any = doc
    for part in path:
        node = node.get(part, dataclasses.MISSING) if isinstance(node, dict) else dataclasses.MISSING
    return node


def build_config(cls: type, values: dict[str, Any], *, config_file: Path | None = None,
                 given: Callable[[str], bool] = lambda name: True, ignore: tuple[str, ...] = (),
                 migrate: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None) -> Any:
    """The config from option values (by parameter name): a value given on the command line wins,
    then ``config_file``'s (read through ``migrate``, see :func:`read_config_file`), then the
    default config's. The config's own checks run here."""
    from pydantic import TypeAdapter, ValidationError

    stored = read_config_file(config_file, cls, ignore, migrate) if config_file else {}
    flat: dict[tuple[str, ...], Any] = {}
    named: dict[tuple[str, ...], str] = {}  # each field as the user gave it: the option, or the file's key
    where: dict[tuple[str, ...], str] = {}  # ... and where it was given: the option, or the file and the key
    for leaf in leaves(cls):
        v = values[leaf.name]
        from_file = _lookup(stored, leaf.path) if config_file is not None and not given(leaf.name) else dataclasses.MISSING
        if from_file is not dataclasses.MISSING:
            if leaf.many and isinstance(from_file, (str, int, float)):
                from_file = [from_file]
            try:
                v = TypeAdapter(leaf.hint).validate_python(from_file)
            except ValidationError as err:
                detail = err.errors()[0]["msg"]
                raise ValueError(f"{config_file}: {'.'.join(leaf.path)}: {from_file!r}: {detail}") from None
        elif leaf.many and v is not None:
            v = [p for x in v for p in (str(x).split(",") if leaf.commas and isinstance(x, str) else [x]) if p != ""]
            bad = [p for p in v if leaf.choices and p not in leaf.choices]
            if bad:
                raise ValueError(f"--{leaf.name.replace('_', '-')}: {bad[0]!r} is not one of {', '.join(leaf.choices or ())}")
            if leaf.container is tuple:
                v = tuple(v)
        elif _unwrap_optional(leaf.hint)[0] is Path and v is not None:
            v = Path(v)
        if from_file is dataclasses.MISSING:
            named[leaf.path] = where[leaf.path] = f"--{leaf.name.replace('_', '-')}"
        else:
            named[leaf.path] = ".".join(leaf.path)
            where[leaf.path] = f"{config_file}: {named[leaf.path]}"
        broken = violation(v, leaf.check, None)
        if broken:
            raise ValueError(f"{where[leaf.path]}: {broken}")
        flat[leaf.path] = v

    def make(c: type, prefix: tuple[str, ...]) -> Any:
        hints = typing.get_type_hints(c)
        try:
            return c(**{f.name: make(hints[f.name], prefix + (f.name,)) if dataclasses.is_dataclass(hints[f.name])
                        else flat[prefix + (f.name,)] for f in dataclasses.fields(c)})
        except FieldError as err:
            names = {f: named.get(prefix + (f,), f) for f in err.related}
            names[err.field] = where.get(prefix + (err.field,), err.field)
            raise ValueError(err.named(names)) from None

    return make(cls, ())


def config_command(app: typer.Typer, name: str, cls: type, run: Callable[..., None], *,
                   extra: Sequence[inspect.Parameter] = (), aliases: dict[str, str] | None = None,
                   ignore: tuple[str, ...] = (), migrate: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None) -> None:
    """Register command ``name``: its options are config type ``cls``'s fields (plus ``extra``); it
    builds the config (a bad value fails here, before any work) and calls ``run(cfg, **extra
    values)``, which imports what the command uses. ``ignore``: keys a stored config records beside
    the fields; ``migrate``: how a stored run's file of an earlier version reads (see :func:`build_config`)."""
    params = config_params(cls, aliases) + list(extra)
    extra_names = {p.name for p in extra}
    clash = extra_names & {leaf.name for leaf in leaves(cls)} | ({"config", "ctx"} & {leaf.name for leaf in leaves(cls)})
    if clash:
        raise TypeError(f"{name}: option names used twice: {sorted(clash)}")

    def command(ctx: typer.Context, **kw: Any) -> None:
        config_file = kw.pop("config")
        extras = {k: kw.pop(k) for k in list(kw) if k in extra_names}
        try:
            cfg = build_config(cls, kw, config_file=config_file, ignore=ignore, migrate=migrate,
                               given=lambda n: getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE")
        except (ValueError, TypeError) as err:
            fail(str(err))
            return
        run(cfg, **extras)

    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)] + params
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = run.__doc__
    command.__name__ = name
    app.command(name)(command)


def require(option: str, value: Any, check: Bound) -> None:
    """The rule of an option declared by hand (the commands without a config dataclass): raise
    ``ValueError`` naming the option and the rule, before the command does any work."""
    for v in value if isinstance(value, (list, tuple)) else [value]:
        broken = violation(v, check, None)
        if broken:
            raise ValueError(f"{option}: {broken}")


def _no_flag_types(params: list[Any]) -> list[Any]:
    """``params`` with no value type shown beside a flag (``--help``, ``--x/--no-x``): a flag takes no
    value, and Typer wrote ``<bool>`` there."""
    for p in params:
        if getattr(p, "is_flag", False):
            p.metavar = ""
    return params


class Command(typer.core.TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_types(super().get_params(ctx))


class Group(typer.core.TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_types(super().get_params(ctx))


class App(typer.Typer):
    """Typer whose commands and groups show no type beside a flag, and commands' docstrings literally (Typer
    reads help as rich markup: ``pip install -e '.[openenv]'`` lost its ``[openenv]`` as a style tag)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=Group, **kwargs)

    def command(self, name: str | None = None, *, cls: Any = None, **kwargs: Any) -> Any:
        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            doc = kwargs.pop("help", None) or (inspect.cleandoc(f.__doc__) if f.__doc__ else None)
            return typer.Typer.command(self, name, cls=cls or Command, help=escape(doc) if doc else None, **kwargs)(f)

        return register


def fail(msg: str) -> None:
    """The error, literally, on stderr without wrapping (a one-line message stays one line); exit 2."""
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True).print(Text.assemble(("error:", "red"), " ", msg), soft_wrap=True)
    raise typer.Exit(2)
