"""One lookup shape for every pluggable family: `get`, `serialize`, `deserialize`.

Keras looks up optimizers, losses and callbacks the same way: one dictionary
per family, every id written once, one `get` that takes a string id, a config
dict or an instance. A `Registry` is that dictionary with its functions, for
each of our families (aggregators, attacks, placement policies, partitioners,
dense choices). The built-in entries are written as `"module:Class"` and
imported on first use, so listing a family's ids (`names()`, which the CLI's
`--help` does) needs no TensorFlow.

A config dict is `{"class_name": id, "config": {...}}`: a malformed dict, an
unknown key or a missing argument is a `ValueError` naming what the class
accepts and what was received (`check_arguments`), never Python's
`TypeError` from deep inside a constructor.

Examples:

>>> shapes = Registry(
...     "shape",
...     {"ordered_dict": "collections:OrderedDict"},
...     base="collections.abc:Mapping",
...     example="{'class_name': 'ordered_dict'}",
... )
>>> shapes.names()
['ordered_dict']
>>> shapes.get("ordered_dict")
OrderedDict()
>>> shapes.get("orderd_dict")
Traceback (most recent call last):
...
ValueError: Unknown shape 'orderd_dict'. Expected one of: ordered_dict. Did you mean 'ordered_dict'?
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Mapping
from typing import Any

_KEYS = ("class_name", "config")


class Registry:
    """The string ids of one family, and how to build its members from them.

    Args:
        family: The family's name in messages: `"aggregator"`, `"attack"`.
        builtins: `id -> "module:Class"`, imported on first use. The order is
            the order `names()` lists them in.
        base: `"module:Class"` of the family's base class: what `get` passes
            through as an instance and what `register` accepts.
        example: A valid config dict, written out, for messages.
        needs_arguments: What a bare string id lacks, when members cannot be
            built without arguments (attacks need their replicas), completing
            "An {family} needs ...". `get("id")` then says so and shows a
            config dict. Defaults to `None`: a string id builds the member
            with its defaults.
        example_arguments: Constructor arguments, written out, for the
            message that asks for an instance (`"replicas=[7]"`).
        argument: The strategy's keyword for the family, where it is not
            the family's name (`"dense"` for dense choices), for messages.
    """

    def __init__(
        self,
        family: str,
        builtins: Mapping[str, str],
        *,
        base: str,
        example: str,
        needs_arguments: str | None = None,
        example_arguments: str = "",
        argument: str | None = None,
    ):
        self.family = family
        self._entries: dict[str, str | type] = dict(builtins)
        self._base_path = base
        self._example = example
        self._needs_arguments = needs_arguments
        self._example_arguments = example_arguments
        self._argument = argument or family

    # ------------------------------------------------------------ reading

    def names(self) -> list[str]:
        """The registered string ids, built-ins first, in registration order."""
        return list(self._entries)

    def lookup(self, name: Any) -> type:
        """The class registered as `name`.

        Raises:
            ValueError: for an unknown id, naming the closest valid one and
                all of them (and the id, if `name` is a registered class's
                Python name).
        """
        try:
            entry = self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(self.unknown_message(name)) from None
        if isinstance(entry, str):
            entry = self._entries[name] = _load(entry)
        return entry

    def id_of(self, cls: type) -> str | None:
        """The id `cls` is registered under, or `None`; imports nothing."""
        where = f"{cls.__module__}:{cls.__qualname__}"
        for name, entry in self._entries.items():
            if entry is cls or entry == where:
                return name
        return None

    def id_attribute(self, default: str) -> Any:
        """A class attribute that reads a class's id from this registry.

        The base class of a family declares `name = REGISTRY.id_attribute(...)`
        so every member knows its id (`Krum.name == "krum"`) without writing
        it twice; a subclass that is not registered itself reads its nearest
        registered ancestor's, else `default`.
        """
        registry = self

        class _RegisteredId:
            def __get__(self, instance: Any, cls: type) -> str:
                for ancestor in cls.__mro__:
                    name = registry.id_of(ancestor)
                    if name is not None:
                        return name
                return default

        return _RegisteredId()

    @property
    def base(self) -> type:
        """The family's base class."""
        if isinstance(self._base_path, str):
            self._base_path = _load(self._base_path)
        return self._base_path

    # ------------------------------------------------------------ writing

    def register(self, name: str, cls: type | None = None) -> Any:
        """Registers `cls` under `name`, so `get(name)` builds it.

        Usable inline, `register("x", MyRule)`, or as a class decorator,
        `@register("x")`.

        Returns:
            `cls` (or, as a decorator, a function that registers and returns
            its class).

        Raises:
            ValueError: if `name` is taken by another class, or not a
                snake_case identifier.
            TypeError: if `cls` is not a subclass of the family's base.
        """
        if cls is None:
            return lambda c: self.register(name, c)
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(
                f"`cls` must be a {self.base.__name__} subclass. Received: cls={cls!r}"
            )
        if not (isinstance(name, str) and name.isidentifier() and name.islower()):
            raise ValueError(
                f"{_a(self.family).capitalize()} id must be a snake_case identifier, e.g. "
                f"'my_rule'. Received: {name!r}"
            )
        if name in self._entries and self.lookup(name) is not cls:
            raise ValueError(
                f"{_a(self.family).capitalize()} named {name!r} is already registered "
                f"({self.lookup(name).__name__}). Pick another name."
            )
        self._entries[name] = cls
        return cls

    def unregister(self, name: str) -> None:
        """Removes `name` (a user's registration; tests use it to clean up)."""
        self._entries.pop(name, None)

    # ------------------------------------------------ the Keras triple

    def serialize(self, member: Any) -> dict[str, Any]:
        """Returns `{"class_name": id, "config": member.get_config()}`.

        Raises:
            ValueError: if `member`'s class is not registered.
        """
        name = self.id_of(type(member))
        if name is None:
            cls = type(member).__name__
            raise ValueError(
                f"Cannot serialize {member!r}: its class {cls} is not one of the "
                f"registered {self.family}s ({', '.join(self.names())}). Register "
                f"it first, e.g. register('my_{self.family}', {cls})."
            )
        return {"class_name": name, "config": member.get_config()}

    def deserialize(self, config: Any) -> Any:
        """Inverse of `serialize`.

        Raises:
            ValueError: for a malformed config, an unknown `class_name`
                (naming the valid ones) or an argument the class does not take
                (naming the ones it does).
        """
        name, arguments = split_config(config, self.family, self._example)
        cls = self.lookup(name)
        from_config = getattr(cls, "from_config", None)
        if from_config is not None:
            return from_config(arguments)
        check_arguments(cls, arguments)
        return cls(**arguments)

    def get(self, identifier: Any) -> Any:
        """Returns a member from a string id, a config dict or an instance.

        Raises:
            ValueError: for an unknown id (naming the valid ones), a config
                dict the class cannot be built from, a class instead of an
                instance, or anything else; each says what was received.
        """
        if isinstance(identifier, self.base):
            return identifier
        if isinstance(identifier, str):
            cls = self.lookup(identifier)
            if self._needs_arguments is not None:
                raise ValueError(
                    f"{_a(self.family).capitalize()} needs {self._needs_arguments}, so a bare id "
                    f"is not enough. Pass a config dict, e.g. {{'class_name': "
                    f"{identifier!r}, 'config': {{...}}}} as in {self._example}, "
                    f"or an instance. Received: {identifier!r}"
                )
            return cls()
        if isinstance(identifier, Mapping):
            return self.deserialize(identifier)
        if isinstance(identifier, type) and issubclass(identifier, self.base):
            cls, name = identifier.__name__, self.id_of(identifier)
            if self._needs_arguments is not None:
                how = (
                    f"instantiate it with {self._needs_arguments}, e.g. "
                    f"{self._argument}={cls}({self._example_arguments})"
                )
            else:
                how = f"instantiate it, e.g. {self._argument}={cls}()"
                if name:
                    how += f", or pass its id, {self._argument}={name!r}"
            raise ValueError(f"Received the class {cls}, not an instance of it: {how}.")
        raise ValueError(
            f"Could not interpret {self.family} identifier. Expected a string "
            f"id ({', '.join(self.names())}), a config dict such as "
            f"{self._example}, or {_a(self.base.__name__)} instance. "
            f"Received: {identifier!r}"
        )

    # ------------------------------------------------------------ private

    def unknown_message(self, name: Any) -> str:
        """The error for an unknown id: the valid ones, and the closest."""
        names = self.names()
        message = (
            f"Unknown {self.family} {name!r}. Expected one of: {', '.join(names)}."
        )
        if isinstance(name, str):
            by_class = {
                (e if isinstance(e, str) else e.__name__).rpartition(":")[2]: n
                for n, e in self._entries.items()
            }
            if name in by_class:
                return f"{message} {name!r} is the class of {by_class[name]!r}: pass that id."
            close = difflib.get_close_matches(name, names, n=1)
            if close:
                return f"{message} Did you mean {close[0]!r}?"
        return message


def split_config(config: Any, kind: str, example: str) -> tuple[Any, dict[str, Any]]:
    """Returns `(class_name, arguments)` of a `{"class_name", "config"}` dict.

    Args:
        config: What the user passed.
        kind: The family, for the message: `"aggregator"`, `"attack"`.
        example: A valid config, written out, for the message.

    Raises:
        ValueError: unless `config` is a dict with `class_name`, an optional
            `config` dict of arguments, and no other key.
    """
    if not isinstance(config, Mapping) or "class_name" not in config:
        raise ValueError(
            f"{_a(kind).capitalize()} config must be a dict with 'class_name' and 'config', "
            f"e.g. {example}. Received: {config!r}"
        )
    unknown = [key for key in config if key not in _KEYS]
    if unknown:
        raise ValueError(
            f"{_a(kind).capitalize()} config has only the keys 'class_name' and 'config'. "
            f"Received unknown keys {unknown!r} in {config!r}. "
            "Put constructor arguments inside 'config'."
        )
    arguments = config.get("config")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise ValueError(
            f"The 'config' of {_a(kind)} config must be a dict of constructor "
            f"arguments, e.g. {example}. Received: config={arguments!r}"
        )
    return config["class_name"], dict(arguments)


def check_arguments(cls: type, config: Mapping[str, Any]) -> None:
    """Raises `ValueError` unless `cls(**config)` binds its arguments.

    Args:
        cls: The class to build.
        config: Keyword arguments for its constructor.

    Raises:
        ValueError: for a key `cls` does not take (naming the closest one it
            does) or an argument it needs that `config` lacks; either way
            listing the arguments `cls` accepts.

    Examples:

    >>> import fractions
    >>> check_arguments(fractions.Fraction, {"numerator": 1})
    >>> check_arguments(fractions.Fraction, {"numerater": 1})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Could not build Fraction from its config: unknown argument 'numerater' (did you mean 'numerator'?). ...
    """
    accepted, required, any_keyword = _parameters(cls)
    name = cls.__name__
    unknown = [] if any_keyword else [k for k in config if k not in accepted]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hints.append(
                f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
            )
        raise ValueError(
            f"Could not build {name} from its config: unknown argument"
            f"{'s' if len(unknown) > 1 else ''} {', '.join(hints)}. {name} "
            f"accepts: {', '.join(accepted) or 'no argument'}. Received: "
            f"config={dict(config)!r}. Remove {'them' if len(unknown) > 1 else 'it'} "
            "or fix the spelling."
        )
    missing = [k for k in required if k not in config]
    if missing:
        raise ValueError(
            f"Could not build {name} from its config: it needs "
            f"{', '.join(map(repr, missing))}. {name} accepts: "
            f"{', '.join(accepted)}. Received: config={dict(config)!r}. Add "
            f"{'them' if len(missing) > 1 else 'it'} to the config."
        )


def _parameters(cls: type) -> tuple[list[str], list[str], bool]:
    """`cls`'s keyword arguments, the required ones, and whether it takes
    `**kwargs`."""
    accepted, required, any_keyword = [], [], False
    for p in inspect.signature(cls).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            any_keyword = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            accepted.append(p.name)
            if p.default is p.empty:
                required.append(p.name)
    return accepted, required, any_keyword


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _a(word: str) -> str:
    """`word` with its indefinite article: "an attack", "a Partitioner"."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word
