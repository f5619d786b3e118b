"""The profiles: params.yaml (the paper protocol) plus a few overrides, defined once here.

`make smoke` and `make gpu` hand these to `dvc exp run -S key=value`; a machine without DVC (the
GPU box of scripts/gpu_session.sh) writes the same values into a params file of its own:

    python -m pipeline.profiles gpu --write params.gpu.yaml
    python -m pipeline.profiles smoke --exec dvc exp run      # runs: dvc exp run -S ... -S ...
    python -m pipeline.profiles paper --check                 # what `make repro` asks first
    python -m pipeline.profiles paper-gpu --set train.amp=true --write params.paper-gpu.yaml
                                           # a setting over the profile's (a GPU window's paper protocol in bf16)

Profiles never mix. `--check` refuses, naming the keys, when the workspace's params.yaml differs
from the committed one anywhere the profile does not set itself (a leftover smoke value under a
gpu run, say), and warns with a time estimate before the paper protocol starts on a CPU. The
smoke profile's `--exec` puts params.yaml and dvc.lock back as they were when it ends (its
experiment stays in `dvc exp show`), so a smoke run never changes what `make repro` runs, and
reports/ too: the smoke's report goes to smoke-report/ and the published one stays as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from pipeline import warm as warm_mod
from pipeline.core import registry
from pipeline.core.params import ablation_variants, cpu_epoch_seconds, precision_twins

class Twins:
    """A profile value for an ablation list: the list params.yaml holds there and every precision twin
    (`params.precision_twins`) whose original trains (resolved by `apply`; `dvc exp run -S` gets the
    whole list)."""


# the precision check (#36 item 6): capsnet_r3_recon_fp32 trains beside the gpu profile's bf16 original;
# the smoke profile trains it too, so every stage of it runs on the CPU (where both are fp32)
WITH_PRECISION_TWINS = Twins()

PROFILES: dict[str, dict[str, Any]] = {
    "paper": {},  # params.yaml as committed: 640 epochs, 3 seeds, every variant
    # tiny deterministic subsets, 1 epoch, CPU; one affNIST-style transform per digit, not 32; two
    # seeds, so the stacked variants train as a real stack (vmap) and the report has a spread. 32
    # training and 32 test digits (two steps of 16 per seed): the smoke run checks that every stage
    # of every variant runs and hands the next one what it needs, not what the models learn; its
    # time is the models' arithmetic on those digits (256 digits: about 24 min on 2 cores, mostly
    # the 40×40 and 36×36 CapsNets; 64: about 4 min, over a quarter of the fan-out's item time in
    # the 24-35M-parameter CNNs)
    "smoke": {"base.profile": "smoke", "prepare.train_subset": 32, "prepare.test_subset": 32,
              "prepare.affnist_transforms": 1, "train.epochs": 1, "train.batch_size": 16, "train.device": "cpu",
              "train.log_every": 1, "ablation.seeds": [0, 1], "prepare.multimnist_pairs_per_digit": 2,
              "train.multimnist_epoch_size": 32, "ablation.stacked": WITH_PRECISION_TWINS},
    # 50 epochs (the length popular re-runs use) with the paper's 640-epoch learning-rate decay
    # compressed into them (so the last epoch ends at the paper's final rate, ≈ 2.2e-6, instead of
    # 62 % of the first: the published 2026-11-23 runs were cut, not compressed), 3 seeds, on CUDA:
    # bf16 autocast, model + loss
    # compiled together for the CapsNets (the CNNs train faster eager, reports/benchmarks.md), cuDNN
    # autotuning instead of deterministic kernels, a checkpoint every 5 epochs; MultiMNIST is scored
    # on 100 partners per test digit (1M pairs) instead of the paper's 1,000 (10M): about 19 s instead
    # of 190 s per run, estimated from the fp32 inference rate the H100 bench measured (52.6k images/s).
    # The whole step captured as one CUDA graph (train.cuda_graph): on an H200 (2026-11-26, b8f3efe)
    # capsnet_r3_recon's one seed 66.1k images/s against 31.8k uncaptured, baseline_cnn 31.8k against
    # 30.5k, and its CUDA tests passed (reports/benchmarks.md); in fp32 (the precision twin) capture gains
    # less: 14.35k compiled and captured against 13.0k eager (H200, 2026-11-27)
    "gpu": {"base.profile": "gpu", "train.epochs": 50, "train.lr_schedule_epochs": 640, "train.amp": True,
            "train.compile": True, "train.compile_cnns": False, "train.deterministic": False, "train.device": "cuda",
            "train.checkpoint_every": 5, "prepare.multimnist_pairs_per_digit": 100, "train.cuda_graph": True,
            "ablation.stacked": WITH_PRECISION_TWINS},
    # the paper protocol (640 epochs, its schedule, 3 seeds, the paper's 10M MultiMNIST test pairs) with
    # the fast path's settings: compiled CapsNets, eager CNNs, cuDNN autotuning, a checkpoint every 5
    # epochs (a call's 10 min limit stops a run mid-way; the next call resumes it). fp32 (TF32 off,
    # train.tf32) until the precision check (bf16 vs fp32 under the gpu profile, 3 seeds each) shows bf16 within seed noise;
    # the whole step captured as one CUDA graph, as in the gpu profile (the same lever, outside the checkpoint key)
    "paper-gpu": {"base.profile": "paper-gpu", "train.compile": True, "train.compile_cnns": False,
                  "train.deterministic": False, "train.device": "cuda", "train.checkpoint_every": 5,
                  "train.cuda_graph": True},
}


def apply(raw: dict, name: str, settings: dict[str, Any] | None = None) -> dict:
    """params.yaml's mapping with profile ``name``'s overrides applied, then ``settings`` ({dotted key: value},
    `--set`: a GPU window's paper protocol in bf16 once the precision check allows it); every key must exist."""
    if name not in PROFILES:
        raise KeyError(f"unknown profile {name!r}; profiles: {', '.join(PROFILES)}")
    out = copy.deepcopy(raw)
    for dotted, value in {**PROFILES[name], **(settings or {})}.items():
        *path, key = dotted.split(".")
        section = out
        for part in path:
            section = section[part]
        if key not in section or isinstance(section[key], dict):
            raise KeyError(f"profile {name}: {dotted} is not a setting of params.yaml")
        section[key] = with_twins(section[key], precision_twins(out), ablation_variants(out)) \
            if isinstance(value, Twins) else value
    return out


def with_twins(names: list[str], twins: dict[str, str], trained: list[str]) -> list[str]:
    """``names`` and each twin whose original is among the ``trained`` variants (once)."""
    return [*names, *(t for t, original in twins.items() if original in trained and t not in trained)]


RESTORED = ("params.yaml", "dvc.lock")  # what a smoke run puts back as it was
# and the published report: the smoke's report stage writes reports/, whose files it puts back as they
# were (new ones removed), its own report set aside where one reads it
REPORTS, SMOKE_REPORT = Path("reports"), Path("smoke-report")


def flatten(raw: dict, prefix: str = "") -> dict[str, Any]:
    """{"train.epochs": 640, …} from the nested mapping."""
    out = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def foreign_keys(workspace: dict, committed: dict, name: str) -> dict[str, tuple[Any, Any]]:
    """Keys where the workspace differs from the committed params and profile ``name`` does not
    set them: {key: (workspace value, committed value)}."""
    here, base = flatten(workspace), flatten(committed)
    return {k: (here.get(k, "<missing>"), base.get(k, "<missing>")) for k in sorted(here.keys() | base.keys())
            if here.get(k) != base.get(k) and k not in PROFILES[name]}


def committed_params(path: str) -> dict | None:
    """params.yaml as HEAD has it; None outside a git checkout (nothing to compare with)."""
    try:
        text = subprocess.run(["git", "show", f"HEAD:{path}"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return yaml.safe_load(text)


def cpu_hours(raw: dict) -> float:
    """Estimated hours to train every (variant, seed) of ``raw`` on a CPU like this project's."""
    fraction = (raw["prepare"]["train_subset"] or 60_000) / 60_000
    seconds = 0.0
    for variant in ablation_variants(raw):
        v = raw["variants"][variant]  # a combination never measured counts as Table 1's CapsNet
        experiment = registry.of_record(v.get("experiment"), v.get("image_size"))
        per_epoch = cpu_epoch_seconds(v["model"], experiment) or cpu_epoch_seconds("capsnet", "table1")
        seconds += per_epoch * fraction * raw["train"]["epochs"]
    return seconds * len(raw["ablation"]["seeds"]) / 3600


def check(name: str, params_path: str = "params.yaml") -> list[str]:
    """Refuse (SystemExit naming the keys) a workspace that would mix profiles; return warnings."""
    workspace = yaml.safe_load(Path(params_path).read_text())
    committed = committed_params(params_path)
    if committed is not None:
        foreign = foreign_keys(workspace, committed, name)
        if foreign:
            listed = "; ".join(f"{k} = {here!r} (committed: {base!r})" for k, (here, base) in foreign.items())
            raise SystemExit(f"{params_path} differs from the committed one where the {name} profile does not set "
                             f"it: {listed}. Restore it (`git checkout {params_path} dvc.lock`) or commit the "
                             "change, then run again; `dvc repro` runs the workspace as it is.")
    target = apply(workspace, name)
    device = str(target["train"]["device"])
    if device.startswith("cuda") and not _cuda_available():  # else it downloads and prepares, then fails to train
        raise SystemExit(f"the {name} profile trains on CUDA (train.device = {device}) and torch sees no CUDA device "
                         "here: run it on a machine with an NVIDIA GPU; `make smoke` runs the whole pipeline on this "
                         "CPU in minutes.")
    warnings = []
    if name != "smoke" and device in ("auto", "cpu") and not _cuda_available():
        warnings.append(f"warning: no CUDA device; the {name} profile would train {len(ablation_variants(target))} "
                        f"variants x {len(target['ablation']['seeds'])} seeds x {target['train']['epochs']} epochs on "
                        f"this CPU: about {cpu_hours(target):,.0f} h (600 s per CapsNet epoch measured on 2 cores). "
                        "`make smoke` checks the pipeline in minutes; real training wants a GPU.")
    return warnings


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run_restoring(command: list[str], paths: tuple[str, ...] = RESTORED, prefill: tuple[dict, int] | None = None,
                  warm: bool = False) -> int:
    """Run ``command``, then put ``paths`` back byte for byte (also when it fails or is interrupted).

    ``prefill`` = (params, slots): first write ``params`` to params.yaml and run every ablation
    item's stages through scripts/fanout.sh, ``slots`` at a time (DVC records each in dvc.lock and
    the run-cache, and each logs its MLflow runs), then run ``command`` on that workspace: a `dvc
    exp run` setting the same params finds those stages up to date in dvc.lock instead of running
    them one after another, and runs what is left (the report). Leaving the prefill's dvc.lock in
    place matters: from the committed one, DVC restores each stage from the run-cache, several
    times slower (README, Profiles).

    ``warm``: every `capsnet` stage process forks from one warm interpreter (pipeline/warm.py,
    its log in logs/warm.log) instead of importing torch and MLflow afresh."""
    with warm_mod.running(Path("logs/warm.log")) if warm else contextlib.nullcontext() as address:
        env = {**os.environ, warm_mod.WARM_ENV: address} if address else dict(os.environ)
        return _run_restoring(command, paths, prefill, env)


def _run_restoring(command: list[str], paths: tuple[str, ...], prefill: tuple[dict, int] | None, env: dict) -> int:
    saved = {Path(p): Path(p).read_bytes() for p in paths if Path(p).is_file()}
    published = _snapshot(REPORTS)
    try:
        if prefill is not None:
            params, slots = prefill
            Path("params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
            labels = " ".join(f"cpu{k}" for k in range(slots))
            print(f"prefill: every item's stages, {slots} at a time (scripts/fanout.sh)", flush=True)
            code = subprocess.run(["bash", "scripts/fanout.sh"],
                                  env={**env, "GPUS": labels, "FANOUT_FINISH": "0"}).returncode
            if code:
                return code  # (restored below)
        return subprocess.run(command, env=env).returncode
    finally:
        for path in _put_back(saved):
            print(f"restored {path}", file=sys.stderr)
        _set_aside(REPORTS, published, SMOKE_REPORT)


def _put_back(saved: dict[Path, bytes]) -> list[Path]:
    """Write each file of ``saved`` whose bytes differ now (or that is gone) back; the ones written."""
    written = [path for path, content in saved.items() if not path.is_file() or path.read_bytes() != content]
    for path in written:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(saved[path])
    return written


def _snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} if folder.is_dir() else {}


def _set_aside(folder: Path, before: dict[Path, bytes], aside: Path) -> None:
    """Copy what ``folder`` holds now to ``aside`` (each subfolder the run wrote in, whole, so the
    report's links hold; untouched ones, such as reports/runs, not), then put ``folder`` back as
    ``before`` had it: files the run wrote get their old bytes, files it made are removed."""
    after = _snapshot(folder)
    if after == before:
        return

    def subfolder(path: Path) -> tuple[str, ...]:  # (its first folder under ``folder``,), () for a file of its own
        return path.relative_to(folder).parent.parts[:1]

    changed = {p for p in after if before.get(p) != after[p]} | (before.keys() - after.keys())
    written = {subfolder(p) for p in changed}
    shutil.rmtree(aside, ignore_errors=True)
    for path, content in after.items():
        if subfolder(path) in written:
            target = aside / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    for path in after.keys() - before.keys():
        path.unlink()
        for parent in path.relative_to(folder).parents[:-1]:  # folders only the run made
            with contextlib.suppress(OSError):
                (folder / parent).rmdir()
    _put_back({path: content for path, content in before.items() if after.get(path) != content})  # `after` read them
    print(f"restored {folder}/ as it was; what the smoke wrote there is in {aside}/", file=sys.stderr)


def dvc_set_args(name: str, raw: dict) -> list[str]:
    """`-S key=value` arguments for `dvc exp run` (values in YAML/JSON flow syntax) that turn params.yaml's
    mapping ``raw`` into profile ``name``'s (a `Twins` value as the whole list it makes)."""
    flat = flatten(apply(raw, name))
    args = []
    for dotted in PROFILES[name]:
        value = flat[dotted]
        args += ["-S", f"{dotted}={value if isinstance(value, str) else json.dumps(value)}"]
    return args


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.profiles", description=__doc__.splitlines()[0])
    parser.add_argument("profile", choices=sorted(PROFILES))
    parser.add_argument("--params", default="params.yaml", help="the base params file")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="PATH", help="write params with the profile applied to PATH")
    group.add_argument("--check", action="store_true",
                       help="refuse a workspace params.yaml that would mix profiles; warn before long CPU runs")
    group.add_argument("--exec", nargs=argparse.REMAINDER, metavar="CMD",
                       help="check, then run CMD followed by -S key=value ... (smoke: restoring params.yaml, dvc.lock)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="with --write: a setting over the profile's (train.amp=true), its value read as YAML")
    parser.add_argument("--prefill", type=int, metavar="SLOTS",
                        help="smoke only: first run every item's stages SLOTS at a time (scripts/fanout.sh), so CMD "
                             "(dvc exp run) finds them up to date in dvc.lock")
    parser.add_argument("--warm", action="store_true",
                        help="smoke only: every `capsnet` stage process forks from one warm interpreter "
                             "(pipeline/warm.py) instead of importing torch and MLflow afresh")
    args = parser.parse_args(argv)
    if args.warm and (args.profile != "smoke" or args.exec is None):
        parser.error("--warm goes with the smoke profile's --exec")
    if args.prefill is not None and (args.profile != "smoke" or args.exec is None or args.prefill < 1):
        parser.error("--prefill SLOTS (≥ 1) goes with the smoke profile's --exec")
    if args.settings and not args.write:  # before --check returns: a setting is never silently dropped
        parser.error("--set goes with --write")
    if args.check or args.exec is not None:
        for line in check(args.profile, args.params):
            print(line, file=sys.stderr)
        if args.check:
            return
    if bad := [s for s in args.settings if "=" not in s]:
        parser.error(f"--set {bad[0]}: write it as KEY=VALUE, e.g. --set train.amp=true")
    raw = yaml.safe_load(Path(args.params).read_text())
    if args.write:
        settings = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.settings)}
        try:
            written = apply(raw, args.profile, settings)
        except KeyError as e:
            parser.error(f"--set: {e.args[0]}")
        extra = f", then {', '.join(args.settings)}" if args.settings else ""
        Path(args.write).write_text(f"# {args.params} with profile {args.profile}{extra} (pipeline/profiles.py)\n"
                                    + yaml.safe_dump(written, sort_keys=False))
        return
    if not args.exec:
        parser.error("--exec needs a command")
    command = args.exec + dvc_set_args(args.profile, raw)
    print(" ".join(command), flush=True)
    if args.profile == "smoke":
        prefill = None if args.prefill is None else (apply(raw, "smoke"), args.prefill)
        sys.exit(run_restoring(command, prefill=prefill, warm=args.warm))
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
