"""What the chart was drawn from, and the check that it still is (`python -m lra_jax.tools.chart --check`).

The manifest (`lra_chart.inputs.json`, beside the chart) records the command that drew the chart, every
input file it read (path relative to the working directory, the repository root; sha256; the lra_jax commit
recorded inside it, where it has one) and what each panel draws (title, axis label, and per point: variant,
x, y, bubble size, label, colour, marker), with the sha256 of those drawn values (`drawn_digest`). Image bytes
differ between matplotlib and FreeType versions, so the check never compares the PNG or SVG bytes: it
compares the drawn values, and checks that each image decodes (Pillow for the PNG, an XML parse for the SVG)
and carries the digest of a fresh draw's values, written into it when drawn (`DIGEST_KEY`: a PNG text chunk;
the SVG's Dublin Core identifier, `SVG_DIGEST_PREFIX`), so an image replaced, damaged or drawn from other
values is named (`image_problems`). The Markdown table is compared whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import xml.etree.ElementTree as ElementTree
from typing import Any

from PIL import Image

from lra_jax.research.compilation.table2_report import REFERENCE

MANIFEST_NAME = "lra_chart.inputs.json"
CHART_FILES = ("lra_chart.png", "lra_chart.svg")
TABLE_NAME = "lra_results.md"
SIGNIFICANT_DIGITS = 6  # drawn values are recorded to this precision: enough to see any real change
DIGEST_KEY = "LraChartDrawn"  # the PNG text chunk holding "sha256:<drawn_digest>"
SVG_DIGEST_PREFIX = "lra_chart drawn "  # the SVG's <dc:identifier>: this, then "sha256:<drawn_digest>"
DUBLIN_CORE = "{http://purl.org/dc/elements/1.1/}"


def display_path(path: str) -> str:
    """`path` relative to the working directory (the repository root when run as documented), '/'-separated."""
    return os.path.relpath(os.path.abspath(path)).replace(os.sep, "/")


@dataclasses.dataclass(frozen=True)
class ChartOptions:
    """The flags of `python -m lra_jax.tools.chart` that decide what is drawn, in the order a command names them.
    `runs`, `spt_runs`, `bench` and `cpu_bench` are comma-separated lists (`bench` of paths or globs)."""
    runs: str = "runs"
    spt_runs: str | None = None
    bench: str | None = None
    device: str | None = None
    length: int | None = None
    dropout_rate: float = 0.1
    cpu_bench: str | None = None
    modeled: str | None = None
    out: str = "experiments/charts"
    scale: str | None = None
    min_seeds: int = 1
    reference: str | None = REFERENCE

    def normalized(self) -> ChartOptions:
        """The same options with every path relative to the working directory, so commands compare equal."""
        names = ("runs", "spt_runs", "bench", "cpu_bench", "out", "modeled", "reference")
        paths = {name: ",".join(display_path(p) for p in getattr(self, name).split(",") if p)
                 for name in names if getattr(self, name)}
        return dataclasses.replace(self, **paths)

    def command(self) -> str:
        """The command line that draws with these options (flags at their default left out, but --runs, --out)."""
        options, defaults = self.normalized(), ChartOptions().normalized()
        parts = ["python -m lra_jax.tools.chart"]
        for field in dataclasses.fields(options):
            value = getattr(options, field.name)
            if value is None or (field.name in ("min_seeds", "reference", "dropout_rate")
                                 and value == getattr(defaults, field.name)):
                continue
            parts.append(f"--{field.name}=" + (f"{value:g}" if isinstance(value, float) else shlex.quote(str(value))))
        return " ".join(parts)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ChartOptions:
        """The options a manifest recorded (unknown keys are an old manifest's and are ignored)."""
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


def sha256_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def recorded_commit(path: str) -> str | None:
    """The lra_jax commit a JSON input records (`versions.lra_jax_commit`, or a top-level `commit`); None
    where it records none or is not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    versions = document.get("versions")
    commit = versions.get("lra_jax_commit") if isinstance(versions, dict) else None
    return commit or document.get("commit") or document.get("lra_jax_commit")


def results_files(runs_dir: str) -> list[str]:
    """Every results.json under `runs_dir`, as `selection.load` walks them (unreadable ones included: the
    chart names or skips them, so they decide what it shows too)."""
    return [os.path.join(root, "results.json") for root, _, files in sorted(os.walk(runs_dir))
            if "results.json" in files]


def input_records(paths: list[str]) -> list[dict[str, Any]]:
    """One record per input file (one for a file read twice): path, sha256 and recorded commit, sorted by path."""
    unique = {display_path(p): p for p in paths}
    records = [{"path": shown, "sha256": sha256_of(p), "commit": recorded_commit(p)} for shown, p in unique.items()]
    return sorted(records, key=lambda r: r["path"])


def rounded(value: float) -> float:
    """`value` to SIGNIFICANT_DIGITS significant digits: what the manifest records and compares."""
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def drawn_digest(panels: list[dict[str, Any]]) -> str:
    """'sha256:<hex>' of the drawn values (the manifest's panels: titles, labels, notes and points to
    SIGNIFICANT_DIGITS), the same on every machine and matplotlib version for the same drawing."""
    text = json.dumps(panels, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def manifest(options: ChartOptions, inputs: list[str], panels: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest of one drawing: its command, options, inputs, drawn panels and their digest."""
    options = options.normalized()
    return {"generated_by": "python -m lra_jax.tools.chart; check with `python -m lra_jax.tools.chart --check`",
            "command": options.command(), "options": dataclasses.asdict(options),
            "inputs": input_records(inputs), "panels": panels, "drawn_sha256": drawn_digest(panels)}


def image_metadata(digest: str) -> dict[str, dict[str, str | None]]:
    """The metadata `savefig` writes per format: the drawn digest, and no date or software version."""
    return {"png": {"Software": None, DIGEST_KEY: digest},
            "svg": {"Date": None, "Creator": None, "Identifier": SVG_DIGEST_PREFIX + digest}}


def carried_digest(path: str) -> str | None:
    """The drawn digest an image carries (None where it carries none); raises OSError or ValueError (and
    Pillow's or the XML parser's errors, subclasses of those or SyntaxError) where it does not decode."""
    if path.endswith(".png"):
        with Image.open(path) as image:
            if image.format != "PNG":
                raise ValueError(f"a {image.format} image, not a PNG")
            image.load()  # decode every pixel: a truncated file fails here
            return image.text.get(DIGEST_KEY)
    root = ElementTree.parse(path).getroot()
    if root.tag != "{http://www.w3.org/2000/svg}svg":
        raise ValueError(f"an XML document whose root is {root.tag}, not an SVG")
    identifier = root.find(f".//{DUBLIN_CORE}identifier")
    text = identifier.text if identifier is not None else None
    return text[len(SVG_DIGEST_PREFIX):] if text and text.startswith(SVG_DIGEST_PREFIX) else None


def image_problems(out: str, digest: str, command: str) -> list[str]:
    """One line per chart image in `out` that is missing, does not decode, or was not drawn from the values
    whose digest is `digest` (the manifest's); each names the file and the command that redraws it."""
    found = []
    for name in CHART_FILES:
        path = os.path.join(out, name)
        shown = display_path(path)
        if not os.path.isfile(path):
            found.append(f"output missing: {shown}")
            continue
        try:
            carried = carried_digest(path)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
            kind = "a PNG" if name.endswith(".png") else "an SVG"
            why = f"{type(error).__name__}: {error}".splitlines()[0][:200]
            found.append(f"output damaged: {shown} does not decode as {kind} ({why}); redraw it with `{command}`")
            continue
        if carried != digest:
            was = f"carries the drawn digest {carried[:19]}…" if carried else "carries no drawn digest"
            found.append(f"output differs: {shown} was not drawn from the values in {MANIFEST_NAME} ({was}, "
                         f"they give {digest[:19]}…); redraw it with `{command}`")
    return found


def manifest_text(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _input_problems(committed: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[str]:
    before = {r["path"]: r for r in committed}
    now = {r["path"]: r for r in fresh}
    problems = [f"input added: {p} (not among the inputs the chart was drawn from)"
                for p in sorted(now.keys() - before)]
    problems += [f"input removed: {p} (the chart was drawn from it)" for p in sorted(before.keys() - now)]
    problems += [f"input changed: {p} (sha256 {before[p]['sha256'][:12]}… when drawn, {now[p]['sha256'][:12]}… now)"
                 for p in sorted(before.keys() & now) if before[p]["sha256"] != now[p]["sha256"]]
    return problems


def _panel_problems(where: str, committed: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[str]:
    if len(committed) != len(fresh):
        return [f"output differs: {where}: {len(committed)} panels drawn, a fresh draw has {len(fresh)}"]
    problems = []
    for i, (old, new) in enumerate(zip(committed, fresh), 1):
        for key in sorted((old.keys() | new.keys()) - {"points"}):
            if old.get(key) != new.get(key):
                problems.append(f"output differs: {where}: panel {i} {key} {old.get(key)!r}, a fresh draw "
                                f"has {new.get(key)!r}")
        before = {p["label"]: p for p in old.get("points", [])}
        now = {p["label"]: p for p in new.get("points", [])}
        for label in sorted(before.keys() | now.keys()):
            if before.get(label) != now.get(label):
                problems.append(f"output differs: {where}: panel {i} point {label!r} drawn as "
                                f"{before.get(label)}, a fresh draw has {now.get(label)}")
    return problems


def _first_difference(old: str, new: str) -> str:
    old_lines, new_lines = old.splitlines(), new.splitlines()
    for n, (a, b) in enumerate(zip(old_lines, new_lines), 1):
        if a != b:
            return f"line {n} differs"
    return f"{len(old_lines)} lines, a fresh draw has {len(new_lines)}"


def problems(out: str, fresh_manifest: dict[str, Any], fresh_tables: dict[str, str]) -> list[str]:
    """One line per way the chart files in `out` disagree with a fresh draw ([] when they all agree): an
    input added, removed or changed, a chart image missing, damaged or drawn from other values
    (`image_problems`), a table (`fresh_tables`: file name -> text) or the drawn values differing."""
    manifest_path = os.path.join(out, MANIFEST_NAME)
    try:
        with open(manifest_path, encoding="utf-8") as f:
            committed = json.load(f)
        if not isinstance(committed, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        return image_problems(out, fresh_manifest["drawn_sha256"], fresh_manifest["command"]) + [
            f"output missing: {display_path(manifest_path)} cannot be read ({type(error).__name__})"]
    # The images against the committed manifest's values, which are compared with a fresh draw's below: a
    # stale chart is named once, by its inputs and values, and an image that is not the manifest's on its own.
    found = image_problems(out, drawn_digest(committed.get("panels", [])), fresh_manifest["command"])
    if committed.get("command") != fresh_manifest["command"]:
        found.append(f"command differs: the chart was drawn by `{committed.get('command')}`, "
                     f"the check ran `{fresh_manifest['command']}`")
    found += _input_problems(committed.get("inputs", []), fresh_manifest["inputs"])
    found += _panel_problems(display_path(manifest_path), committed.get("panels", []), fresh_manifest["panels"])
    for name, fresh_table in fresh_tables.items():
        table_path = os.path.join(out, name)
        try:
            with open(table_path, encoding="utf-8") as f:
                table = f.read()
        except OSError:
            found.append(f"output missing: {display_path(table_path)}")
            continue
        if table != fresh_table:
            found.append(f"output differs: {display_path(table_path)} ({_first_difference(table, fresh_table)} "
                         "from a fresh draw)")
    return found
