import copy

import pytest
import yaml

from conftest import REPO
from pipeline.core.params import ParamsError, load_params, parse_params
from pipeline.report.runs import paper_reference

RAW = yaml.safe_load((REPO / "params.yaml").read_text())


def with_change(path: str, value):
    raw = copy.deepcopy(RAW)
    *parents, last = path.split(".")
    node = raw
    for key in parents:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return raw


def test_committed_params_are_the_paper_protocol():
    p = load_params(REPO / "params.yaml")
    assert p.base.profile == "paper"
    recipe = {k: v for k, v in paper_reference()["recipe"].items() if k != "source"}  # tests/test_reference.py
    assert {k: getattr(p.train, k) for k in recipe} == recipe  # 640 epochs of 128, 1e-3 · 0.96^(step/2000) ≥ 1e-6, ±2 px
    assert p.train.lr_schedule_epochs == 0 and p.train.amp is False  # the paper's own decay, in fp32
    assert p.ablation.seeds == (0, 1, 2)  # Table 1: 3 trials
    assert (p.prepare.max_rotation_deg, p.prepare.max_shear, p.prepare.min_scale, p.prepare.max_scale) == (
        20.0, 0.2, 0.8, 1.2)  # affNIST's ranges (PAPER.md §5.2)
    assert p.prepare.multimnist_max_shift == 4 and p.prepare.multimnist_pairs_per_digit == 1000  # §6: ±4 px, 10M
    assert p.variant("capsnet_r3_recon").routing_iterations == 3
    assert p.variant("capsnet_r3_recon").target_accuracy_pct == 0  # Table 1 runs train every epoch
    s52 = p.variant("capsnet_affnist"), p.variant("cnn_affnist")
    assert [(v.image_size, v.target_accuracy_pct) for v in s52] == [(40, 99.23), (40, 99.23)]
    assert p.prepare.affnist_transforms == 32 and {"capsnet_affnist", "cnn_affnist"} <= set(p.ablation.variants)
    # every defined variant trains, stacked or separate, but the precision twin: in fp32 already, the
    # paper protocol would train it as capsnet_r3_recon; the gpu and smoke profiles add it (test_profiles)
    assert set(p.variants) - set(p.ablation.variants) == {"capsnet_r3_recon_fp32"}
    assert len(p.ablation.variants) == len(set(p.ablation.variants))


def test_a_record_from_before_stacking_reads_as_separate_variants():
    """The params the 2026-11-23 GPU runs were published with (reports/runs/params.yaml until the
    2026-11-26 window rewrote it) list ablation.variants: one process per seed."""
    p = load_params(REPO / "tests" / "data" / "params_2026-11-23.yaml")
    assert p.ablation.stacked == () and len(p.ablation.separate) == 14
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["ablation"]["variants"] = ["capsnet_r1"]  # beside the new keys: refused, not guessed
    with pytest.raises(ParamsError, match="unknown key ablation.variants"):
        parse_params(raw)


@pytest.mark.parametrize("path,value,message", [
    ("variants.capsnet_r1.routing_iterations", 0, "variants.capsnet_r1.routing_iterations must be >= 1, got 0"),
    ("train.batch_size", 0, "train.batch_size must be >= 1, got 0"),
    ("train.lr", 0.0, "train.lr must be > 0"),
    ("train.epochs", "ten", "train.epochs must be of type int"),
    ("train.amp", 1, "train.amp must be of type bool"),
    ("train.bogus", 3, "unknown key train.bogus"),
    ("train.epochs", KeyError, "missing key train.epochs"),
    ("prepare.min_scale", 1.5, "prepare.min_scale (1.5) must be <= prepare.max_scale"),
    ("base.profile", "fast", "base.profile must be one of"),
    ("ablation.seeds", [0, 0], "ablation.seeds must be distinct"),
    ("ablation.separate", ["capsnet_r9"], "ablation.separate names 'capsnet_r9'"),
    ("ablation.stacked", ["capsnet_r1", "baseline_cnn"], "'baseline_cnn' is under both stacked and separate"),
    ("ablation.stacked", ["capsnet_r1", "capsnet_r1"], "ablation.stacked lists a variant twice"),
    ("variants.baseline_cnn.reconstruction", True, "baseline_cnn has no routing or reconstruction"),
    ("train.device", "tpu", "train.device must be"),
    ("variants.capsnet_r3_recon_fp32.precision", "fp16", "variants.capsnet_r3_recon_fp32.precision must be fp32, bf16 "
                                                         "or left out (the profile's train.amp decides), got 'fp16'"),
    ("train.stack_layout", "grouped", "train.stack_layout must be one of fused, bmm, loop, streams, got 'grouped'"),
    ("train.compile_mode", "fast", "train.compile_mode must be one of default, reduce-overhead, max-autotune, "
                                   "max-autotune-no-cudagraphs, got 'fast'"),
    ("variants.capsnet_affnist.image_size", 32, "variants.capsnet_affnist.image_size is 32 but experiment affnist takes "
                                                "40×40 images"),
    ("variants.capsnet_r1.experiment", "fashion", "variants.capsnet_r1.experiment: unknown experiment 'fashion'; "
                                                  "known: table1, affnist, multimnist"),
    ("variants.multimnist_baseline.experiment", "table1", "variants.multimnist_baseline: experiment table1 trains "
                                                          "capsnet, baseline_cnn, pooling_cnn, not multimnist_cnn"),
    ("variants.capsnet_r1.experiment", "", "variants.capsnet_r1.experiment is missing: name one of table1"),
    ("variants.capsnet_affnist.target_accuracy_pct", 100.5, "target_accuracy_pct must be <= 100"),
    ("variants.cnn_affnist.routing_iterations", 3, "pooling_cnn has no routing or reconstruction"),
    ("prepare.affnist_transforms", 0, "prepare.affnist_transforms must be >= 1"),
    ("variants.capsnet_r1.recipe", "keras", "variants.capsnet_r1.recipe must be one of ('paper', 'official')"),
    ("variants.baseline_cnn.recipe", "official", "recipe 'official' is for CapsNets"),
    ("train.lr", "1e-3", "train.lr is the string '1e-3': YAML reads a number in e-notation without a '.' as text; "
                         "write 1.0e-3"),
    ("prepare.train_subset", 512, "base.profile is 'paper' but prepare.train_subset is set: data subsets are for "
                                  "the smoke profile only"),
    ("prepare.test_subset", 100, "base.profile is 'paper' but prepare.test_subset is set"),
    ("variants.capsnet_r1.model", "resnet", "variants.capsnet_r1.model must be one of ('baseline_cnn', 'capsnet',"),
    ("ablation.seeds", [], "ablation.seeds must list at least one seed"),
    ("ablation.seeds", [0, -1], "ablation.seeds must be distinct integers >= 0, got [0, -1]"),
    ("ablation.seeds", 3, "ablation.seeds must be a list, got 3"),
    ("ablation.seeds", [0, "1"], "ablation.seeds[1] must be of type int, got '1'"),  # each item checked, not only the list
    ("ablation.stacked", ["capsnet_r1", 3], "ablation.stacked[1] must be of type str, got 3"),
    ("train.epochs", True, "train.epochs must be of type int, got True"),  # YAML's true is no number
    ("train.lr", True, "train.lr must be of type float, got True"),
    ("train", [1], "train must be a mapping of keys, got [1]"),
    ("prepare", KeyError, "missing section 'prepare' in params.yaml"),
    ("variants", {}, "variants must map each variant name to its model settings"),
    ("variants", ["capsnet_r1"], "variants must map each variant name to its model settings"),
])
def test_bad_params_fail_naming_the_key(path, value, message):
    with pytest.raises(ParamsError) as err:
        parse_params(with_change(path, value))
    assert message in str(err.value)


def test_params_from_before_the_experiment_key_read_by_image_size():
    raw = copy.deepcopy(RAW)
    for name, size in (("capsnet_r1", 28), ("capsnet_affnist", 40), ("multimnist_r1_recon", 36)):
        del raw["variants"][name]["experiment"]
        raw["variants"][name]["image_size"] = size
    p = parse_params(raw)
    assert [(p.variant(v).experiment, p.variant(v).image_size) for v in ("capsnet_r1", "capsnet_affnist",
            "multimnist_r1_recon")] == [("table1", 28), ("affnist", 40), ("multimnist", 36)]
    assert parse_params(RAW).variant("capsnet_r1") == p.variant("capsnet_r1")  # the same variant either way


def test_the_ablation_lists_stacked_variants_first_and_an_unknown_variant_is_one_line():
    """What trains, in the order `capsnet stages` and the report take it: stacked, then separate, in
    params.yaml's order, read alike from a raw mapping (profiles) and from loaded params."""
    from pipeline.core.params import ablation_variants

    p = parse_params(RAW)
    assert p.ablation.stacked and p.ablation.separate  # both lists hold variants, so their order shows
    assert p.ablation.variants == (*RAW["ablation"]["stacked"], *RAW["ablation"]["separate"])
    assert ablation_variants(RAW) == list(p.ablation.variants)
    with pytest.raises(ParamsError, match=r"unknown variant 'capsnet_r9'; params.yaml defines \['baseline_cnn'"):
        p.variant("capsnet_r9")


def test_unknown_section_and_missing_file(tmp_path):
    raw = copy.deepcopy(RAW)
    raw["extra"] = {}
    with pytest.raises(ParamsError, match="unknown section 'extra'"):
        parse_params(raw)
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "params.yaml")


def test_lr_written_as_yaml_reads_it_gets_the_fix(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text((REPO / "params.yaml").read_text().replace("lr: 0.001 ", "lr: 1e-3 "))
    with pytest.raises(ParamsError, match=r"write 1\.0e-3"):
        load_params(path)


def test_a_batch_larger_than_the_subset_fails_at_validation():
    raw = with_change("base.profile", "smoke")
    raw["prepare"]["train_subset"] = 64
    raw["train"]["batch_size"] = 128
    with pytest.raises(ParamsError, match=r"train.batch_size \(128\) exceeds prepare.train_subset \(64\)"):
        parse_params(raw)
    raw["train"]["batch_size"] = 64
    parse_params(raw)


def test_the_captured_step_refuses_a_compile_mode_with_cuda_graphs_of_its_own():
    """train.cuda_graph captures the whole step; torch.compile's reduce-overhead and max-autotune modes
    capture graphs of their own inside it, which one capture cannot hold: refused, naming both keys.
    Without compile the mode is unused, and max-autotune-no-cudagraphs is fine."""
    raw = with_change("train.cuda_graph", True)
    raw["train"].update(compile=True, compile_mode="reduce-overhead")
    with pytest.raises(ParamsError, match="train.cuda_graph captures the whole step, which cannot hold compile_mode "
                                          "'reduce-overhead'"):
        parse_params(raw)
    for compile_, mode in ((False, "reduce-overhead"), (True, "max-autotune-no-cudagraphs"), (True, "default")):
        raw["train"].update(compile=compile_, compile_mode=mode)
        assert parse_params(raw).train.cuda_graph is True


def test_what_params_accept_is_what_they_mean():
    """The other side of the refusals: cuda:N is a device, an integer learning rate is a float, and the
    whole file must be a mapping; a YAML error names the file."""
    raw = with_change("train.device", "cuda:1")
    raw["train"]["lr"] = 1
    p = parse_params(raw)
    assert p.train.device == "cuda:1" and p.train.lr == 1.0 and isinstance(p.train.lr, float)
    raw = with_change("ablation.stacked", [])
    raw["ablation"]["separate"] = []
    with pytest.raises(ParamsError, match="ablation.stacked and ablation.separate list no variant between them"):
        parse_params(raw)
    with pytest.raises(ParamsError, match="params.yaml must be a mapping with sections base, prepare, train"):
        parse_params(["base"])


def test_a_params_file_that_is_not_yaml_is_one_line_naming_it(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("base: {seed: 0\n")
    with pytest.raises(ParamsError, match=f"{path} is not valid YAML: "):
        load_params(path)


def test_precision_twins_pair_a_variant_only_with_its_own_settings_and_bench_modes_name_every_lever():
    from pipeline.core.params import bench_mode_name, precision_twins

    raw = copy.deepcopy(RAW)
    raw["variants"]["capsnet_r9_bf16"] = {**raw["variants"]["capsnet_r1"], "routing_iterations": 9, "precision": "bf16"}
    assert precision_twins(raw) == {"capsnet_r3_recon_fp32": "capsnet_r3_recon"}  # the orphan has no original
    assert [bench_mode_name(True, None, channels_last=True), bench_mode_name(True, "default", True),
            bench_mode_name(False, None, cuda_graph=True), bench_mode_name(True, None, True, True)] == [
        "bf16-cl", "bf16-compile-cl", "capture", None]  # NHWC and captured: no bench mode is both
