"""What more seeds would cost in GPU time, from the training speeds measured in reports/benchmarks.md.

The benchmarks file holds `capsnet bench`'s rows as tables, one section per device (`## GPU: one
NVIDIA H100 80GB HBM3 (…)`) and one table per variant (`### capsnet_r3_recon (…)`), a row per
configuration (`capsnet-repro bf16 + compile (model+loss) | 24,374 | …`). A run's cost is its
training images (steps × batch, as it recorded them) over the images/s of *its own variant* in the
configuration it trained with (bf16 autocast and compile as recorded) on its recorded device: an
estimate (a bench step times training only, a run also scores the test set each epoch; runs side
by side share a GPU), always stated with the row it comes from. No row for a variant, device or
configuration means no estimate, with one exception, said in the row's citation (`with_stand_ins`): a
variant with no row of its own on a device takes that device's rows of a variant with the same layers
(a recipe or precision twin: the same speed) or of one that does more work on them (more routing
iterations, the decoder too: an upper bound), never a lighter one's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.params import bench_mode_name

PAPER_EPOCHS = 640  # the paper protocol: the official code's 300,000 steps of 128 (paper_reference.yaml's recipe)

CONFIGURATIONS = {  # (bf16 autocast, compile) -> how benchmarks.md names the training step's row
    (True, True): "bf16 + compile", (True, False): "bf16 autocast", (False, False): "eager fp32",
    (False, True): "compile"}


@dataclass(frozen=True)
class BenchRow:
    """One measured training speed: a variant's one-seed step in one configuration on one device."""

    variant: str
    device: str  # the section heading's device, e.g. "NVIDIA H100 80GB HBM3"
    configuration: str  # the table's first column, e.g. "capsnet-repro bf16 + compile (model+loss)"
    images_per_s: float
    section: str  # the section heading, with its date
    stand_in: str = ""  # the benched variant whose row this is, where ``variant`` has none (`with_stand_ins`)
    relation: str = ""  # how ``variant``'s step compares with the stand-in's: the same, or an upper bound

    def cite(self) -> str:
        """'<section> | <variant> <configuration>: N images/s' (`sources` groups them by section)."""
        configuration = self.configuration.removeprefix("capsnet-repro ")
        what = f"{self.variant} at {self.stand_in}'s {configuration} ({self.relation})" if self.stand_in \
            else f"{self.variant} {configuration}"
        return f"{self.section} | {what}: {self.images_per_s:,.0f} images/s"


def sources(cites: list[str]) -> str:
    """Cited rows (`BenchRow.cite`) as one sentence per benchmarks.md section."""
    by_section: dict[str, list[str]] = {}
    for cite in dict.fromkeys(cites):
        section, _, row = cite.partition(" | ")
        by_section.setdefault(section, []).append(row)
    return " ".join(f"reports/benchmarks.md, {section}: {', '.join(rows)}." for section, rows in by_section.items())


def bench_rows(path: Path) -> list[BenchRow]:
    """The one-seed GPU training rows of a benchmarks file ([] when it does not exist)."""
    if not path.is_file():
        return []
    rows, section, device, variant = [], "", "", ""
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            device = section.split("one ", 1)[1].split(" (")[0] if section.startswith("GPU: one ") else ""
            variant = ""
        elif line.startswith("### "):
            variant = line[4:].split()[0]
        elif device and variant and line.startswith("| capsnet-repro "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            try:
                rows.append(BenchRow(variant, device, cells[0], float(cells[1].replace(",", "")), section))
            except (IndexError, ValueError):
                continue  # not a speed row
    return rows


@dataclass(frozen=True)
class Network:
    """What decides a variant's training speed besides the configuration: its model and images, and
    the work its layers do (routing iterations, the decoder). Recipes and precision twins share one."""

    model: str
    experiment: str
    routing_iterations: int
    reconstruction: bool

    def relation(self, other: Network) -> str | None:
        """How a step of this network compares with one of ``other``: 'the same layers', an upper bound
        (``other`` routes more times or adds the decoder), or None (another model or images, or lighter)."""
        if (self.model, self.experiment) != (other.model, other.experiment) or \
                other.routing_iterations < self.routing_iterations or other.reconstruction < self.reconstruction:
            return None
        if other == self:
            return "the same layers"
        more = [f"{other.routing_iterations} routing iterations, not {self.routing_iterations}"] \
            if other.routing_iterations > self.routing_iterations else []
        more += ["the decoder too"] if other.reconstruction > self.reconstruction else []
        return f"an upper bound: {', '.join(more)}"


def with_stand_ins(rows: list[BenchRow], networks: dict[str, Network]) -> list[BenchRow]:
    """``rows`` and, for each variant of ``networks`` without a row of its own on a row's device, the
    rows there of the benched variant closest to it that does at least its work (`Network.relation`:
    the same layers first, then the fewest routing iterations), each citing that variant."""
    out = list(rows)
    for device in dict.fromkeys(r.device for r in rows):
        here = [r for r in rows if r.device == device]
        benched = [v for v in dict.fromkeys(r.variant for r in here) if v in networks]
        for variant, network in networks.items():
            if any(r.variant == variant for r in here):
                continue
            fits = sorted((v for v in benched if network.relation(networks[v])), key=lambda v: (
                networks[v] != network, networks[v].routing_iterations, networks[v].reconstruction))
            if fits:
                out += [dataclasses.replace(r, variant=variant, stand_in=fits[0], relation=network.relation(networks[fits[0]]))
                        for r in here if r.variant == fits[0]]
    return out


def configuration(cfg: dict) -> str:
    """How reports/benchmarks.md names the row of the speed settings a run's config recorded
    (scripts/bench_table.py's labels): bf16 and compile alone by CONFIGURATIONS, a lever's mode by its
    bench name ('bf16-compile-capture' for train.cuda_graph with compile). Settings recorded before the
    levers existed read as off."""
    amp, compiled = bool(cfg.get("amp")), bool(cfg.get("compile"))
    compile_mode = cfg.get("compile_mode", "default") if compiled else None
    name = bench_mode_name(amp, compile_mode, cfg.get("channels_last", False), cfg.get("cuda_graph", False))
    plain = compile_mode in (None, "default") and not cfg.get("channels_last") and not cfg.get("cuda_graph")
    return CONFIGURATIONS[amp, compiled] if plain or name is None else name


def speed(rows: list[BenchRow], variant: str, device: str, cfg: dict) -> BenchRow | None:
    """``variant``'s row on ``device`` (a run's recorded device name) in the configuration its config
    ``cfg`` trained with (`configuration`), or None when none was measured; a captured mode's row the
    bench ran uncaptured prices no run. Where several sections time the device, the last row wins: a
    window's section is appended below the earlier ones (scripts/bench_table.py), so the newest
    measurement prices."""
    wanted = configuration(cfg)
    for row in reversed(rows):
        name = row.configuration.removeprefix("capsnet-repro ")
        if (row.variant == variant and row.device and row.device in device and not name.endswith("(ran uncaptured)")
                and (name == wanted or name.startswith((wanted + " (", wanted + ":")))):
            return row
    return None


def gpu_hours(seeds: int, images_per_seed: float, row: BenchRow) -> float:
    """GPU-hours for ``seeds`` runs of ``images_per_seed`` training images each at ``row``'s speed."""
    return seeds * images_per_seed / row.images_per_s / 3600
