"""MultiMNIST through the stages, not only its functions (tests/test_multimnist.py): what its train stage
reads from a prepared folder, and its section as the report stage builds it from the runs' files, beside
the MNIST rows Table 1's section leaves it."""

import json

import pandas as pd
import torch
from safetensors.torch import save_file

from conftest import committed_params, synthetic_digits, tiny_config, with_ablation
from report_runs import draw, edit_record, fabricate
from pipeline.core.registry import load as experiment
from pipeline.data.splits import save_split
from pipeline.experiments import multimnist as mm
from pipeline.stages import report as report_stage

PAIRS = 200  # a fabricated run's test pairs


def fabricate_multimnist(root, variant, seed, error_pct):
    """A MultiMNIST run as its train and evaluate stages leave it: the record of a 36×36 CapsNet of the
    multimnist experiment, (N, 2) sorted true and predicted pairs of which ``error_pct`` are wrong, the
    metrics and breakdown `multimnist.evaluate` writes, and its reconstructions figure."""
    fabricate(root, variant, seed, error_pct, image_size=36)
    edit_record(root, variant, seed, lambda record: record["config"].update(experiment=mm.NAME))
    results = root / "results" / variant / f"seed{seed}"
    for stale in results.iterdir():
        stale.unlink()
    truth = torch.tensor([[0, 1]] * PAIRS, dtype=torch.uint8)  # (N, 2)
    preds = truth.clone()
    preds[: round(PAIRS * error_pct / 100), 1] = 2  # one digit wrong: the pair is wrong
    save_file({f"{mm.TEST_SETS[0]}_labels": truth, f"{mm.TEST_SETS[0]}_preds": preds},
              str(results / "predictions.safetensors"))
    (results / "metrics.json").write_text(json.dumps({"error_pct": error_pct, "n_test": PAIRS, "n_params": 11_361_808}))
    (results / "breakdown.json").write_text(json.dumps({"sources": {mm.TEST_SETS[0]: "MultiMNIST recipes (fabricated)"}}))
    draw(root, variant, seed, "reconstructions.png")


def test_the_report_stage_sets_multimnist_pair_errors_beside_table1s_mnist_rows(tmp_path, store):
    """The report stage hands each experiment its own runs and Table 1's MNIST rows reach MultiMNIST's
    section: ablation.md's both-columns table holds our MNIST error beside our pair error, multimnist.csv
    the MultiMNIST row, and the Fig. 5 overlay is the best seed's."""
    for seed, (mnist, pair) in enumerate([(0.3, 5.0), (0.4, 5.4)]):
        fabricate(tmp_path, "capsnet_r3_recon", seed, mnist)
        draw(tmp_path, "capsnet_r3_recon", seed, "reconstructions.png", "fig4.png")
        fabricate_multimnist(tmp_path, "multimnist_r3_recon", seed, pair)
    params = with_ablation(committed_params(), stacked=("capsnet_r3_recon", "multimnist_r3_recon"), separate=(),
                           seeds=(0, 1))
    out = tmp_path / "reports"
    report_stage.run(params, tmp_path / "models", tmp_path / "results", out)
    text = (out / "ablation.md").read_text()
    assert "| CapsNet | 3 | yes | 0.35 ± 0.07 | 0.25 | 5.20 ± 0.28 | 5.2 | consistent |" in text
    multi = pd.read_csv(out / "multimnist.csv").set_index("variant")
    assert list(multi.index) == ["multimnist_r3_recon"] and multi.loc["multimnist_r3_recon"].n_seeds == 2
    assert multi.loc["multimnist_r3_recon"].error_mean == 5.2
    table1 = pd.read_csv(out / "results.csv")
    assert list(table1.variant) == ["capsnet_r3_recon"]  # a MultiMNIST run is no Table 1 row
    assert (out / "figures" / "multimnist_reconstructions.png").read_bytes() == b"multimnist_r3_recon seed 0"
    assert ("![MultiMNIST reconstructions (multimnist_r3_recon, seed 0; red and green: the two predicted capsules)]"
            "(figures/multimnist_reconstructions.png)") in text


def test_the_train_stage_reads_mnists_training_digits_and_the_prepared_recipes_with_their_test_digits(tmp_path):
    """`multimnist.training_data` on a prepared folder: the training split's digits (each epoch's pairs are
    drawn from them), the recipes' pairs and shifts, and the 28×28 test digits they index."""
    images, labels = synthetic_digits(30)
    test_images, test_labels = synthetic_digits(10, seed=1)
    save_split(tmp_path / "train.safetensors", images, labels, {"source": "synthetic"})
    said = mm.prepare(committed_params(multimnist_pairs_per_digit=2),
                      {"test_images": test_images, "test_labels": test_labels}, tmp_path, tmp_path)
    assert said == "MultiMNIST: 20 test recipes"
    cfg = tiny_config(variant="multimnist_r3_recon", routing_iterations=3, reconstruction=True, image_size=36,
                      batch_size=8, max_shift=4, experiment=mm.NAME, multimnist_epoch_size=8)
    assert experiment(cfg.experiment) is mm
    data, datasets = mm.training_data(tmp_path, cfg)
    assert torch.equal(data["train_images"], images) and torch.equal(data["train_labels"], labels)
    assert torch.equal(data["test_images"], test_images) and torch.equal(data["test_labels"], test_labels)
    assert data["test_pairs"].shape == (20, 2) and data["test_shifts"].shape[0] == 20
    assert bool((test_labels[data["test_pairs"][:, 0].long()] != test_labels[data["test_pairs"][:, 1].long()]).all())
    assert len(datasets) == 2  # the training split and the recipes, each logged as an MLflow dataset input
