"""The contract every pluggable family of `keras_psdist.families` keeps.

One test per promise, over every family the module defines (a new family is
checked by adding it there): its ids list without TensorFlow, each built-in
id finds a class of the family, builds from its id or config, serializes and
comes back, and an unknown id is refused with the valid ones named. Each
family's public module offers the same five functions over its registry.
"""

import importlib
import subprocess
import sys

import pytest

from keras_psdist import families
from keras_psdist.registry import Registry

FAMILIES = {
    name: value for name, value in vars(families).items() if isinstance(value, Registry)
}

# The public module of each family: `get`, `serialize`, `deserialize`,
# `names` and `register` over its registry.
MODULES = {
    "AGGREGATORS": "keras_psdist.aggregators",
    "ATTACKS": "keras_psdist.attacks",
    "PLACEMENTS": "keras_psdist.placement",
    "PARTITIONERS": "keras_psdist.partitioners",
    "DENSE_CHOICES": "keras_psdist.dense_choice",
    "COMPRESSORS": "keras_psdist.compression",
}

# Members that cannot be built from a bare id (their family needs
# arguments): a config for each. Every other id builds with `get(id)`.
_ATTACK_ARGUMENTS = {
    "scale": {"factor": -2.0},
    "label_flip": {"num_classes": 10},
    "optimal_label_flip": {"num_classes": 10},
}
CONFIGS = {
    ("ATTACKS", name): {
        "class_name": name,
        "config": {"replicas": [0], **_ATTACK_ARGUMENTS.get(name, {})},
    }
    for name in families.ATTACKS.names()
} | {
    ("PARTITIONERS", "fixed"): {"class_name": "fixed", "config": {"num_shards": 2}},
    ("PARTITIONERS", "min_size"): {
        "class_name": "min_size",
        "config": {"min_shard_bytes": 1024, "max_shards": 4},
    },
    ("PARTITIONERS", "max_size"): {
        "class_name": "max_size",
        "config": {"max_shard_bytes": 1024},
    },
}

BUILTINS = [(family, name) for family, r in FAMILIES.items() for name in r.names()]


def _build(family, name):
    return FAMILIES[family].get(CONFIGS.get((family, name), name))


def test_the_families_are_the_ones_this_test_knows():
    assert set(FAMILIES) == set(MODULES), (
        "a family was added to keras_psdist.families: name its public module "
        "in MODULES (and configs for ids that need arguments in CONFIGS)"
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_lists_its_ids_once(family):
    names = FAMILIES[family].names()
    assert names, f"{family} has no id"
    assert len(set(names)) == len(names)
    assert all(n.isidentifier() and n.islower() for n in names), names


@pytest.mark.parametrize("family, name", BUILTINS)
def test_every_builtin_id_finds_a_class_of_its_family(family, name):
    registry = FAMILIES[family]
    cls = registry.lookup(name)
    assert isinstance(cls, type) and issubclass(cls, registry.base)
    assert registry.id_of(cls) == name
    assert cls.name == name  # the class reads its id back, written once


@pytest.mark.parametrize("family, name", BUILTINS)
def test_every_builtin_builds_and_round_trips_through_its_config(family, name):
    registry = FAMILIES[family]
    member = _build(family, name)
    assert type(member) is registry.lookup(name)
    assert registry.get(member) is member
    config = registry.serialize(member)
    assert config["class_name"] == name
    restored = registry.deserialize(config)
    assert type(restored) is type(member)
    assert registry.serialize(restored) == config


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_unknown_id_is_refused_naming_the_valid_ones(family):
    registry = FAMILIES[family]
    for attempt in (
        lambda: registry.get("no_such_id"),
        lambda: registry.deserialize({"class_name": "no_such_id"}),
    ):
        with pytest.raises(ValueError) as info:
            attempt()
        message = str(info.value)
        assert "'no_such_id'" in message
        assert f"Expected one of: {', '.join(registry.names())}" in message


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_config_with_an_unknown_argument_names_the_accepted_ones(family):
    registry = FAMILIES[family]
    name = registry.names()[0]
    config = CONFIGS.get((family, name), {"class_name": name, "config": {}})
    config = {**config, "config": {**config.get("config", {}), "no_such_arg": 1}}
    with pytest.raises(ValueError, match="unknown argument 'no_such_arg'.*accepts"):
        registry.get(config)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_user_class_registers_and_unregisters(family):
    registry = FAMILIES[family]
    custom = type("Custom", (registry.base,), {})
    assert registry.register("custom_member", custom) is custom
    try:
        assert "custom_member" in registry.names()
        assert registry.lookup("custom_member") is custom
        assert custom.name == "custom_member"
        with pytest.raises(ValueError, match="already registered"):
            registry.register("custom_member", type("Other", (registry.base,), {}))
    finally:
        registry.unregister("custom_member")
    assert "custom_member" not in registry.names()
    with pytest.raises(TypeError, match="subclass"):
        registry.register("not_a_member", dict)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_public_module_offers_the_registry(family):
    registry = FAMILIES[family]
    module = importlib.import_module(MODULES[family])
    for function in ("get", "serialize", "deserialize", "names", "register"):
        assert callable(getattr(module, function)), f"{module.__name__}.{function}"
    assert module.names() == registry.names()
    name = registry.names()[0]
    identifier = CONFIGS.get((family, name), name)
    member = module.get(identifier)
    assert type(member) is registry.lookup(name)
    assert module.deserialize(module.serialize(member)).__class__ is type(member)


def test_listing_every_family_imports_no_tensorflow():
    code = (
        "import sys\n"
        "from keras_psdist import families\n"
        "from keras_psdist.registry import Registry\n"
        "listed = {k: v.names() for k, v in vars(families).items()"
        " if isinstance(v, Registry)}\n"
        "assert len(listed) >= 5 and all(listed.values()), listed\n"
        "loaded = [m for m in ('tensorflow', 'keras') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
