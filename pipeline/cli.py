"""The `capsnet` command: one subcommand per DVC stage. Paths come from dvc.yaml's command lines."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.params import ParamsError, load_params

PARAMS_OPTION = click.option("--params", "params_path", default="params.yaml", show_default=True,
                             type=click.Path(dir_okay=False), help="params.yaml to read")


def _params(path: str):
    try:
        return load_params(path)
    except ParamsError as err:
        raise click.ClickException(str(err)) from err


@click.group()
def main() -> None:
    """capsnet-repro: reproduce Table 1 of Dynamic Routing Between Capsules (Sabour et al. 2017)."""


@main.command()
@click.argument("dest", type=click.Path(file_okay=False))
def download(dest: str) -> None:
    """Fetch the four MNIST IDX files into DEST, verified by SHA-256.

    Sources: $CAPSNET_MNIST_MIRROR (a directory or URL base, files gz or raw), then torchvision's
    public mirrors.
    """
    from pipeline.download import DownloadError, download_mnist

    try:
        hashes = download_mnist(dest)
    except DownloadError as err:
        raise click.ClickException(str(err)) from err
    for name, digest in hashes.items():
        click.echo(f"{name}  sha256 {digest}  ok")


@main.command()
@click.argument("raw_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--montage", type=click.Path(dir_okay=False), required=True,
              help="PNG: originals above their affine-shifted versions")
@click.option("--affnist-montage", type=click.Path(dir_okay=False), required=True,
              help="PNG: expanded-MNIST digits above affNIST(-style) images (§5.2)")
@PARAMS_OPTION
def prepare(raw_dir: str, out_dir: str, montage: str, affnist_montage: str, params_path: str) -> None:
    """Decode RAW_DIR's IDX files into uint8 tensors in OUT_DIR and build the transformed test sets.

    Writes train, test and affine_test (28×28), and for §5.2 expanded_test and affnist_test
    (40×40). affnist_test is the real affNIST test set when $CAPSNET_AFFNIST_MIRROR names its
    .mat file (or a folder of its batches), else an affNIST-style set generated here.
    """
    from pipeline.affnist import AffnistError, affnist_mirror, prepare_affnist
    from pipeline.data import AffineRanges, IdxError, prepare as prepare_data
    from pipeline.figures import affine_montage

    p = _params(params_path).prepare
    ranges = AffineRanges(p.max_rotation_deg, p.max_shear, p.min_scale, p.max_scale)
    try:
        out = prepare_data(raw_dir, out_dir, train_subset=p.train_subset, test_subset=p.test_subset,
                           affine_seed=p.affine_seed, ranges=ranges)
    except (IdxError, FileNotFoundError) as err:
        raise click.ClickException(f"{err}. Re-run `dvc repro -f download` to fetch clean files.") from err
    try:
        s52 = prepare_affnist(out_dir, out["test_images"], out["test_labels"], expanded_seed=p.expanded_seed,
                              affnist_seed=p.affnist_seed, transforms_per_digit=p.affnist_transforms, ranges=ranges,
                              mirror=affnist_mirror())
    except AffnistError as err:
        raise click.ClickException(str(err)) from err
    n = out["test_images"].shape[0]
    k = min(p.montage_count, n)
    affine_montage(out["test_images"][:k], out["affine_images"][:k], out["affine_params"][:k], montage)
    transforms = s52.get("affine_params")  # None for the real affNIST
    step = p.affnist_transforms if transforms is not None else 1  # the first transform of each digit
    shown = s52["images"][::step][:k]
    affine_montage(s52["expanded"][:len(shown)], shown, None if transforms is None else transforms[::step][:k],
                   affnist_montage, labels=("expanded", "affNIST"), title=f"§5.2 test sets: {s52['source']}")
    click.echo(f"prepared {out_dir}: {n} test digits, {n} affine-shifted, {n} expanded (40×40); "
               f"{s52['source']}: {len(s52['labels']):,} images; montages {montage}, {affnist_montage}")


def _write_json(path: Path, obj: dict) -> None:
    import json

    from pipeline.files import write_text

    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@main.command()
@click.argument("variant")
@click.argument("seed", type=int)
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--checkpoint", "checkpoint_path", type=click.Path(dir_okay=False), required=True,
              help="per-epoch checkpoint; kept across DVC re-runs so a killed run resumes")
@PARAMS_OPTION
def train(variant: str, seed: int, data_dir: str, out_dir: str, checkpoint_path: str, params_path: str) -> None:
    """Train VARIANT with SEED on DATA_DIR's prepared MNIST; write weights and config to OUT_DIR.

    Resumes from --checkpoint when it belongs to the same configuration; a finished run is not
    retrained. Logs to MLflow (run <variant>-seed<k>).
    """
    import csv
    import time

    from safetensors.torch import save_file

    from pipeline import figures, tracking
    from pipeline.data import load_split, test_sets
    from pipeline.files import atomic_path
    from pipeline.train import ADAM_EPS, NonFiniteLossError, count_params, load_checkpoint, resolve_device, run_config
    from pipeline.train import train as train_run

    try:
        cfg = run_config(_params(params_path), variant, seed)
    except ParamsError as err:
        raise click.ClickException(str(err)) from err
    clean_set = test_sets(cfg.image_size)[0]  # scored every epoch (and early stopping's yardstick)
    train_split = load_split(Path(data_dir) / "train.safetensors")
    test_split = load_split(Path(data_dir) / f"{clean_set}.safetensors")
    data = {"train_images": train_split["images"], "train_labels": train_split["labels"],
            "test_images": test_split["images"], "test_labels": test_split["labels"]}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(checkpoint_path)
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    state = load_checkpoint(checkpoint, cfg)
    device = resolve_device(cfg.device)
    env = tracking.environment()
    steps = cfg.epochs * (data["train_images"].shape[0] // cfg.batch_size)
    run_params = {"variant": variant, "model": cfg.model, "routing_iterations": cfg.routing_iterations,
                  "reconstruction": cfg.reconstruction, "seed": seed, "batch_size": cfg.batch_size, "lr": cfg.lr,
                  "lr_decay_rate": cfg.lr_decay_rate, "lr_decay_steps": cfg.lr_decay_steps, "epochs": cfg.epochs,
                  "steps": steps, "amp": cfg.amp, "compile": cfg.compile, "n_params": count_params(cfg),
                  "device": str(device), "torch_version": env["torch_version"], "profile": cfg.profile,
                  "recipe": cfg.recipe}
    tracker = tracking.open_tracker()
    run_id = tracker.start(f"{variant}-seed{seed}", run_params,
                           run_id=state["extra"].get("run_id") if state else None)
    t0 = time.perf_counter()
    try:
        result = train_run(cfg, data, checkpoint, tracker.epoch_logger(run_id), extra={"run_id": run_id}, state=state)
    except NonFiniteLossError as err:
        tracker.end(run_id, failed=True)
        raise click.ClickException(str(err)) from err
    except BaseException:
        tracker.end(run_id, failed=True)
        raise
    with atomic_path(out / "model.safetensors") as tmp:
        save_file({k: t.contiguous() for k, t in result.model.state_dict().items()}, str(tmp))
    with atomic_path(out / "history.csv") as tmp, tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(result.history[0]))
        writer.writeheader()
        writer.writerows(result.history)
    figures.learning_curves(result.history, f"{variant} seed {seed}", out / "learning_curve.png")
    _write_json(out / "config.json", {"config": cfg.__dict__, "run_id": run_id, "params": run_params,
                                      "optimizer": {"name": "adam", "adam_eps": ADAM_EPS}, "environment": env,
                                      "train_seconds": time.perf_counter() - t0,
                                      "resumed_from_epoch": result.resumed_from_epoch, "stop_reason": result.stop_reason,
                                      "epochs_trained": len(result.history), "steps_trained": result.steps,
                                      "eval_set": clean_set})
    tracker.log_metrics(run_id, {"epochs_trained": len(result.history),
                                 "reached_target": float(result.stop_reason == "target")}, step=len(result.history))
    for artifact in ("model.safetensors", "learning_curve.png", "history.csv", "config.json"):
        tracker.log_artifact(run_id, out / artifact)
    tracker.end(run_id)
    stopped = f", early stop at epoch {len(result.history)}" if result.stop_reason == "target" else ""
    click.echo(f"{variant} seed {seed}: final {clean_set} error {result.history[-1]['test_error_pct']:.2f}%{stopped} -> {out}")


@main.command()
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
def evaluate(model_dir: str, data_dir: str, out_dir: str) -> None:
    """Evaluate MODEL_DIR on its clean and transformed test sets in DATA_DIR; write OUT_DIR.

    28×28 models: MNIST test and the affine-shifted set; 40×40 (§5.2): expanded MNIST and
    affNIST(-style). OUT_DIR gets metrics.json (for DVC), breakdown.json (per-class accuracy,
    accuracy by transform bins, which sets), predictions.safetensors (per image: label,
    prediction, scores), confusion.png and, for reconstruction variants, reconstructions.png and
    fig4.png. Everything is also logged to the training run in MLflow.
    """
    import json

    from safetensors.torch import load_file, save_file

    from pipeline import figures, tracking
    from pipeline.data import load_split, split_metadata, test_sets
    from pipeline.evaluate import FIG4_STEPS, accuracy_by_bins, evaluate_split, fig4_grid, reconstructions
    from pipeline.train import RunConfig, build_model, resolve_device

    model_dir, out = Path(model_dir), Path(out_dir)
    saved = json.loads((model_dir / "config.json").read_text())
    cfg = RunConfig(**saved["config"])
    model = build_model(cfg)
    model.load_state_dict(load_file(str(model_dir / "model.safetensors")))
    model.to(resolve_device(cfg.device)).eval()
    out.mkdir(parents=True, exist_ok=True)
    metrics, arrays, panels = {}, {}, []
    breakdown = {"per_class": {}, "sources": {}, "bins": {}}
    clean_set, transformed_set = test_sets(cfg.image_size)
    for name in (clean_set, transformed_set):
        path = Path(data_dir) / f"{name}.safetensors"
        data, meta = load_split(path), split_metadata(path)
        m, a = evaluate_split(model, data["images"], data["labels"], cfg.eval_batch_size, cfg.num_classes)
        metrics[f"{name}_error_pct"] = m["error_pct"]
        metrics[f"n_{name}"] = m["n"]
        breakdown["per_class"][name] = m["per_class_accuracy"]
        breakdown["sources"][name] = meta.get("source", name)
        if "affine_params" in data and "ranges" in meta:
            correct = a["labels"] == a["preds"]
            breakdown["bins"][name] = accuracy_by_bins(correct, data["affine_params"], json.loads(meta["ranges"]))
        arrays.update({f"{name}_{k}": t for k, t in a.items()})
        if "digit_index" in data:  # affNIST-style: which test digit each image came from (for the report's CI)
            arrays[f"{name}_digit_index"] = data["digit_index"].int()
        panels.append((m["confusion_matrix"], name))
        if name == clean_set:
            clean_images = data["images"]
    figures.confusion(panels, f"{cfg.variant} seed {cfg.seed}", out / "confusion.png")
    metrics.update(n_params=saved["params"]["n_params"], epochs_trained=saved["epochs_trained"],
                   reached_target=saved["stop_reason"] == "target")
    save_file(arrays, str(out / "predictions.safetensors"))
    _write_json(out / "breakdown.json", breakdown)
    pngs = ["confusion.png"]
    if cfg.reconstruction:
        k = min(10, clean_images.shape[0])
        figures.image_grid([clean_images[:k], reconstructions(model, clean_images[:k])], ["input", "reconstruction"],
                           f"{cfg.variant} seed {cfg.seed}: reconstructions (predicted capsule)", out / "reconstructions.png")
        grid = fig4_grid(model, clean_images[0])
        figures.image_grid(list(grid), [f"dim {d}" for d in range(grid.shape[0])],
                           f"{cfg.variant} seed {cfg.seed}: Fig. 4 perturbations", out / "fig4.png",
                           col_labels=[f"{round(s, 2) + 0.0:+.2f}" for s in FIG4_STEPS.tolist()])
        pngs += ["reconstructions.png", "fig4.png"]
    _write_json(out / "metrics.json", metrics)
    tracker = tracking.open_tracker()
    run_id = saved["run_id"]
    tracker.log_metrics(run_id, {k: metrics[k] for k in (f"{clean_set}_error_pct", f"{transformed_set}_error_pct")},
                        step=saved["epochs_trained"])
    for artifact in ["metrics.json", "breakdown.json", *pngs]:
        tracker.log_artifact(run_id, out / artifact, "evaluation")
    click.echo(f"{cfg.variant} seed {cfg.seed}: {clean_set} error {metrics[f'{clean_set}_error_pct']:.2f}%, "
               f"{transformed_set} {metrics[f'{transformed_set}_error_pct']:.2f}% -> {out}")


@main.command()
@click.argument("models_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("results_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--missing", type=click.Choice(["error", "list"]), default="error", show_default=True,
              help="a (variant, seed) without a complete evaluation: stop with an error, or report it as not run")
@PARAMS_OPTION
def report(models_dir: str, results_dir: str, out_dir: str, missing: str, params_path: str) -> None:
    """Write OUT_DIR/ablation.md, results.csv, affnist.csv, summary.json and figures/ from every evaluation.

    Table 1 against the paper with verdicts, ablation effects with paired bootstrap CIs, the
    affine-shifted column, §5.2 (CapsNet vs CNN on affNIST(-style), gap CI, accuracy by transform),
    deviations and provenance; also logged to MLflow as a `report` run.
    """
    import datetime
    import importlib.metadata as md
    import shutil

    import pandas as pd

    from pipeline import figures, report as rp, report_affnist as ra, tracking
    from pipeline.data import MNIST_SIZE
    from pipeline.files import write_text

    p = _params(params_path)
    out, fig_dir = Path(out_dir), Path(out_dir) / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    reference = rp.paper_reference()
    variants, seeds = list(p.ablation.variants), list(p.ablation.seeds)
    skip = rp.missing_runs(Path(models_dir), Path(results_dir), variants, seeds) if missing == "list" else []
    not_run = {v: [s for w, s in skip if w == v] for v in dict.fromkeys(w for w, _ in skip)}
    try:
        runs = rp.load_runs(Path(models_dir), Path(results_dir), variants, seeds, skip=skip)
    except rp.ReportError as err:
        raise click.ClickException(str(err)) from err
    table1 = [r for r in runs if r.image_size == MNIST_SIZE]
    s52 = [r for r in runs if r.image_size != MNIST_SIZE]
    if not table1:
        raise click.ClickException("ablation.variants lists no Table 1 (28×28) variant; the report needs at least one")
    summary, effect_table = rp.summarize(table1, reference), rp.effects(table1, reference)

    figures.error_bars(list(summary.variant), list(summary.test_error_mean), list(summary.test_error_std),
                       list(summary.paper_test_error), fig_dir / "table1_errors.png")
    curves = {}
    for r in runs:
        curves.setdefault(r.variant, []).append((list(r.history.epoch), list(r.history.test_error_pct)))
    figures.overlaid_learning_curves(curves, fig_dir / "learning_curves.png")
    shown = {"Test error per variant": "figures/table1_errors.png", "Learning curves": "figures/learning_curves.png"}
    recon = summary[summary.reconstruction]
    if len(recon):
        best = recon.sort_values("test_error_mean").iloc[0].variant
        best_run = min((r for r in runs if r.variant == best), key=lambda r: r.metrics["test_error_pct"])
        for name in ("reconstructions", "fig4"):
            shutil.copyfile(Path(results_dir) / best / f"seed{best_run.seed}" / f"{name}.png", fig_dir / f"{name}.png")
        shown[f"Reconstructions ({best}, seed {best_run.seed})"] = "figures/reconstructions.png"
        shown[f"Fig. 4 perturbations ({best}, seed {best_run.seed})"] = "figures/fig4.png"
    for name, title in (("affine_montage", "Affine-shifted test set"), ("affnist_montage", "§5.2 test sets")):
        if (fig_dir / f"{name}.png").is_file():
            shown[title] = f"figures/{name}.png"
    s52_table, gap, s52_lines = pd.DataFrame(), None, None
    if s52:
        s52_table, gap = ra.affnist_summary(s52, reference), ra.affnist_gap(s52, reference)
        s52_lines = ra.render_affnist(s52_table, gap, reference)
        figures.accuracy_by_transform(ra.transform_bins(s52, "affnist_test"),
                                      "§5.2: affNIST(-style) accuracy by transform parameter", fig_dir / "affnist_bins.png")
        shown["§5.2: accuracy by transform parameter"] = "figures/affnist_bins.png"

    deviations = rp.deviations(p, reference) + rp.run_deviations(runs)
    env = runs[0].config["environment"]
    versions = {name: md.version(name) for name in ("torch", "torchvision", "dvc", "mlflow", "pandas")}
    trained = sorted({f"torch {r.config['environment']['torch_version']}, Python {r.config['environment']['python_version']}"
                      for r in runs})
    commits = sorted({rp.training_commit(r, Path(models_dir).parent / "journal") for r in runs})
    provenance = {
        "report commit": tracking.git_commit(tracking.repo_root()), "training commit": "; ".join(commits),
        "profile": p.base.profile,
        "device": f"{runs[0].config['params']['device']} ({env['device_name']}); torch CUDA build {env['cuda_version']}",
        "training software": "; ".join(trained),
        "report software": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "runs": "; ".join(f"{v}: seeds {', '.join(str(r.seed) for r in runs if r.variant == v)}"
                          for v in dict.fromkeys(r.variant for r in runs)),
        "not run": "; ".join(f"{v}: seeds {', '.join(map(str, s))}" for v, s in not_run.items()) or "none",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "total training time": f"{sum(r.history.epoch_seconds.sum() for r in runs) / 60:.1f} min over {len(runs)} runs "
                               "(sum of each run's epoch times; runs trained side by side on one device overlap)",
        "seeds": ", ".join(map(str, p.ablation.seeds)),
    }
    text = rp.render_markdown(summary, effect_table, profile=p.base.profile, not_run=not_run, deviations=deviations,
                              provenance=provenance, figures=shown, reference=reference, affnist=s52_lines)
    written = []
    for name, content in (("ablation.md", text), ("results.csv", summary.to_csv(index=False, float_format="%.4f")),
                          ("effects.csv", effect_table.to_csv(index=False, float_format="%.4f")),
                          ("affnist.csv", s52_table.to_csv(index=False, float_format="%.4f"))):
        write_text(out / name, content)
        written.append(out / name)
    headline = {r.variant: {"test_error_mean": round(r.test_error_mean, 4),
                            "affine_test_error_mean": round(r.affine_test_error_mean, 4)} for r in summary.itertuples()}
    headline.update({r.variant: {"expanded_accuracy_mean": round(r.expanded_acc_mean, 4),
                                 "affnist_accuracy_mean": round(r.affnist_acc_mean, 4)} for r in s52_table.itertuples()})
    if gap is not None:
        headline["affnist_gap_pp"] = {k: round(gap[k], 4) for k in ("gap", "ci_low", "ci_high")}
    _write_json(out / "summary.json", {"profile": p.base.profile, **headline})
    tracking.open_tracker().log_report(written + [out / "summary.json", *(out / v for v in shown.values())], p.base.profile)
    click.echo(f"report written to {out / 'ablation.md'}")


@main.command()
@click.option("--variant", default="capsnet_r3_recon", show_default=True, help="a variant from params.yaml")
@click.option("--batch", "batch_sizes", type=int, multiple=True, default=[128], show_default=True,
              help="batch size (repeat for several)")
@click.option("--mode", "modes", type=click.Choice(["fp32", "bf16", "compile", "bf16-compile", "bf16-graphs"]),
              multiple=True, default=["fp32"], show_default=True,
              help="eager fp32, bf16 autocast (CUDA), torch.compile of model + loss, both, or both + CUDA graphs "
                   "(repeat for several)")
@click.option("--steps", type=int, default=20, show_default=True, help="timed training steps")
@click.option("--warmup", type=int, default=3, show_default=True, help="untimed steps first (compilation included)")
@click.option("--reference/--no-reference", default=True, show_default=True,
              help="also time the popular implementations' DataLoader loop, for the ratio")
@click.option("--deterministic", type=click.Choice(["params", "on", "off"]), default="params", show_default=True,
              help="deterministic algorithms as params.yaml's train.deterministic says, or forced")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N")
@PARAMS_OPTION
def bench(variant: str, batch_sizes: tuple[int, ...], modes: tuple[str, ...], steps: int, warmup: int,
          reference: bool, deterministic: str, device: str, params_path: str) -> None:
    """Print one JSON line per configuration: images/s, ms/step, s/epoch, TFLOP/s, memory.

    Times the real training step of `capsnet train` on random uint8 data after warm-up steps,
    synchronising the device only at the edges, with the profile's settings (params.yaml) unless
    told otherwise. FLOP per image are counted by torch's FlopCounterMode over one training step.
    With --reference, a loop written the way popular re-implementations train (eager fp32,
    DataLoader, per-sample transforms) gives the ratio.
    """
    import dataclasses
    import datetime
    import json

    import torch

    from pipeline import bench as bn
    from pipeline.train import resolve_device, run_config

    dev = resolve_device(device)
    try:
        base = run_config(_params(params_path), variant, 0, profile="bench", epochs=1, batch_size=batch_sizes[0],
                          amp=False, compile=False, device=str(dev))
    except ParamsError as err:
        raise click.ClickException(str(err)) from err
    if deterministic != "params":
        base = dataclasses.replace(base, deterministic=deterministic == "on")
    flop = bn.flop_per_image(base, dev)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    common = {"device": name, "variant": variant, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
              "deterministic": base.deterministic, "flop_per_image_train": flop}

    def emit(row: dict) -> None:
        row["tflop_per_s"] = row["train_images_per_s"] * flop / 1e12
        click.echo(json.dumps({**common, **{k: round(x, 3) if isinstance(x, float) else x for k, x in row.items()}}))

    for batch in batch_sizes:
        ref = None
        if reference:
            ref = bn.bench_reference(dataclasses.replace(base, batch_size=batch), steps, warmup)
            emit({"mode": "reference", "batch": batch, **ref})
        for mode in modes:
            amp, compile_mode = bn.MODES[mode]
            cfg = dataclasses.replace(base, batch_size=batch, amp=amp and dev.type == "cuda",
                                      compile=compile_mode is not None)
            row = bn.bench_step(cfg, steps, warmup, compile_mode=compile_mode or "default")
            if ref:
                row["speedup_vs_reference"] = row["train_images_per_s"] / ref["train_images_per_s"]
            emit({"mode": mode, "batch": batch, **row})
            torch._dynamo.reset()  # each mode compiles afresh; the on-disk cache still helps


@main.command()
@click.argument("models_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("results_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("dest", type=click.Path(file_okay=False))
def publish(models_dir: str, results_dir: str, dest: str) -> None:
    """Copy every complete run's records (config, history, metrics, breakdown, labels and predicted
    classes, reconstruction figures; no weights, no scores) into DEST/models and DEST/results, for git.

    `capsnet report DEST/models DEST/results reports` then rewrites the report from DEST alone.
    """
    from pipeline.report import publish_runs

    copied = publish_runs(Path(models_dir), Path(results_dir), Path(dest))
    if not copied:
        raise click.ClickException(f"{results_dir} holds no complete run (metrics.json + predictions + config)")
    click.echo(f"published {len(copied)} run(s) to {dest}: " + ", ".join(f"{v} seed {s}" for v, s in copied))


@main.group()
def track() -> None:
    """Deferred MLflow tracking: runs journalled where $CAPSNET_TRACKING_JOURNAL was set."""


@track.command()
@click.argument("journal_dir", type=click.Path(exists=True, file_okay=False))
def sync(journal_dir: str) -> None:
    """Replay every run journalled in JOURNAL_DIR into the MLflow store ($MLFLOW_TRACKING_URI or
    mlflow.db), with the original steps and timestamps. Runs synced before are skipped."""
    from pipeline import tracking

    tracker = tracking.Tracker()
    journals = sorted(Path(journal_dir).glob("*.jsonl"))
    if not journals:
        raise click.ClickException(f"{journal_dir} holds no *.jsonl journal")
    added = 0
    for journal in journals:
        try:
            run_id = tracker.replay(journal)
        except (ValueError, KeyError) as err:
            raise click.ClickException(f"{journal}: {err}") from err
        added += run_id is not None
        click.echo(f"{journal.name}: {'-> run ' + run_id if run_id else 'synced before, skipped'}")
    click.echo(f"{added} run(s) added to {tracker.uri}, {len(journals) - added} already there")


if __name__ == "__main__":
    sys.exit(main())
