"""The `capsnet` command: one subcommand per DVC stage. Paths come from dvc.yaml's command lines.

Each command parses its arguments, calls its stage's plain function (pipeline/stages/*.py,
bench.run, publish.publish_runs, tracking) and prints the outcome; every error that is the user's
to fix (a :class:`pipeline.core.errors.UserError`) becomes one line, not a traceback
(pipeline/cli_options.py's ``user_errors``).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import click

from pipeline.cli_options import EVALUATED, PARAMS_OPTION, PREPARED, TRAINED, Made, user_errors
from pipeline.core.errors import UserError
from pipeline.core.params import BENCH_MODES as SPEED_MODES
from pipeline.core.params import STACK_LAYOUTS, Params, load_params

BENCH_MODES = list(SPEED_MODES)  # `capsnet bench --mode`: pipeline.training.bench.MODES, read without torch


@click.group()
def main() -> None:
    """capsnet-repro: reproduce Table 1 of Dynamic Routing Between Capsules (Sabour et al. 2017)."""


@main.command()
@click.argument("dest", type=click.Path(file_okay=False))
@user_errors
def download(dest: str) -> None:
    """Fetch the four MNIST IDX files into DEST, verified by SHA-256.

    Sources: $CAPSNET_MNIST_MIRROR (a directory or URL base, files gz or raw), then torchvision's
    public mirrors.
    """
    from pipeline.data.download import download_mnist

    for name, digest in download_mnist(dest).items():
        click.echo(f"{name}  sha256 {digest}  ok")


@main.command()
@click.argument("raw_dir", type=Made("`capsnet download RAW_DIR` (or `dvc repro download`) makes it"))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--figures", "figures_dir", type=click.Path(file_okay=False), required=True,
              help="folder for each experiment's montage of its test sets (dvc.yaml lists them as outputs)")
@PARAMS_OPTION
@user_errors
def prepare(raw_dir: str, out_dir: str, figures_dir: str, params_path: str) -> None:
    """Verify RAW_DIR's IDX files (SHA-256), decode them into uint8 tensors in OUT_DIR and let
    every experiment build its test sets from them.

    Writes train and test (28×28); Table 1's affine_test; §5.2's expanded_test and affnist_test
    (40×40: affnist_test is the real affNIST test set when $CAPSNET_AFFNIST_MIRROR names its .mat
    file, or a folder of its batches, else an affNIST-style set generated here); MultiMNIST's
    multimnist_test recipes.
    """
    from pipeline.stages import prepare as prepare_stage

    params = load_params(params_path)
    click.echo(prepare_stage.run(params, Path(raw_dir), Path(out_dir), Path(figures_dir)))


def _params_for_hints(path: str) -> Params | None:
    """params.yaml where it loads (to name stages in hints), else None: evaluation itself needs none."""
    try:
        return load_params(path)
    except UserError:
        return None


def parse_seeds(text: str, params: Params) -> list[int]:
    """"2" -> [2]; "0,1,2" -> [0, 1, 2] (stacked in one process); "all" -> params.yaml's ablation.seeds
    (what dvc.yaml's train_stacked stage passes: DVC cannot put a list into a command)."""
    if text == "all":
        return list(params.ablation.seeds)
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r}: give a seed (0), comma-separated seeds (0,1,2) or all (params.yaml's "
                                 "ablation.seeds)", param_hint="SEEDS")
    if any(seed < 0 for seed in seeds) or len(set(seeds)) != len(seeds):
        raise click.BadParameter(f"{text!r}: seeds are distinct integers >= 0", param_hint="SEEDS")
    return seeds


@main.command()
@click.argument("variant")
@click.argument("seeds")
@click.argument("data_dir", type=PREPARED)
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--checkpoint", "checkpoint_path", type=click.Path(dir_okay=False), required=True,
              help="resume state, kept outside DVC's outputs so a killed run resumes")
@PARAMS_OPTION
@user_errors
def train(variant: str, seeds: str, data_dir: str, out_dir: str, checkpoint_path: str, params_path: str) -> None:
    """Train VARIANT with SEEDS on DATA_DIR's prepared MNIST; write weights and config to OUT_DIR.

    SEEDS is one seed (0) or several (0,1,2, or all: params.yaml's ablation.seeds) trained stacked
    in one process, each seed exactly as its own run would train; then OUT_DIR names each seed's
    directory with {seed}
    (models/capsnet_r3_recon/seed{seed}). Resumes from --checkpoint when it belongs to the same
    configuration and seeds; a finished run is not retrained. Logs to MLflow (run <variant>-seed<k>
    per seed); a failure or SIGTERM marks the runs FAILED.
    """
    from pipeline.stages import train as train_stage

    params = load_params(params_path)
    seed_list = parse_seeds(seeds, params)
    if len(seed_list) > 1 and "{seed}" not in out_dir:
        raise click.BadParameter(f"{out_dir!r}: with several seeds, name each seed's directory with {{seed}}, "
                                 f"e.g. models/{variant}/seed{{seed}}", param_hint="OUT_DIR")
    out_dirs = [Path(out_dir.replace("{seed}", str(seed))) for seed in seed_list]
    outcomes = train_stage.run_group(params, variant, seed_list, Path(data_dir), out_dirs, Path(checkpoint_path))
    for done, out in zip(outcomes, out_dirs):
        stopped = f", early stop at epoch {len(done.history)}" if done.stop_reason == "target" else ""
        click.echo(f"{variant} seed {done.cfg.seed}: final {done.eval_set} error "
                   f"{done.history[-1]['test_error_pct']:.2f}%{stopped} -> {out}")


@main.command()
@click.argument("model_dir", type=TRAINED)
@click.argument("data_dir", type=PREPARED)
@click.argument("out_dir", type=click.Path(file_okay=False))
@PARAMS_OPTION
@user_errors
def evaluate(model_dir: str, data_dir: str, out_dir: str, params_path: str) -> None:
    """Evaluate MODEL_DIR on its clean and transformed test sets in DATA_DIR; write OUT_DIR.

    28×28 models: MNIST test and the affine-shifted set; 40×40 (§5.2): expanded MNIST and
    affNIST(-style). OUT_DIR gets metrics.json (for DVC), breakdown.json (per-class accuracy,
    accuracy by transform bins, which sets), predictions.safetensors (per image: label,
    prediction, scores) and, in figures/, confusion.png and, for reconstruction variants,
    reconstructions.png and fig4.png. Everything is also logged to the training run in MLflow.
    """
    from pipeline.stages import evaluate as evaluate_stage

    metrics = evaluate_stage.run(Path(model_dir), Path(data_dir), Path(out_dir), _params_for_hints(params_path))
    transformed = (f", transformed test error {metrics['transformed_error_pct']:.2f}%"
                   if "transformed_error_pct" in metrics else "")
    click.echo(f"{model_dir}: test error {metrics['error_pct']:.2f}%{transformed} -> {out_dir}")


@main.command()
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--variant", "variants", multiple=True,
              help="a variant of params.yaml (repeat for several)  [default: every variant]")
@PARAMS_OPTION
@user_errors
def fingerprint(out: str, variants: tuple[str, ...], params_path: str) -> None:
    """Write OUT (JSON): each variant's training fingerprint as this checkout's code computes it, with
    the commit and the CPU environment.

    The fingerprint its train stage would record (pipeline.training.fingerprint), a few seconds of
    one CPU thread per variant. `capsnet report --fingerprints DIR` reads such tables: rows of two
    variants trained at two commits compare where one commit's table computes both rows'
    fingerprints. The GPU window writes one before its queue (scripts/gpu_plan.sh).
    """
    from tqdm.auto import tqdm

    from pipeline.core.files import write_json
    from pipeline.core.provenance import git_commit, repo_root
    from pipeline.training.fingerprint import fingerprint_environment, fingerprint_table

    params = load_params(params_path)
    names = list(variants) or list(params.variants)
    for name in names:
        params.variant(name)  # an unknown name: one line naming the variants there are
    with tqdm(total=len(names), desc="fingerprints", unit="variant", file=sys.stderr) as bar:
        table = fingerprint_table(params, names, lambda done, variant: bar.update(1))
    commit = git_commit(repo_root())
    write_json(out, {"commit": commit, "environment": fingerprint_environment(), "fingerprints": table})
    click.echo(f"{len(table)} training fingerprint(s) of {commit[:7]} to {out}")


@main.command()
@click.argument("models_dir", type=TRAINED)
@click.argument("results_dir", type=EVALUATED)
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--missing", type=click.Choice(["error", "list"]), default="error", show_default=True,
              help="a (variant, seed) without a complete evaluation: stop with an error, or report it as not run")
@click.option("--readme", type=click.Path(exists=True, dir_okay=False), default=None,
              help="also rewrite this README's generated results block from the written tables")
@click.option("--benchmarks", type=click.Path(dir_okay=False), default="reports/benchmarks.md", show_default=True,
              help="measured training speeds: what settling each claim would cost in GPU time (none if missing)")
@click.option("--fingerprints", type=click.Path(file_okay=False), default=None,
              help="a folder of `capsnet fingerprint` tables: rows trained at different commits compare where "
                   "one commit's table computes both rows' fingerprints (none if missing)")
@PARAMS_OPTION
@user_errors
def report(models_dir: str, results_dir: str, out_dir: str, missing: str, readme: str | None, benchmarks: str,
           fingerprints: str | None, params_path: str) -> None:
    """Write OUT_DIR/ablation.md, results.csv, effects.csv, affnist.csv, metrics/<variant>.json and
    figures/ from every evaluation.

    Table 1 per protocol against the paper with seed-aware verdicts, ablation effects with
    seed-aware intervals, end-of-training diagnostics, the affine-shifted column, §5.2 (CapsNet vs
    CNN on affNIST(-style), gap interval, accuracy by transform), deviations and each run's recorded
    provenance; also logged to MLflow as a `report` run with the headline numbers.
    """
    from pipeline.stages import report as report_stage

    params = load_params(params_path)
    path = report_stage.run(params, Path(models_dir), Path(results_dir), Path(out_dir), missing,
                            Path(readme) if readme else None, Path(benchmarks),
                            Path(fingerprints) if fingerprints else None)
    click.echo(f"report written to {path}")
    for line in report_stage.claims_summary(Path(out_dir), params.base.profile):  # where the reader already looks
        click.echo(line)


@main.command()
@click.option("--index", type=int, default=None,
              help="print only the item at this position (a SLURM array task id, a Kubernetes completion index)")
@click.option("--count", is_flag=True, help="print how many items there are")
@click.option("--kind", type=click.Choice(["item", "stages"]), default="item", show_default=True,
              help="print bare items, or each item's DVC stages (space-separated, in the order they run)")
@PARAMS_OPTION
@user_errors
def stages(index: int | None, count: bool, kind: str, params_path: str) -> None:
    """The items of params.yaml's ablation, one per line: a stacked variant (<variant>, all its
    seeds in one process) or a separate variant's seed (<variant>-<seed>). What `make gpus`, the
    SLURM array and the Kubernetes Indexed Job fan out, one item per GPU."""
    from pipeline.core import stage_names as stage_list

    params = load_params(params_path)
    names = stage_list.items(params)
    if index is not None:
        names = [stage_list.item_at(names, index)]
    if count:
        click.echo(len(names))
        return
    for name in names:
        click.echo(name if kind == "item" else " ".join(stage_list.stage_names(params, name)))


@main.command()
@click.option("--variant", default="capsnet_r3_recon", show_default=True, help="a variant from params.yaml")
@click.option("--batch", "batch_sizes", type=click.IntRange(min=1), multiple=True, default=[128], show_default=True,
              help="batch size (repeat for several)")
@click.option("--mode", "modes", type=click.Choice(BENCH_MODES), multiple=True, default=["fp32"], show_default=True,
              help="eager fp32, bf16 autocast (CUDA), torch.compile of model + loss, both, both + compile's CUDA "
                   "graphs; -cl: convolutions in NHWC (train.channels_last); -autotune: compile's max-autotune "
                   "without graphs; -capture: the whole step as one CUDA graph (train.cuda_graph) (repeat for several)")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True, help="timed training steps")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="untimed steps first (compilation included)")
@click.option("--reference/--no-reference", default=True, show_default=True,
              help="also time the popular implementations' DataLoader loop, for the ratio")
@click.option("--deterministic", type=click.Choice(["params", "on", "off"]), default="params", show_default=True,
              help="deterministic algorithms as params.yaml's train.deterministic says, or forced")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N")
@click.option("--seeds", "seeds", type=click.IntRange(1, 64), multiple=True, default=(1,), show_default=True,
              help="seeds stacked in one step (repeatable: --seeds 1 --seeds 3 compares stacked with separate)")
@click.option("--stack", "layouts", type=click.Choice(STACK_LAYOUTS), multiple=True, default=["fused"],
              show_default=True, help="how stacked seeds run (train.stack_layout): fused, one grouped kernel per "
                                      "layer (vmap); bmm, the convolutions as batched matrix products; loop, each "
                                      "seed's kernels in turn; streams, the loop with each seed on a CUDA stream of "
                                      "its own (repeatable)")
@click.option("--profile-steps", "profile", type=click.IntRange(min=0), default=0, show_default=True,
              help="after the timed steps, this many more under torch.profiler: each row's \"profile\" says where "
                   "a step's time went (the device's busy time against the wall, by category, the longest kernels)")
@PARAMS_OPTION
@user_errors
def bench(variant: str, batch_sizes: tuple[int, ...], modes: tuple[str, ...], steps: int, warmup: int,
          reference: bool, deterministic: str, device: str, seeds: tuple[int, ...], layouts: tuple[str, ...],
          profile: int, params_path: str) -> None:
    """Print one JSON line per configuration: images/s, ms/step, s/epoch, TFLOP/s, memory.

    Times the real training step of `capsnet train` on random uint8 data after warm-up steps,
    synchronising the device only at the edges, with the profile's settings (params.yaml) unless
    told otherwise. FLOP per image are counted by torch's FlopCounterMode over one training step.
    With --reference, a loop written the way popular re-implementations train (eager fp32,
    DataLoader, per-sample transforms) gives the ratio. With --profile-steps N, each row also says
    where N more steps' time went (torch.profiler; pipeline/training/profile.py).
    """
    import json

    from pipeline.training import bench as bn

    params = load_params(params_path)
    for row in bn.run(params, variant, batch_sizes, modes, steps, warmup, reference, deterministic, device, seeds,
                      layouts, profile):
        click.echo(json.dumps(row))


@main.command()
@click.argument("models_dir", type=TRAINED)
@click.argument("results_dir", type=EVALUATED)
@click.argument("dest", type=click.Path(file_okay=False))
@user_errors
def publish(models_dir: str, results_dir: str, dest: str) -> None:
    """Copy every complete run's records (config, history, metrics, breakdown, labels and predicted
    classes, reconstruction figures; no weights, no scores) into DEST/models and DEST/results, for git.

    `capsnet report DEST/models DEST/results reports` then rewrites the report from DEST alone.
    """
    from pipeline.report.publish import publish_runs

    copied = publish_runs(Path(models_dir), Path(results_dir), Path(dest))
    if not copied:
        raise UserError(f"{results_dir} holds no complete run (metrics.json + predictions + config)")
    click.echo(f"published {len(copied)} run(s) to {dest}: " + ", ".join(f"{v} seed {s}" for v, s in copied))


@main.group()
def track() -> None:
    """Deferred MLflow tracking: runs journalled where $CAPSNET_TRACKING_JOURNAL was set."""


@track.command()
@click.argument("journal_dir", type=click.Path(exists=True, file_okay=False))
@user_errors
def sync(journal_dir: str) -> None:
    """Replay every run journalled in JOURNAL_DIR into the MLflow store ($MLFLOW_TRACKING_URI or
    mlflow.db), with the original steps and timestamps. Runs synced before are skipped."""
    from pipeline.core import tracking

    tracker = tracking.Tracker()
    journals = sorted(Path(journal_dir).glob("*.jsonl"))
    if not journals:
        raise UserError(f"{journal_dir} holds no *.jsonl journal")
    added = _replay(tracker, journals)
    click.echo(f"{added} run(s) added to {tracker.uri}, {len(journals) - added} already there")


def _replay(tracker, journals: list[Path], quiet: bool = False) -> int:
    """Replay each journal (skipping those synced before), a line each unless ``quiet``, a line per
    torn tail always; returns how many runs were added."""
    added = 0
    for journal in journals:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                run_id = tracker.replay(journal)
        except (ValueError, KeyError) as err:
            raise UserError(f"{journal}: {err}") from err
        for warning in caught:
            click.echo(f"warning: {warning.message}", err=True)
        added += run_id is not None
        if not quiet:
            click.echo(f"{journal.name}: {'-> run ' + run_id if run_id else 'synced before, skipped'}")
    return added


@main.command()
@click.option("--journal", "journal_dir", type=click.Path(file_okay=False), default="reports/runs/journal",
              show_default=True, help="published run journals to load first (skipped if already loaded)")
@click.option("--port", type=click.IntRange(1, 65535), default=5000, show_default=True)
@click.option("--dry-run", is_flag=True, help="load the journals and print the URL, without starting the UI")
@user_errors
def ui(journal_dir: str, port: int, dry_run: bool) -> None:
    """Open the published runs in the MLflow UI: load the published run journals into the store
    ($MLFLOW_TRACKING_URI or mlflow.db) if they are not there yet, tag them published, then serve
    `mlflow ui` on 127.0.0.1 and print the URL of their runs table (each profile's runs, the smoke
    run's too, are in an experiment of their own). Ctrl-C stops it."""
    import os
    import subprocess

    from pipeline.core import tracking

    problem = None if dry_run else tracking.port_problem(port)  # mlflow ui would log a failed bind and exit 0
    if problem:
        other = port + 1 if 1024 <= port < 65535 else 5001
        raise UserError(f"port {port} on 127.0.0.1 {problem}: serve on another one: `capsnet ui --port {other}` "
                        f"(make ui PORT={other})")
    tracker = tracking.Tracker()
    journals = sorted(Path(journal_dir).glob("*.jsonl")) if Path(journal_dir).is_dir() else []
    added = _replay(tracker, journals, quiet=True)
    experiments = tracker.mark_published({j.stem for j in journals})
    click.echo(f"{added} published run(s) loaded, {len(journals) - added} already in {tracker.uri}")
    if experiments:
        name = tracker.client.get_experiment(experiments[0]).name
        url = tracking.runs_url(port, experiments[0], f"tags.{tracking.PUBLISHED_TAG} = 'true'")
        click.echo(f"the published runs (experiment {name}): {url}")
    else:
        url = tracking.runs_url(port, tracker.experiment_id)
        click.echo(f"no published runs in {journal_dir}; experiment {tracking.EXPERIMENT}: {url}")
    click.echo("(rows sorted by variant; Group by: Params > variant; Ctrl-C stops the UI)")
    if dry_run:
        return
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracker.uri, "--host", "127.0.0.1",
               "--port", str(port), "--workers", "1"]  # one reader on loopback: starts in seconds, not four workers' imports
    env = tracking.SERVER_ENV | dict(os.environ)  # nor MLflow's job runner, unless the environment asks for it
    try:
        subprocess.run(command, check=True, env=env)
    except KeyboardInterrupt:
        pass
    except subprocess.CalledProcessError as err:
        raise UserError(f"mlflow ui stopped with status {err.returncode} (is port {port} taken? use --port)") from err


if __name__ == "__main__":
    sys.exit(main())
