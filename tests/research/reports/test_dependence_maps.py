"""The dependence maps (`dependence_maps`), their figure (`dependence_figure`) and the docs page built from them
(`dependence_page`): what a map counts, what its digest sees, and that the page's check names a page edited by
hand and an image drawn from other maps."""

import numpy as np
import pytest

from lra_jax.research.reports import dependence_maps as maps, dependence_figure, dependence_page

N = 16


@pytest.fixture(scope="module")
def drawn():
    """local's maps (default and causal) at n = 16: a band, a half band."""
    return maps.panels(["local"], n=N)


def test_a_map_is_the_layers_jacobian_pattern(drawn):
    default, causal = drawn
    assert (default.variant, default.causal, causal.causal) == ("local", None, "causal=True")
    band = np.abs(np.subtract.outer(np.arange(N), np.arange(N))) <= maps.SETTINGS["local"]["window"]
    np.testing.assert_array_equal(default.norms > 0, band)
    np.testing.assert_array_equal(causal.norms > 0, band & np.tri(N, dtype=bool))
    assert default.norms.max() == 1.0 and causal.leak() == 0.0
    assert maps.summary(causal).endswith("no output depends on a later input (exactly zero)")
    assert f"of the {N} inputs on average" in maps.reach(default)


def test_a_causal_form_that_leaks_is_called_not_causal():
    norms = np.tri(8) + 3e-8 * (1 - np.tri(8))
    text = maps.summary(maps.Panel("s4d", "bidirectional=False", norms))
    assert "at up to 1e-7 of the largest derivative" in text and "not causal" in text


def test_the_digest_sees_decades_not_the_last_bits_nor_rounding_where_the_algebra_says_zero():
    norms = np.array([[1.0, 0.02], [0.0, 3e-7]])
    base = maps.digest([maps.Panel("softmax", None, norms)])
    assert maps.digest([maps.Panel("softmax", None, norms * (1 + 1e-6))]) == base
    # an exact zero that another machine computes as rounding, and rounding it computes as zero: the same map
    assert maps.digest([maps.Panel("softmax", None, norms + np.array([[0, 0], [1e-8, 0]]))]) == base
    assert maps.digest([maps.Panel("softmax", None, norms * np.array([[1, 1], [1, 0]]))]) == base
    assert maps.digest([maps.Panel("softmax", None, norms + np.array([[0, 0], [1e-5, 0]]))]) != base
    assert maps.digest([maps.Panel("softmax", None, norms * np.array([[1, 0.1], [1, 1]]))]) != base
    np.testing.assert_array_equal(maps.levels(norms), [[6, 5], [0, 0]])


def test_a_panel_says_its_family_cost_and_whether_the_input_chooses_its_pattern():
    local = maps.Panel("local", None, np.eye(4))
    reformer = maps.Panel("reformer", None, np.eye(4))
    assert dependence_figure.title(local) == "local\nfixed sparse patterns\nO(n w)"
    assert dependence_figure.title(reformer).endswith("input-dependent")


def test_the_check_names_a_hand_edited_page_and_an_image_of_other_maps(drawn, tmp_path):
    written = dependence_page.write(str(tmp_path), drawn)
    page, image = tmp_path / dependence_page.PAGE, tmp_path / dependence_page.image_path("fixed sparse patterns")
    assert sorted(written) == sorted([str(page), str(image)])
    assert dependence_page.stale(str(tmp_path), drawn) == []
    text = page.read_text()
    assert "- **`local`**, O(n w): a band" in text and "Causal form (`causal=True`)" in text
    page.write_text(text.replace("a band", "a wide band", 1))
    assert dependence_page.stale(str(tmp_path), drawn) == [str(page)]
    page.write_text(text)
    other = [maps.Panel("local", p.causal, np.where(p.norms > 0, 1.0, 1e-9)) for p in drawn]  # no zeros left
    dependence_figure.draw("fixed sparse patterns", other, str(image))
    assert dependence_page.stale(str(tmp_path), drawn) == [str(image)]
    image.write_bytes(image.read_bytes()[:200])  # truncated: does not decode
    assert dependence_page.stale(str(tmp_path), drawn) == [str(image)]
    leftover = tmp_path / dependence_page.IMAGES / "a-family-renamed.png"
    leftover.write_bytes(b"")
    dependence_page.write(str(tmp_path), drawn)
    assert not leftover.exists() and dependence_page.stale(str(tmp_path), drawn) == []
