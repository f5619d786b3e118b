"""Fabricated runs for the report's tests: evaluation files, run records and the paper's reference, as
the train and evaluate stages would write them, with errors set by hand."""

import json

import pandas as pd
import torch
from safetensors.torch import save_file

from pipeline.experiments import table1_report as t1
from pipeline.report import document as rp
from pipeline.report import runs as rr

REFERENCE = rr.paper_reference()
COMMIT = "c0ffee0123456789abcdef0123456789abcdef01"


def markdown(summary, effect_table, *, reference, claims=None, **document) -> str:
    """ablation.md holding Table 1's section alone (as the report stage renders it), for the wording."""
    section = rp.Section(lines=t1.render_section(summary, effect_table, reference), claims=claims,
                         protocol=summary.protocol.iloc[0])
    return rp.render([section], **document)


def fabricate(root, variant, seed, error_pct, n=200, affine_pct=50.0, model="capsnet", recon=True, image_size=28,
              stop_reason="budget", bins=None, recipe=None, history=None, epochs=None, commit=COMMIT,
              adam_eps=1e-8, resumed=None, amp=False, device="cpu", lr_schedule_epochs=None, fingerprint=None,
              fingerprint_env=None, tf32=None):
    """Evaluation files whose per-image predictions give exactly error_pct (clean set) and affine_pct
    (transformed set) on n images; 40×40 variants get §5.2's set names. ``commit``/``adam_eps``/
    ``resumed`` None: the run does not record them (as the 17bb48c runs)."""
    model_dir, result_dir = root / "models" / variant / f"seed{seed}", root / "results" / variant / f"seed{seed}"
    model_dir.mkdir(parents=True)
    result_dir.mkdir(parents=True)
    clean, transformed = ("test", "affine_test") if image_size == 28 else ("expanded_test", "affnist_test")
    labels = torch.zeros(n, dtype=torch.uint8)
    preds = labels.clone()
    preds[: round(n * error_pct / 100)] = 1
    affine_preds = labels.clone()
    affine_preds[: round(n * affine_pct / 100)] = 1
    save_file({f"{clean}_labels": labels, f"{clean}_preds": preds, f"{transformed}_labels": labels.clone(),
               f"{transformed}_preds": affine_preds}, str(result_dir / "predictions.safetensors"))
    (result_dir / "metrics.json").write_text(json.dumps(
        {"error_pct": error_pct, "transformed_error_pct": affine_pct, "n_test": n, "n_transformed": n,
         "n_params": 8215568, "epochs_trained": 1, "reached_target": stop_reason == "target"}))
    (result_dir / "breakdown.json").write_text(json.dumps(
        {"per_class": {}, "sources": {transformed: f"{transformed} (fabricated)"}, "bins": bins or {}}))
    history = history or [error_pct]
    config = {"model": model, "routing_iterations": 1 if "_r1" in variant else 3, "reconstruction": recon, "image_size": image_size,
              "target_accuracy_pct": 99.23 if image_size == 40 else 0.0, "profile": "gpu",
              "epochs": epochs or len(history), "batch_size": 128, "lr": 0.001, "lr_decay_rate": 0.96,
              "lr_decay_steps": 2000, "lr_min": 1e-6, "amp": amp, "compile": True, "deterministic": False,
              "device": device}
    if recipe is not None:  # runs from before recipes existed have none
        config["recipe"] = recipe
    if lr_schedule_epochs is not None:  # runs from before compressed schedules have none
        config["lr_schedule_epochs"] = lr_schedule_epochs
    if tf32 is not None:  # runs from before train.tf32 have none
        config["tf32"] = tf32
    record = {"config": config, "params": {"device": device}, "train_seconds": 1.0, "stop_reason": stop_reason,
              "epochs_trained": len(history), "run_id": f"{variant}-{seed}",
              "environment": {"torch_version": "t", "python_version": "p"} | ({"git_commit": commit} if commit else {})
              | ({"fingerprint_environment": fingerprint_env} if fingerprint_env else {})}
    if adam_eps is not None:
        record["optimizer"] = {"name": "adam", "adam_eps": adam_eps}
    if resumed is not None:
        record["resumed_at_epochs"] = resumed
    if fingerprint is not None:  # runs from before the training fingerprint have none
        record["training_fingerprint"] = fingerprint
    (model_dir / "config.json").write_text(json.dumps(record))
    pd.DataFrame({"epoch": range(1, len(history) + 1), "test_error_pct": history,
                  "lr": [1e-3 * 0.9 ** k for k in range(len(history))],
                  "epoch_seconds": [1.0] * len(history)}).to_csv(model_dir / "history.csv", index=False)


def draw(root, variant, seed, *names):
    """Stand-ins for the figures a run's evaluation draws (``names``: reconstructions.png, fig4.png), each
    holding "<variant> seed <seed>", so a test can tell which run's figure the report copied."""
    for name in names:
        figure = rr.run_figure(root / "results" / variant / f"seed{seed}", name)
        figure.parent.mkdir(parents=True, exist_ok=True)
        figure.write_bytes(f"{variant} seed {seed}".encode())


def edit_record(root, variant, seed, edit):
    """Rewrite a fabricated run's config.json as ``edit`` changes the record in place, for what
    `fabricate`'s parameters do not reach (a field removed, a record as an older run wrote it)."""
    path = root / "models" / variant / f"seed{seed}" / "config.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))


def fabricate_cnn_affnist(root, seed, **kw):
    """`fabricate` §5.2's CNN (pooling_cnn on the 40×40 canvas, no decoder) at 1 % expanded-MNIST error."""
    fabricate(root, "cnn_affnist", seed, 1.0, model="pooling_cnn", recon=False, image_size=40, **kw)


def load(root, variants, seeds, **kw):
    return rr.load_runs(root / "models", root / "results", variants, seeds, **kw)
