"""The deviations Table 1's section lists: the profile's changes to the paper protocol, a data subset, each
recipe present, and §5.2's and MultiMNIST's own (a test set smaller than the paper's). Table 1's section
otherwise: tests/test_report.py."""

from conftest import committed_params, with_ablation
from report_runs import REFERENCE
from pipeline.experiments import affnist
from pipeline.experiments import multimnist as mm
from pipeline.experiments import table1_report as t1
from pipeline.models import capsnet
from pipeline.models.baseline import MULTIMNIST_DEVIATIONS


def test_recipe_differences_list_only_changes():
    recipe = {k: v for k, v in REFERENCE["recipe"].items() if k != "source"}
    assert t1.recipe_differences(recipe, REFERENCE) == []
    assert t1.recipe_differences({**recipe, "epochs": 50}, REFERENCE) == ["train.epochs = 50 (paper protocol: 640)"]


def test_deviations_name_profile_changes_including_the_affnist_set():
    committed = committed_params()
    assert not any("Data subsets" in d for d in t1.deviations(committed, REFERENCE))
    assert affnist.deviations_of(committed) == []
    smoke = committed_params(affnist_transforms=1, test_subset=256)
    assert any("256 test digits" in d for d in t1.deviations(smoke, REFERENCE))
    assert any("1 transform(s) per test digit" in d for d in affnist.deviations_of(smoke))  # §5.2's own


def test_deviations_name_a_multimnist_test_set_smaller_than_the_papers():
    committed = committed_params()  # 1,000 partners per digit: the paper's 10M pairs
    assert not any("MultiMNIST test set" in d for d in mm.deviations_of(committed))
    gpu = committed_params(multimnist_pairs_per_digit=100)
    (line,) = [d for d in mm.deviations_of(gpu) if "MultiMNIST test set" in d]
    assert "100 partners per test digit, 1,000,000 pairs" in line and "SE ≤ 0.050 pp" in line  # √(¼ / 1e6) = 0.0005
    assert all(d in mm.deviations_of(gpu) for d in MULTIMNIST_DEVIATIONS + mm.DEVIATIONS)  # its CNN's, its sampling's
    no_multi = with_ablation(gpu, stacked=(), separate=("capsnet_r1",))
    assert not any("MultiMNIST" in d for d in mm.deviations_of(no_multi))


def test_deviations_list_each_recipe_present():
    committed = committed_params()
    listed = t1.deviations(committed, REFERENCE)
    assert all(d in listed for d in capsnet.PAPER_RECIPE_DEVIATIONS + capsnet.OFFICIAL_RECIPE_DEVIATIONS)
    paper_only = with_ablation(committed, stacked=(), separate=("capsnet_r1",))
    listed = t1.deviations(paper_only, REFERENCE)
    assert capsnet.PAPER_RECIPE_DEVIATIONS[0] in listed and capsnet.OFFICIAL_RECIPE_DEVIATIONS[0] not in listed
