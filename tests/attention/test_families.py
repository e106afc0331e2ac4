"""The families of the registry (`registry.FAMILIES`) and the cost each variant is labelled with (`registry.cost`):
every registered variant is in exactly one family, and the label agrees with the `cost_exponent` that
tests/attention/test_cost.py holds the variant to."""

import pytest

from lra_jax.attention import registry


def test_every_registered_variant_is_in_exactly_one_family():
    listed = [name for members in registry.FAMILIES.values() for name in members]
    assert sorted(listed) == registry.names(), "FAMILIES lists each registered variant once, and nothing else"
    assert registry.family_of("reformer") == "learned patterns"
    assert registry.family_of("s4d") == "state space and gated recurrence"


def test_a_variant_in_no_family_is_named():
    with pytest.raises(ValueError, match="'nonesuch' is in no family"):
        registry.family_of("nonesuch")


def test_the_cost_label_agrees_with_the_cost_exponent():
    for name in registry.names():
        exponent, label = registry.get(name).cost_exponent, registry.cost(name)
        assert (label == "O(n²)") == (exponent == 2), (name, exponent, label)
        if exponent == 1.5:  # sqrt(n) inputs per position: the term says which setting that is
            assert label in ("O(n w)", "O(n k)"), (name, label)
    assert set(registry.COST_TERMS) <= set(registry.names())
    assert set(registry.COST_TERMS.values()) == {"w", "k"}
    assert [registry.cost(n) for n in ("softmax", "local", "linformer", "performer", "mega")] == [
        "O(n²)", "O(n w)", "O(n k)", "O(n)", "O(n²)"]
