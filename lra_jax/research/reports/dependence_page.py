"""The docs page "The variants at a glance" (docs/variants-at-a-glance.md) and its images, one per family
(docs/assets/patterns/), generated from the maps of every registered variant (`dependence_maps.panels`).

`write(docs_dir)` draws the maps and writes the page and the PNGs; `stale(docs_dir)` draws the maps again and
lists what differs: the page byte for byte, each PNG by the digest of the levels it shows
(`dependence_figure.family_digest`), which it carries, so a matplotlib or FreeType version that draws other
bytes does not fail the check. `python -m lra_jax.tools.docs` and its `--check` call them.
"""

from __future__ import annotations

import os

from lra_jax.attention import registry
from lra_jax.research.reports import dependence_maps as maps, dependence_figure
from lra_jax.research.reports.docs_pages import GLANCE, MARK

PAGE = GLANCE
IMAGES = "assets/patterns"  # under docs/

# What each variant's map shows at the settings drawn (`dependence_maps.SETTINGS`), one line each: the page gives it
# beside the counts measured on the map (`dependence_maps.summary`).
READINGS = {
    "softmax": "every pair, weighted by softmax(q·k/√d): a dense map",
    "additive": "every pair, weighted by a softmax of additive (tanh) scores (Bahdanau): dense",
    "luong": "every pair, weighted by a softmax of multiplicative scores (Luong): dense",
    "local": "a band of 2w + 1 = 13 inputs around the diagonal (w = 6), cut at the ends",
    "strided": "blocks of l = 8 on the diagonal and every l-th input: the local and the strided set of "
               "Child et al., mixed by the output projection",
    "longformer": "a band of w = 6 either side and 2 global tokens, which read and are read by every position "
                  "(the first rows and columns)",
    "bigbird": "blocks of 8: the diagonal block and its neighbours, a global block (first block row and column) "
               "and one random block per block row",
    "reformer": "the inputs hashed into the same bucket, in sorted chunks of 8: a scattered set that another "
                "input changes",
    "routing": "the inputs in the same of 4 k-means clusters: a set that another input changes",
    "sinkhorn": "its own block of 8 and the blocks a soft (Sinkhorn) sorting moves to it: the soft permutation "
                "mixes every block a little, so the map is dense and brightest on the blocks chosen",
    "linformer": "dense: keys and values projected along the sequence to k = 16",
    "nystromformer": "dense: softmax through 8 landmarks (segment means), plus a depthwise convolution of the "
                     "values (the brighter band)",
    "performer": "dense: softmax approximated by 32 positive random features",
    "linear": "dense: elu + 1 features, one sum over all keys",
    "taylor": "dense: exp replaced by its second-order Taylor expansion",
    "synthesizer": "dense: weights synthesized from each query token alone, not from q·k",
    "lightweight_conv": "a band of 7 (the kernel, centred), weights shared along the sequence",
    "dynamic_conv": "a band of 7 whose weights each position predicts from its own input",
    "mixer": "dense: an MLP across the sequence axis",
    "fnet": "dense and nearly flat: a Fourier transform along the sequence, no weights",
    "gmlp": "the diagonal above all: its spatial gating matrix starts near zero with a bias of one, so at "
            "initialisation each output reads mostly its own input",
    "s4d": "a long convolution both ways, its kernel from a diagonal state space",
    "s5": "a diagonal state-space scan both ways",
    "lru": "a linear recurrent unit scanned both ways",
    "mega": "a moving average both ways, then single-head attention over the whole sequence: dense",
    "hyena": "implicit long convolutions both ways, gated: dense",
    "s6": "a selective scan (Mamba) both ways: the input sets each step's decay",
    "ssd": "state-space duality (Mamba-2) both ways: the input sets each step's decay",
    "gla": "gated linear attention both ways: data-dependent gates decay the state",
}


def settings_line() -> str:
    shown = "; ".join(f"`{name}` " + ", ".join(f"{k}={v}" for k, v in settings.items())
                      for name, settings in maps.SETTINGS.items())
    return (f"Width {maps.DIM}, {maps.HEADS} heads, weights and input from seed {maps.SEED}; each "
            f"variant's defaults, except where a window, block, bucket, rank or kernel would cover the {maps.LENGTH} "
            f"positions whole: {shown}.")


def image_path(family: str) -> str:
    """The PNG of `family` under docs/."""
    return f"{IMAGES}/{dependence_figure.file_name(family)}"


def entry(variant: str, drawn: list[maps.Panel]) -> str:
    """The page's line for `variant`: cost, what its map shows, and the counts of its panels."""
    own = [panel for panel in drawn if panel.variant == variant]
    default, causal = own[0], next((p for p in own if p.causal), None)
    reading = READINGS.get(variant, "its map")
    text = f"- **`{variant}`**, {default.cost}: {reading}. {maps.reach(default).capitalize()}."
    if causal:
        text += f" Causal form (`{causal.causal}`): {maps.reach(causal)}; {maps.causality(causal)}."
    return text


def page(drawn: list[maps.Panel]) -> str:
    n = len(drawn[0].norms)
    lines = [MARK, "", "# The variants at a glance", "",
             f"Each map shows how much output i of a layer depends on input j: ‖∂y_i/∂x_j‖, the norm over the "
             f"channels of the real layer's Jacobian, at n = {n} positions (all real) and one random input, divided "
             "by the map's largest and coloured on a log scale from 10⁻⁸ to 1. **White is exactly zero**: output i "
             "cannot see input j at all, whereas the darkest colour is a dependence that is merely small. Each variant "
             "is drawn in its default form (both directions for the recurrent mixers: LRA classifies whole "
             "sequences) and, where it has one, in its causal form ([self-pretraining](self-pretraining.md)), whose "
             "map must be white above the diagonal.", "",
             "A panel's title gives the variant, its family and its cost, how its work grows with the length n "
             "(from its `cost_exponent`, [variants](variants.md); w: the inputs a position sees, k: a projected "
             "length; log factors aside). *input-dependent* marks a variant whose input chooses the positions a "
             "query sees (hashing, clustering, sorting): another input draws another map. Every map is one "
             "input's, at initialisation: the magnitudes move as a layer learns; the white does not.", "",
             settings_line(), "",
             "`python -m lra_jax.tools.patterns` draws these maps for any variant, length and seed; "
             "`python -m lra_jax.tools.docs` writes this page and its images, and its `--check` draws the maps "
             "again and fails where they differ (the images compared by a digest of the levels drawn: below 10⁻⁶ "
             "of the largest, exact zeros and rounding alike since machines round differently, then each decade)."]
    for family, members in dependence_figure.by_family(drawn).items():
        variants = list(dict.fromkeys(panel.variant for panel in members))
        heading = family[0].upper() + family[1:]
        lines += ["", f"## {heading}", "",
                  f"![{heading}: the dependence maps of {', '.join(variants)}]({image_path(family)})", ""]
        lines += [entry(variant, drawn) for variant in variants]
    return "\n".join(lines) + "\n"


def write(docs_dir: str, drawn: list[maps.Panel] | None = None) -> list[str]:
    """Draws every registered variant's maps (or `drawn`), writes the page and one PNG per family; returns their paths."""
    drawn = drawn if drawn is not None else maps.panels(registry.names())
    paths = dependence_figure.draw_families(drawn, os.path.join(docs_dir, IMAGES))
    for path in leftovers(docs_dir, paths):
        os.remove(path)
    path = os.path.join(docs_dir, PAGE)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page(drawn))
    return [path, *paths]


def leftovers(docs_dir: str, images: list[str]) -> list[str]:
    """The PNGs under docs/assets/patterns/ other than `images` (a family renamed or gone): the folder is generated."""
    folder = os.path.join(docs_dir, IMAGES)
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    return [os.path.join(folder, name) for name in names
            if name.endswith(".png") and os.path.join(folder, name) not in images]


def stale(docs_dir: str, drawn: list[maps.Panel] | None = None) -> list[str]:
    """The page and images under `docs_dir` that differ from every registered variant's maps (or `drawn`): the
    page by its bytes, a PNG by the digest it carries (missing or undecodable: stale too), and any other PNG there."""
    drawn = drawn if drawn is not None else maps.panels(registry.names())
    out = []
    path = os.path.join(docs_dir, PAGE)
    try:
        with open(path, encoding="utf-8") as f:
            committed = f.read()
    except OSError:
        committed = None
    if committed != page(drawn):
        out.append(path)
    images = []
    for family, members in dependence_figure.by_family(drawn).items():
        images.append(os.path.join(docs_dir, image_path(family)))
        try:
            carried = dependence_figure.carried_digest(images[-1])
        except (OSError, ValueError, SyntaxError):
            carried = None
        if carried != dependence_figure.family_digest(family, members):
            out.append(images[-1])
    return out + leftovers(docs_dir, images)
