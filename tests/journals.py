"""What the tracking tests log: a run's params and one dataset as the train stage names them, and a run
journalled as `capsnet train` and `evaluate` journal it (tests/test_tracking.py, test_journal.py,
test_ui.py)."""

from pipeline.core import provenance
from pipeline.core.journal import JournalTracker

PARAMS = {k: k.upper() for k in provenance.PARAM_KEYS}

DATASET = {"name": "train", "digest": "0123456789abcdef", "source": "data/prepared/train.safetensors",
           "context": "training", "profile": {"num_rows": 60000, "source": "MNIST train set"}}

def journal_a_run(folder, root):
    """The calls `capsnet train` and `evaluate` make, against a journal; returns the journal run id."""
    journal = JournalTracker(folder)
    run_id = journal.start("capsnet_r1-seed0", PARAMS)
    for epoch in (1, 2):
        journal.log_metrics(run_id, {"train_loss": 1.0 / epoch, "test_error_pct": 5.0 - epoch}, step=epoch)
    (root / "models").mkdir()
    (root / "models" / "config.json").write_text("{}")
    journal.log_artifact(run_id, root / "models" / "config.json")
    journal.log_artifact(run_id, root / "models" / "model.safetensors")  # not brought home: tagged as missing
    journal.log_datasets(run_id, [DATASET | {"source": str(root / DATASET["source"])}])  # as the repository names it
    journal.end(run_id)
    assert journal.start("capsnet_r1-seed0", PARAMS, run_id=run_id) == run_id  # a resumed run appends
    journal.log_metrics(run_id, {"test_error_pct": 2.5}, step=3)
    journal.end(run_id)
    return run_id
