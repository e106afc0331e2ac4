"""The families of the registry (`registry.FAMILY_PACKAGES`: a variant's family is the sub-package its module lives in) and the cost each variant is labelled with (`registry.cost`):
every registered variant is in exactly one family, and the label agrees with the `cost_exponent` that
tests/attention/test_cost.py holds the variant to."""

import pytest

from lra_jax.attention import registry


def test_every_registered_variant_is_in_exactly_one_family_the_sub_package_it_lives_in():
    listed = [name for members in registry.families().values() for name in members]
    assert sorted(listed) == registry.names(), "each registered variant is in one family, and nothing else is"
    assert registry.family_of("reformer") == "learned patterns"
    assert registry.family_of("s4d") == "state space and gated recurrence"
    assert registry.family_of("softmax") == registry.family_of("luong") == "full attention"
    for family, package in registry.FAMILY_PACKAGES.items():
        for name in registry.families()[family]:
            assert registry.get(name).__module__.startswith(f"lra_jax.attention.{package}".rstrip(".")), name


def test_a_variant_outside_every_family_package_is_named_with_the_fix(monkeypatch):
    class Elsewhere:
        __module__ = "my_project.attention"

    monkeypatch.setitem(registry._VARIANTS, "elsewhere", Elsewhere)
    with pytest.raises(ValueError, match="'elsewhere' is defined in my_project.attention, outside every family"):
        registry.family_of("elsewhere")


def test_the_cost_label_agrees_with_the_cost_exponent():
    for name in registry.names():
        exponent, label = registry.get(name).cost_exponent, registry.cost(name)
        assert (label == "O(n²)") == (exponent == 2), (name, exponent, label)
        if exponent == 1.5:  # sqrt(n) inputs per position: the term says which setting that is
            assert label in ("O(n w)", "O(n k)"), (name, label)
    assert set(registry.COST_TERMS) <= set(registry.names())
    assert set(registry.COST_TERMS.values()) == {"w", "k", "log n"}
    assert [registry.cost(n) for n in ("softmax", "local", "linformer", "performer", "mega", "fnet", "hyena")] == [
        "O(n²)", "O(n w)", "O(n k)", "O(n)", "O(n²)", "O(n log n)", "O(n log n)"]
