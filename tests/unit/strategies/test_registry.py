"""The strategy registry: every strategy described, user strategies registered by name (no
Spark; tests/integration/test_strategies_spark.py fits with one defined in a function)."""
from __future__ import annotations

import pytest

from sparkddl import ConfigError, strategies
from sparkddl.strategies import Strategy


@pytest.fixture
def clean_registry():
    before = dict(strategies.REGISTRY)
    yield
    strategies.REGISTRY.clear()
    strategies.REGISTRY.update(before)


def test_every_built_in_strategy_says_what_it_does():
    described = strategies.describe()
    assert list(described) == [cls.name for cls in strategies.BUILT_IN]
    assert described["local_sgd"].startswith("Local SGD: ranks train on their own")
    assert all(described.values())
    assert strategies.registered() == {}


def test_a_registered_strategy_is_created_by_name_with_its_options(clean_registry):
    @strategies.register
    class Halves(Strategy):
        """Averages every other step (a test's own strategy)."""
        name = "halves"
        OPTIONS = {"every": 2}

        def check_options(self):
            self.check_int("every", 1)

    made = strategies.create("halves", {"every": 3})
    assert isinstance(made, Halves) and made.options == {"every": 3}
    assert strategies.describe()["halves"] == "Averages every other step (a test's own strategy)."
    assert strategies.registered() == {"halves": Halves}
    with pytest.raises(ConfigError, match=r"strategy 'halves' option every=0 is invalid"):
        strategies.create("halves", {"every": 0})
    with pytest.raises(ConfigError, match=r"unknown strategy 'halvs'; choose one of .*halves "
                                          r"\(or register your own"):
        strategies.create("halvs")


def test_what_register_refuses(clean_registry):
    class Nameless(Strategy):
        pass

    class Impostor(Strategy):
        name = "allreduce"

    with pytest.raises(ConfigError, match="needs a name"):
        strategies.register(Nameless)
    with pytest.raises(ConfigError, match="'allreduce' is built in"):
        strategies.register(Impostor)
    with pytest.raises(ConfigError, match="takes a subclass of sparkddl.strategies.Strategy"):
        strategies.register(dict)
    assert strategies.REGISTRY["allreduce"] is strategies.BUILT_IN[0]


def test_every_built_in_option_is_typed_and_described():
    import dataclasses

    from sparkddl.strategies.base import options_of
    for cls in strategies.BUILT_IN:
        described = options_of(cls)
        assert [o["name"] for o in described] == list(cls.OPTIONS)
        assert all(o["doc"] and o["type"] for o in described), cls.name
        assert dataclasses.is_dataclass(cls.Options)
    ssp = {o["name"]: o for o in options_of(strategies.REGISTRY["ssp"])}
    assert ssp["min_staleness"]["type"] == "int | None" and ssp["staleness"]["default"] == 3
    made = strategies.create("local_sgd", {"period": 4})
    assert made.settings.period == 4 and made.settings.warmup_steps == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.settings.period = 5
