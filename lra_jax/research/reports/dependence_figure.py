"""The dependence maps of one family drawn as one PNG (`draw`), and the digest such a PNG carries (`carried_digest`).

Panels of 2.25 inches at 100 dpi, four to a row (a variant with a causal form keeps both of its panels on one
row), so a family of four or more panels is 900 px wide, and no text is under 8.5 pt: 12 px at that width, 10 px
where the docs' content column shows it at 770 px. The colour is log-scaled from 1e-8 to 1 of the map's largest derivative; exactly
zero is white, so an output that cannot see an input is told from one that barely does. Each panel's title
names the variant and its form, its family and its cost, and says "input-dependent" where the input chooses
the positions a query sees. The PNG carries the digest of the levels drawn (`dependence_maps.digest`), no date and
no software version, so that the docs check compares what is drawn, not bytes that differ between matplotlib
versions.
"""

from __future__ import annotations

import os
import textwrap

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from PIL import Image  # noqa: E402

from lra_jax.attention import registry  # noqa: E402
from lra_jax.research.reports.dependence_maps import Panel, digest  # noqa: E402

DIGEST_KEY = "LraPatternsDrawn"  # the PNG text chunk holding "sha256:<digest>"
COLUMNS, PANEL_INCHES, DPI = 4, 2.25, 100
VMIN = 1e-8
ZERO_COLOUR = "white"
TITLE_CHARACTERS = 28  # a title line that fits its panel at 9.5 pt


def slots(drawn: list[Panel]) -> list[Panel | None]:
    """The panels in grid order, a None before a variant's default form where its causal form would else
    wrap to the next row."""
    out: list[Panel | None] = []
    for index, panel in enumerate(drawn):
        has_causal = index + 1 < len(drawn) and drawn[index + 1].variant == panel.variant
        if has_causal and len(out) % COLUMNS == COLUMNS - 1:
            out.append(None)
        out.append(panel)
    return out


def title(panel: Panel) -> str:
    """Variant and form; family (wrapped to the panel's width); cost (and "input-dependent")."""
    last = panel.cost + (", input-dependent" if panel.input_dependent else "")
    return "\n".join([panel.label, *textwrap.wrap(panel.family, TITLE_CHARACTERS), last])


def figure_title(family: str, n: int) -> str:
    return f"{family[0].upper()}{family[1:]}: ||dy_i / dx_j|| at n = {n}"


def family_digest(family: str, drawn: list[Panel]) -> str:
    """The digest of what the figure of `family` shows (`dependence_maps.digest` of its panels and titles)."""
    return digest(drawn, figure_title(family, len(drawn[0].norms)), *(title(p) for p in drawn))


def draw(family: str, drawn: list[Panel], path: str) -> str:
    """Draws `drawn` (one family's panels) into the PNG `path`; returns the digest it carries."""
    grid = slots(drawn)
    rows = -(-len(grid) // COLUMNS)
    columns = min(COLUMNS, len(grid))
    n = len(drawn[0].norms)
    carried = family_digest(family, drawn)
    width, height = columns * PANEL_INCHES, rows * (PANEL_INCHES + 0.8) + 0.9
    fig, axes = plt.subplots(rows, columns, figsize=(width, height), squeeze=False, layout="constrained")
    viridis = plt.get_cmap("viridis")
    cmap = viridis.with_extremes(bad=ZERO_COLOUR, under=viridis(0.0))  # zero (masked) white; below VMIN darkest
    norm = LogNorm(vmin=VMIN, vmax=1.0)
    image = None
    for slot, ax in zip(grid + [None] * (rows * columns - len(grid)), axes.flat):
        if slot is None:
            ax.axis("off")
            continue
        image = ax.imshow(np.ma.masked_equal(slot.norms, 0.0), cmap=cmap, norm=norm, interpolation="nearest")
        ax.set_title(title(slot), fontsize=9.5, linespacing=1.15)
        ax.set_xticks([0, n // 2, n - 1])
        ax.set_yticks([0, n // 2, n - 1])
        ax.tick_params(labelsize=8.5, length=2, pad=1)
        ax.set_xlabel("input j", fontsize=8.5, labelpad=1)
        ax.set_ylabel("output i", fontsize=8.5, labelpad=0)
    fig.suptitle(figure_title(family, n), fontsize=10.5)
    bar = fig.colorbar(image, ax=axes, location="bottom", shrink=min(0.8, 2.4 / columns), aspect=40,
                       extend="min", pad=0.02)
    bar.ax.tick_params(labelsize=8.5)
    bar.set_label("relative to the map's largest (log scale); white: exactly zero", fontsize=8.5)
    fig.savefig(path, dpi=DPI, metadata={"Software": None, DIGEST_KEY: carried})
    plt.close(fig)
    return carried


def carried_digest(path: str) -> str | None:
    """The digest the PNG `path` carries (None where it carries none); OSError or ValueError where it does
    not decode as a PNG."""
    with Image.open(path) as image:
        if image.format != "PNG":
            raise ValueError(f"a {image.format} image, not a PNG")
        image.load()  # decode every pixel: a truncated file fails here
        return image.text.get(DIGEST_KEY)


def file_name(family: str) -> str:
    """The PNG of `family`: "convolution and MLP mixing" -> "convolution-and-mlp-mixing.png"."""
    return family.lower().replace(" ", "-") + ".png"


def by_family(drawn: list[Panel]) -> dict[str, list[Panel]]:
    """{family: its panels of `drawn`}, in the order of `registry.FAMILY_PACKAGES`, families without a panel left out."""
    groups = {family: [panel for panel in drawn if panel.family == family] for family in registry.FAMILY_PACKAGES}
    return {family: members for family, members in groups.items() if members}


def draw_families(drawn: list[Panel], out: str) -> list[str]:
    """One PNG per family of `drawn` under `out` (`file_name`); returns their paths."""
    os.makedirs(out, exist_ok=True)
    paths = []
    for family, members in by_family(drawn).items():
        paths.append(os.path.join(out, file_name(family)))
        draw(family, members, paths[-1])
    return paths
