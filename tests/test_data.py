"""MNIST's files and splits: IDX files read and refused, the prepared splits and their subsets, a dataset's
digest, what a run trains and tests on, Table 1's batches and the prepare stage. The transforms (the
affine set's draws and warp, the random shift): tests/test_transforms.py."""

import pytest
import torch

from conftest import committed_params, disk_full_midway, idx_bytes, synthetic_digits, trust_mnist, write_mnist
from pipeline.data.idx import IdxError, read_idx, read_split
from pipeline.data.splits import dataset_input, load_split, prepare_mnist, save_split, split_metadata
from pipeline.data.transforms import AffineRanges, make_affine_set
from pipeline.experiments.table1 import prepare_affine
from pipeline.stages import prepare as prepare_stage


def test_read_idx_roundtrip(tmp_path):
    images, labels = synthetic_digits(5)
    (tmp_path / "a").write_bytes(idx_bytes(images))
    (tmp_path / "b").write_bytes(idx_bytes(labels))
    assert torch.equal(read_idx(tmp_path / "a", 3), images)
    assert torch.equal(read_idx(tmp_path / "b", 1), labels)


@pytest.mark.parametrize("mutate,match", [
    (lambda b: b"\x00\x00\x09\x03" + b[4:], "bad magic number"),  # not unsigned bytes
    (lambda b: b"\x00\x00\x08\x01" + b[4:], "bad magic number"),  # wrong dimensionality
    (lambda b: b"\x01\x00" + b[2:], "bad magic number"),  # its first two bytes are not zero
    (lambda b: b[:-7], "truncated"),
    (lambda b: b + b"\x00", "longer than its header"),
    (lambda b: b[:2], "too short"),
    (lambda b: b[:3], "too short"),  # one byte short of the magic number: still this line, not struct's
    (lambda b: b[:9], "truncated header"),
])
def test_read_idx_rejects_bad_files(tmp_path, mutate, match):
    images, _ = synthetic_digits(3)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(mutate(idx_bytes(images)))
    with pytest.raises(IdxError, match=match) as err:
        read_idx(path, 3)
    assert "train-images-idx3-ubyte" in str(err.value)


def test_each_split_reads_its_own_files(tmp_path):
    """train: train-*-ubyte, test: t10k-*-ubyte (MNIST's names), images and labels as written."""
    files = write_mnist(tmp_path, n_train=40, n_test=20)
    for split, prefix, n in (("train", "train", 40), ("test", "t10k", 20)):
        images, labels = read_split(tmp_path, split)
        assert images.shape == (n, 28, 28) and labels.shape == (n,)
        assert images.numpy().tobytes() == files[f"{prefix}-images-idx3-ubyte"][16:]
        assert labels.numpy().tobytes() == files[f"{prefix}-labels-idx1-ubyte"][8:]


def test_read_split_rejects_count_mismatch(tmp_path):
    write_mnist(tmp_path)
    _, labels = synthetic_digits(7)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(labels))
    with pytest.raises(IdxError, match="20 images but 7 labels"):
        read_split(tmp_path, "test")


def test_read_split_rejects_a_label_that_is_not_a_digit(tmp_path):
    write_mnist(tmp_path)
    _, labels = synthetic_digits(20)
    labels[3] = 10
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(labels))
    with pytest.raises(IdxError, match="label 10 is not a digit"):
        read_split(tmp_path, "test")


def test_prepare_writes_subsets_and_affine_set(tmp_path):
    """A subset is the first digits of each split in file order, and says so in its header."""
    raw = tmp_path / "raw"
    write_mnist(raw, n_train=40, n_test=20)
    mnist = prepare_mnist(raw, tmp_path / "out", train_subset=16, test_subset=8)
    prepare_affine(tmp_path / "out", mnist["test_images"], mnist["test_labels"], affine_seed=1, ranges=AffineRanges())
    train = load_split(tmp_path / "out" / "train.safetensors")
    affine = load_split(tmp_path / "out" / "affine_test.safetensors")
    assert train["images"].shape == (16, 28, 28) and train["images"].dtype == torch.uint8
    assert affine["images"].shape == (8, 28, 28) and affine["affine_params"].shape == (8, 6)
    assert torch.equal(affine["labels"], load_split(tmp_path / "out" / "test.safetensors")["labels"])
    raw_train, raw_test = read_split(raw, "train"), read_split(raw, "test")
    assert torch.equal(train["images"], raw_train[0][:16]) and torch.equal(train["labels"], raw_train[1][:16])
    assert split_metadata(tmp_path / "out" / "train.safetensors")["source"] == (
        "MNIST train set (first 16 digits, in file order)")  # what MLflow's Dataset column shows as its source
    prepare_mnist(raw, tmp_path / "whole", train_subset=0, test_subset=0)
    assert torch.equal(load_split(tmp_path / "whole" / "test.safetensors")["labels"], raw_test[1])
    assert split_metadata(tmp_path / "whole" / "test.safetensors")["source"] == (
        "MNIST test set (every digit, in file order)")


def digest_of(path, context):
    return dataset_input(path, load_split(path), context)


def test_a_datasets_digest_is_its_tensors_and_nothing_else(tmp_path):
    """MLflow's Dataset column: the digest follows every pixel and label of the split, each tensor's
    shape and dtype (and any other tensor in it), not where the file lies or what its metadata says."""
    images, labels = synthetic_digits(6)
    save_split(tmp_path / "train.safetensors", images, labels, {"source": "MNIST train set"})
    base = digest_of(tmp_path / "train.safetensors", "training")
    assert base["name"] == "train" and base["context"] == "training" and len(base["digest"]) == 16
    assert base["profile"] == {"num_rows": 6, "source": "MNIST train set"}
    (tmp_path / "moved").mkdir()
    save_split(tmp_path / "moved" / "train.safetensors", images.clone(), labels.clone(), {"source": "elsewhere"})
    assert digest_of(tmp_path / "moved" / "train.safetensors", "testing")["digest"] == base["digest"]
    pixel, label = images.clone(), labels.clone()
    pixel[5, 27, 27] ^= 1
    label[0] = (label[0] + 1) % 10
    same_bytes = (images.reshape(6, -1), images.view(torch.int8))  # the same bytes as another shape, another dtype
    for changed_images, changed_labels, extra in ((pixel, labels, {}), (images, label, {}),
                                                  (images, labels, {"shifts": torch.zeros(6, 2)}),
                                                  *((same, labels, {}) for same in same_bytes)):
        save_split(tmp_path / "x.safetensors", changed_images, changed_labels, **extra)
        assert digest_of(tmp_path / "x.safetensors", "training")["digest"] != base["digest"]
    # one digest whatever order a stage holds the tensors in; a tensor's name counts, not only its bytes
    held = load_split(tmp_path / "train.safetensors")
    assert dataset_input(tmp_path / "train.safetensors", dict(reversed(held.items())), "training")["digest"] == base["digest"]
    named = [dataset_input(tmp_path / "x.safetensors", {"images": images, "labels": labels, name: torch.zeros(6, 2)},
                           "training")["digest"] for name in ("offsets", "shifts")]
    assert named[0] != named[1]
    save_split(tmp_path / "unsourced.safetensors", images, labels)  # no source in its header: its file's name
    assert digest_of(tmp_path / "unsourced.safetensors", "training")["profile"]["source"] == "unsourced"


def test_a_split_write_cut_short_leaves_the_split_before_it_whole(tmp_path, monkeypatch):
    """A write that fails part-way (a full disk) never replaces the split there, nor leaves a partial
    file beside it: the next stage reads the last whole one."""
    from pipeline.data import splits

    images, labels = synthetic_digits(4)
    path = tmp_path / "test.safetensors"
    save_split(path, images, labels)
    monkeypatch.setattr(splits, "save_file", disk_full_midway)
    with pytest.raises(OSError, match="No space left"):
        save_split(path, images[:2], labels[:2])
    monkeypatch.undo()
    assert torch.equal(load_split(path)["labels"], labels) and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_split_that_is_absent_torn_or_not_a_split_is_one_line_naming_the_command_that_rebuilds_it(tmp_path):
    """What a stage reads first: each bad file is a UserError (the CLI's one line) that says what is
    wrong and which `dvc repro` makes it again, never safetensors' own exception or a KeyError later."""
    from safetensors.torch import save_file

    from pipeline.core.errors import UserError

    images, labels = synthetic_digits(4)
    save_split(tmp_path / "good.safetensors", images, labels)
    whole = (tmp_path / "good.safetensors").read_bytes()
    (tmp_path / "torn.safetensors").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "noise.safetensors").write_bytes(b"\xff" * 64)
    save_file({"images": images}, str(tmp_path / "unlabelled.safetensors"))
    save_file({"images": images, "labels": labels[:3]}, str(tmp_path / "uneven.safetensors"))
    for name, message in (("absent", r"not found; build it with `dvc repro prepare`"),
                          ("torn", r"is truncated or corrupt .*; rebuild it with `dvc repro -f prepare`"),
                          ("noise", r"is truncated or corrupt .*; rebuild it with `dvc repro -f prepare`"),
                          ("unlabelled", r"is not a prepared split \(images and labels of one length\)"),
                          ("uneven", r"is not a prepared split \(images and labels of one length\)")):
        with pytest.raises(UserError, match=message):
            load_split(tmp_path / f"{name}.safetensors")
    assert torch.equal(load_split(tmp_path / "good.safetensors")["labels"], labels)


def test_training_data_is_the_train_split_and_the_per_epoch_test_set_under_their_contexts(tmp_path):
    """`base.training_data`: the train split, the named per-epoch test set with the further tensors asked
    for (MultiMNIST's recipes) as test_<name>, the two as MLflow dataset inputs (training, testing); a
    batch larger than the training split is one line naming both ways out."""
    from types import SimpleNamespace

    from pipeline.core.errors import UserError
    from pipeline.experiments import base

    images, labels = synthetic_digits(6)
    pairs = torch.tensor([[0, 1], [2, 3], [4, 5]])
    save_split(tmp_path / "train.safetensors", images, labels)
    save_split(tmp_path / "clean.safetensors", images[:3].flip(0), labels[:3], pairs=pairs, shifts=torch.ones(3, 2))
    data, inputs = base.training_data("clean", tmp_path, SimpleNamespace(batch_size=6), test_extras=("pairs",))
    assert sorted(data) == ["test_images", "test_labels", "test_pairs", "train_images", "train_labels"]
    assert torch.equal(data["train_images"], images) and torch.equal(data["test_images"], images[:3].flip(0))
    assert torch.equal(data["test_pairs"], pairs)
    assert [(d["name"], d["context"]) for d in inputs] == [("train", "training"), ("clean", "testing")]
    refusal = r"batch_size 7 exceeds the 6 training images in .*; lower train.batch_size or raise prepare.train_subset"
    with pytest.raises(UserError, match=refusal):
        base.training_data("clean", tmp_path, SimpleNamespace(batch_size=7))


@pytest.mark.parametrize("name", ["table1", "affnist"])
def test_synthetic_data_has_the_shapes_the_experiment_trains_and_tests_on_and_every_class(name):
    """What the bench and the fingerprint train on: 28×28 training digits, test images of the experiment's
    own size (affNIST's 40×40 canvas), labels through every class."""
    from types import SimpleNamespace

    from pipeline.core import registry

    module = registry.load(name)
    data = module.synthetic_data(SimpleNamespace(num_classes=10), 20, torch.device("cpu"))
    assert data["train_images"].shape == (20, 28, 28) and data["train_images"].dtype == torch.uint8
    assert data["test_images"].shape == (20, module.IMAGE_SIZE, module.IMAGE_SIZE)
    assert sorted(set(data["train_labels"].tolist())) == list(range(10)) == sorted(set(data["test_labels"].tolist()))


def test_a_runs_steps_are_its_epochs_of_what_its_experiment_draws_per_epoch():
    """MLflow's `steps` param: epochs × whole batches of an epoch, an epoch being the training split
    (Table 1) or train.multimnist_epoch_size fresh pairs (MultiMNIST)."""
    import dataclasses

    from conftest import REPO
    from pipeline.core.params import load_params
    from pipeline.stages.train import run_params
    from pipeline.training.config import run_config

    params = load_params(REPO / "params.yaml")
    data = {"train_images": torch.zeros(100, 28, 28), "test_images": torch.zeros(7, 28, 28)}
    env, cpu = {"torch_version": torch.__version__}, torch.device("cpu")
    table1 = dataclasses.replace(run_config(params, "capsnet_r1", 0), epochs=3, batch_size=16)
    assert run_params(table1, data, cpu, env)["steps"] == 18  # 3 × (100 // 16)
    pairs = dataclasses.replace(run_config(params, "multimnist_r1_recon", 0), epochs=2, batch_size=16,
                                multimnist_epoch_size=200)
    logged = run_params(pairs, data, cpu, env)
    assert (logged["steps"], logged["n_train"], logged["n_test"]) == (24, 100, 7)  # 2 × (200 // 16)


def test_table1_draws_whole_shifted_batches_of_its_order_and_scores_the_clean_test_set(tmp_path):
    """Table 1's training: the clean test set each epoch (not the affine-shifted one), whole batches only
    (50 digits at batch 16: 3 steps), each a slice of the epoch's order with its own labels, every digit
    shifted by its own (dy, dx) within ±max_shift px, some of them moved; the test error in percent."""
    from types import SimpleNamespace

    from pipeline.data.transforms import translate
    from pipeline.experiments import table1
    from pipeline.training.experiment import to_float

    images, labels = synthetic_digits(50, seed=1)
    for name, n in (("train", 50), ("test", 20), ("affine_test", 10)):
        save_split(tmp_path / f"{name}.safetensors", images[:n], labels[:n])
    cfg = SimpleNamespace(batch_size=16, max_shift=2, image_size=28)
    data, inputs = table1.training_data(tmp_path, cfg)
    assert [d["name"] for d in inputs] == ["train", "test"] and len(data["test_images"]) == 20
    exp = table1.Training(cfg, data, torch.device("cpu"))
    assert (exp.steps_per_epoch, exp.examples_per_epoch) == (3, 50)
    g = torch.Generator().manual_seed(0)
    order = exp.epoch_order(g)
    moved = 0
    for step in range(exp.steps_per_epoch):
        idx = order[16 * step:16 * (step + 1)]
        batch = exp.batch(order, step, g)
        assert torch.equal(batch.labels, labels[idx].long()) and batch.targets is None
        shifts = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)]
        shifted = {d: to_float(translate(images[idx], torch.tensor([d] * 16), 28)) for d in shifts}
        found = [[d for d in shifts if torch.equal(batch.x[i], shifted[d][i])] for i in range(16)]
        assert all(found)
        moved += sum((0, 0) not in f for f in found)
    assert moved > 0

    class Zeros(torch.nn.Module):  # answers class 0 for every image
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(()))

        def forward(self, x):
            return torch.zeros(len(x), 10) + torch.nn.functional.one_hot(torch.zeros(len(x), dtype=torch.long), 10)

    assert exp.test_error(Zeros(), batch_size=8, amp=False) == 90.0  # 2 of the 20 test digits are zeros


def test_table1_prepares_its_affine_set_from_params_and_draws_a_montage_of_montage_count(tmp_path, monkeypatch):
    """prepare.affine_seed, the four ranges (min_scale below max_scale, as given) and montage_count are
    what Table 1's prepare uses: the set is `make_affine_set` under them, its header records them."""
    import dataclasses
    import json

    from conftest import REPO
    from pipeline.core.params import load_params
    from pipeline.experiments import table1

    params = load_params(REPO / "params.yaml")
    params = dataclasses.replace(params, prepare=dataclasses.replace(
        params.prepare, affine_seed=5, max_rotation_deg=10.0, max_shear=0.1, min_scale=0.7, max_scale=1.1,
        montage_count=3))
    images, labels = synthetic_digits(12, seed=3)
    drawn = []
    monkeypatch.setattr(table1.figures, "affine_montage", lambda *args: drawn.append(args))
    summary = table1.prepare(params, {"test_images": images, "test_labels": labels}, tmp_path, tmp_path)
    ranges = AffineRanges(10.0, 0.1, 0.7, 1.1)
    affine = load_split(tmp_path / "affine_test.safetensors")
    expected, transforms = make_affine_set(images, 5, ranges)
    assert torch.equal(affine["images"], expected) and torch.equal(affine["affine_params"], transforms)
    assert json.loads(split_metadata(tmp_path / "affine_test.safetensors")["ranges"]) == dataclasses.asdict(ranges)
    [(originals, shifted, drawn_transforms, path)] = drawn  # the originals above their affine-shifted versions
    assert torch.equal(originals, images[:3]) and torch.equal(shifted, expected[:3])
    assert torch.equal(drawn_transforms, transforms[:3]) and path == tmp_path / table1.MONTAGE
    assert summary == "12 affine-shifted"


def test_the_prepare_stage_cuts_each_split_to_its_own_subset_and_sums_up_every_experiment(tmp_path, monkeypatch):
    """train_subset cuts the training split and test_subset the test split (never the other way
    round); the summary counts the test digits, names every experiment's sets and the montages'
    folder, which it makes."""
    raw, out, figures = tmp_path / "raw", tmp_path / "prepared", tmp_path / "reports" / "figures"
    trust_mnist(monkeypatch, write_mnist(raw, n_train=40, n_test=20))
    params = committed_params(train_subset=30, test_subset=12, affnist_transforms=1, multimnist_pairs_per_digit=1,
                              montage_count=2)
    said = prepare_stage.run(params, raw, out, figures)
    assert len(load_split(out / "train.safetensors")["labels"]) == 30
    assert len(load_split(out / "test.safetensors")["labels"]) == 12
    assert said.startswith(f"prepared {out}: 12 test digits, ") and said.endswith(f"; montages in {figures}")
    parts = said.removeprefix(f"prepared {out}: 12 test digits, ").removesuffix(f"; montages in {figures}").split("; ")
    assert parts[0] == "12 affine-shifted" and parts[1] == "12 expanded (40×40)" and parts[-1] == "MultiMNIST: 12 test recipes"
    assert figures.is_dir()

