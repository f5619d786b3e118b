"""Apply plausible bugs to a scratch copy, one at a time, and check that the tests named for each
one fail. A mutation the tests do not catch is a claim the suite does not test.

    .venv/bin/python scripts/mutate.py            # every mutation (about 35 min on 2 cores)
    .venv/bin/python scripts/mutate.py -k routing # those whose name contains "routing"

Exit status 1 when any mutation survives. The copy holds the repository's tracked and untracked
(not ignored) files; the package is imported from the copy (PYTHONPATH), so the real tree and
its environment are never touched. Not part of CI: each mutation reruns part of the suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


EQUATIONS = "tests/test_capsnet.py"
RECIPES = "tests/test_recipes.py"
RECIPE_WIRING = "tests/test_wiring.py::test_a_variant_trains_with_its_recipes_loss_and_model"
RESUME = "tests/test_wiring.py::test_resume_restores_the_generator_that_dropout_draws_from"
STACK = "tests/test_stack.py"
WINDOW = "tests/test_gpu_window.py"
FINGERPRINT = "tests/test_fingerprint.py"
EXTENSION = "tests/test_extension.py"
LAYOUT = "tests/test_layout.py"
COMPILED = "tests/test_wiring.py::test_the_compiled_step_computes_what_eager_computes"
STATS = "tests/test_stats.py"
REPORT = "tests/test_report.py"
POWER = "tests/test_power.py"
PROFILES = "tests/test_profiles.py"
DOCS = "tests/test_docs.py"
BEGUN = "tests/test_published.py::test_a_window_that_has_only_begun_a_protocol_leaves_the_published_claims_as_they_are"
QUEUE = f"{PROFILES}::test_gpu_queue_skips_what_is_published_under_the_profiles_protocol"
WARM = "tests/test_warm.py"
TALLY = "tests/test_steps.py::test_the_epochs_tallies_sum_each_seeds_parts_and_keep_its_first_non_finite_step"
CAPTURED = "tests/test_steps.py::test_the_capturable_step_trains_bit_for_bit_what_the_eager_step_trains[baseline_cnn-3seeds]"

MUTATIONS = [
    # --- equations (paper) ---
    Mutation("routing softmax over the input capsules", "pipeline/models/capsnet.py",
             "c = torch.softmax(b, dim=2)", "c = torch.softmax(b, dim=1)", (EQUATIONS,)),
    Mutation("routing logits replaced, not accumulated", "pipeline/models/capsnet.py",
             'b = b + torch.einsum("bijd,bjd->bij", u_hat, v)', 'b = torch.einsum("bijd,bjd->bij", u_hat, v)',
             (EQUATIONS,)),
    Mutation("squash without the square in the scale", "pipeline/models/capsnet.py",
             "return squared_norm / (1 + squared_norm) * s", "return squared_norm.sqrt() / (1 + squared_norm) * s",
             (EQUATIONS,)),
    Mutation("margin loss without the squares", "pipeline/models/capsnet.py",
             "present = t * F.relu(m_plus - lengths) ** 2", "present = t * F.relu(m_plus - lengths)", (EQUATIONS,)),
    Mutation("margin loss ignores λ", "pipeline/models/capsnet.py",
             "absent = lambda_ * (1 - t) *", "absent = (1 - t) *", (EQUATIONS,)),
    Mutation("margin loss averaged over classes", "pipeline/models/capsnet.py",
             "return (present + absent).sum(dim=1).mean()", "return (present + absent).mean()", (EQUATIONS,)),
    Mutation("reconstruction as a per-pixel mean", "pipeline/models/capsnet.py",
             "sse = ((reconstructions - images) ** 2).flatten(1).sum(dim=1)",
             "sse = ((reconstructions - images) ** 2).flatten(1).mean(dim=1)", (EQUATIONS,)),
    Mutation("official margin not divided by 2K", "pipeline/models/capsnet.py",
             "margin = margin / (2 * output.lengths.shape[1])", "margin = margin", (RECIPES,)),
    Mutation("official PrimaryCaps without the 1/types", "pipeline/models/capsnet.py",
             "out = out / self.types + self.bias", "out = out + self.bias", (RECIPES,)),
    # --- wiring: recipe and generators reaching the code that trains ---
    Mutation("training loss ignores the recipe", "pipeline/training/stack.py",
             'return cfg.recipe if cfg.model == "capsnet" else None', 'return "paper" if cfg.model == "capsnet" else None',
             (RECIPE_WIRING,)),
    Mutation("params' recipe never reaches the run config", "pipeline/training/train.py",
             "target_accuracy_pct=v.target_accuracy_pct, recipe=v.recipe,", "target_accuracy_pct=v.target_accuracy_pct,",
             (RECIPE_WIRING,)),
    Mutation("the model is built without its recipe", "pipeline/training/train.py",
             "cfg.image_size, cfg.num_classes, cfg.recipe)", "cfg.image_size, cfg.num_classes)", (RECIPE_WIRING,)),
    Mutation("resume drops the seeds' generators", "pipeline/training/train.py",
             "generator.set_state(saved)", "pass", (RESUME,)),
    Mutation("stacked seeds share one generator", "pipeline/training/train.py",
             "generators = [torch.Generator(device=device).manual_seed(c.seed) for c in cfgs]",
             "generators = [torch.Generator(device=device).manual_seed(cfg.seed)] * len(cfgs)", (STACK,)),
    Mutation("stacked seeds built from one initialisation", "pipeline/training/train.py",
             "        torch.manual_seed(c.seed)\n", "        torch.manual_seed(cfg.seed)\n", (STACK,)),
    Mutation("dropout masks from the global generator", "pipeline/training/stack.py",
             'draw = getattr(self.template, "dropout_keep", None)', "draw = None", (STACK,)),
    Mutation("stacked losses averaged over the seeds", "pipeline/training/steps.py",
             "(parts[:, 0] * active).sum().backward()", "(parts[:, 0] * active).mean().backward()", (STACK,)),
    Mutation("a seed that stopped early keeps its last weights, not its stopping epoch's", "pipeline/training/train.py",
             "        if seed.weights is not None:\n            model.load_state_dict(seed.weights)\n", "", (STACK,)),
    Mutation("the loop layout gives every seed the first seed's batch", "pipeline/training/stack.py",
             "self._one(self.seed_weights(k), batch.x[k],", "self._one(self.seed_weights(k), batch.x[0],",
             ("tests/test_stack.py::test_the_stacked_loss_sums_the_seeds_so_each_gets_its_own_gradient",)),
    Mutation("the stacked DVC stage trains only the first seed", "pipeline/cli.py",
             "return list(params.ablation.seeds)", "return list(params.ablation.seeds[:1])",
             ("tests/test_dvc.py::test_a_stacked_stage_trains_each_seed_into_its_own_directory",)),
    Mutation("a fanned-out stacked item evaluates only its first seed", "pipeline/core/stage_names.py",
             'for seed in ablation.seeds)]\n    if item', 'for seed in ablation.seeds[:1])]\n    if item',
             ("tests/test_scale.py::test_stage_list_is_dvc_matrix_names_in_params_order",)),
    Mutation("compiled step differs from eager (loss scaled)", "pipeline/training/train.py",
             "    loss_fn = torch.compile(stack, mode=cfg.compile_mode) if cfg.compile else stack",
             "    loss_fn = torch.compile(lambda *a: stack(*a) * 1.01, mode=cfg.compile_mode) if cfg.compile else stack",
             (COMPILED,)),
    Mutation("the optimizer ignores a compressed schedule", "pipeline/training/train.py",
             "pace = cfg.lr_schedule_epochs / cfg.epochs if cfg.lr_schedule_epochs else 1.0", "pace = 1.0",
             ("tests/test_train.py::test_a_compressed_schedule_reaches_the_optimizer_and_the_checkpoint_digest",)),
    Mutation("the gpu profile cuts the schedule instead of compressing it", "pipeline/profiles.py",
             '"train.lr_schedule_epochs": 640, ', "", ("tests/test_profiles.py",)),
    Mutation("a torn journal tail refuses the whole file", "pipeline/core/journal.py",
             "if index < len(lines) - 1:", "if True:", ("tests/test_tracking.py",)),
    Mutation("an evaluation against another store dies in MLflow's traceback", "pipeline/stages/evaluate.py",
             "    if not tracker.has_run(run_id):", "    if False:",
             ("tests/test_train.py::test_evaluating_against_a_store_without_the_training_run_says_so_and_keeps_the_evaluation",)),
    Mutation("an evaluation logs no dataset inputs", "pipeline/experiments/base.py",
             '        datasets.append(dataset_input(path, data, "evaluation"))\n', "",
             ("tests/test_train.py::test_train_and_evaluate_cli_log_one_run_per_variant",)),
    Mutation("a dataset digest ignores the labels", "pipeline/data/splits.py",
             "    for name in sorted(tensors):\n        tensor", '    for name in sorted(set(tensors) - {"labels"}):\n        tensor',
             ("tests/test_data.py",)),
    Mutation("the smoke prefill trains other params than its experiment runs", "pipeline/profiles.py",
             'else (apply(raw, "smoke"), args.prefill)', 'else (apply(raw, "paper"), args.prefill)',
             ("tests/test_dvc.py::test_a_smoke_experiment_leaves_params_and_lock_as_committed",)),
    Mutation("DVC knows one of an evaluation's figures, not the folder of them", "dvc.yaml",
             "      - results/${item.variant}/seed${item.seed}/figures  #",
             "      - results/${item.variant}/seed${item.seed}/figures/confusion.png  #",
             ("tests/test_dvc.py::test_a_second_clone_sharing_the_cache_restores_train_and_evaluate_from_the_run_cache",)),
    Mutation("the report reads a commit column of digits back as a number", "pipeline/report/runs.py",
             "    return pd.read_csv(path, dtype={column: str for column in COMMIT_COLUMNS})", "    return pd.read_csv(path)",
             (f"{REPORT}::test_report_stage_writes_every_declared_output_whatever_the_variants",)),
    Mutation("the smoke leaves its report over the published one", "pipeline/profiles.py",
             "        _set_aside(REPORTS, published, SMOKE_REPORT)\n", "",
             (f"{PROFILES}::test_smoke_sets_its_report_aside_and_puts_the_published_one_back",)),
    Mutation("the smoke keeps the files its report made beside the published ones", "pipeline/profiles.py",
             "    for path in after.keys() - before.keys():\n        path.unlink()", "    for path in ():\n        path.unlink()",
             (f"{PROFILES}::test_smoke_sets_its_report_aside_and_puts_the_published_one_back",)),
    Mutation("the smoke's report is set aside without the figures it did not change", "pipeline/profiles.py",
             "        if subfolder(path) in written:", "        if before.get(path) != content:",
             (f"{PROFILES}::test_smoke_sets_its_report_aside_and_puts_the_published_one_back",)),
    Mutation("stages open a fresh MLflow store without its lock", "pipeline/core/tracking.py",
             "        with file_lock(lock, wait=True) if lock else contextlib.nullcontext():",
             "        with contextlib.nullcontext():",
             ("tests/test_reliability.py::test_concurrent_stages_create_a_fresh_store_once",)),
    Mutation("a trainer that loses the race to log a new dataset fails its run", "pipeline/core/tracking.py",
             'if attempt == 2 or "unique" not in str(err).lower():', "if True:", ("tests/test_tracking.py",)),
    Mutation("an eager run ignores train.deterministic", "pipeline/training/train.py",
             "torch._C._set_deterministic_algorithms(cfg.deterministic, warn_only=True)",
             "torch._C._set_deterministic_algorithms(False, warn_only=True)",
             ("tests/test_wiring.py::test_the_deterministic_flag_reaches_torch",)),
    Mutation("a checkpoint is read by unpickling whatever it holds", "pipeline/training/checkpoint.py",
             'state = torch.load(path, map_location="cpu", weights_only=True)',
             'state = torch.load(path, map_location="cpu", weights_only=False)',
             ("tests/test_train.py::test_an_unreadable_checkpoint_is_moved_aside_and_training_starts_afresh",)),
    Mutation("an unreadable checkpoint is deleted, not moved aside", "pipeline/training/checkpoint.py",
             "        os.replace(path, aside)\n", "        path.unlink()\n",
             ("tests/test_train.py::test_an_unreadable_checkpoint_is_moved_aside_and_training_starts_afresh",)),
    Mutation("hints name the one-seed stages for a stacked variant", "pipeline/core/stage_names.py",
             'return f"train_stacked@{variant}" if variant in params.ablation.stacked else',
             'return f"train_stacked@{variant}" if False else',
             ("tests/test_train.py::test_a_missing_model_names_the_train_stage_that_exists",)),
    Mutation("a missing evaluation's hint names a stage that does not exist", "pipeline/core/stage_names.py",
             'return f"evaluate_stacked@{variant}-{seed}" if variant in params.ablation.stacked else',
             'return f"evaluate@{variant}-{seed}" if variant in params.ablation.stacked else',
             ("tests/test_report.py::test_a_missing_evaluation_names_the_stage_that_exists",)),
    Mutation("make ui opens the experiment's GenAI overview", "pipeline/core/tracking.py",
             'return f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs?{urlencode(query)}"',
             'return f"http://127.0.0.1:{port}/#/experiments/{experiment_id}"',
             ("tests/test_tracking.py::test_ui_loads_the_published_journals_once_and_serves_them",)),
    Mutation("smoke runs share the published runs' experiment", "pipeline/core/tracking.py",
             'return EXPERIMENT if profile in ("paper", "") else f"{EXPERIMENT}-{profile}"', "return EXPERIMENT",
             ("tests/test_tracking.py::test_journal_replays_into_mlflow_once",)),
    # --- the warm interpreter: a forked stage is the process a cold one would be ---
    Mutation("a warm stage runs in the server's directory", "pipeline/warm.py",
             '        os.chdir(request["cwd"])\n', "", (WARM,)),
    Mutation("a warm stage keeps the server's environment", "pipeline/warm.py",
             '        os.environ.clear()\n        os.environ.update(request["env"])\n', "", (WARM,)),
    Mutation("capsnet does not forward SIGTERM to its warm stage", "pipeline/warm.py",
             "            signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))", "            pass", (WARM,)),
    Mutation("a killed capsnet leaves its warm stage running", "pipeline/warm.py",
             "                    _kill(key.data)", "                    pass", (WARM,)),
    Mutation("the warm server runs code changed since it started", "pipeline/warm.py",
             "    if changed:\n", "    if False:\n", (WARM,)),
    Mutation("a warm stage runs on the server's CPU threads", "pipeline/warm.py",
             "            torch.set_num_threads(threads)", "            pass", (WARM,)),
    Mutation("the fan-out's slots each use every core", "scripts/fanout.sh",
             "OMP_NUM_THREADS=$FANOUT_THREADS dvc", "dvc",
             ("tests/test_scale.py::test_concurrent_stages_log_to_one_tracking_server_each_with_its_slot",)),
    # --- statistics and report ---
    Mutation("effects pair two variants' rows only by an equal fingerprint (never equal)",
             "pipeline/experiments/table1_report.py",
             "if (c := rr.shared_commit(rows_a[ka], rows_b[kb]))), None)",
             "if ka == kb and (c := rr.shared_commit(rows_a[ka], rows_b[kb]))), None)",
             ("tests/test_report.py::test_runs_with_one_training_fingerprint_pool_across_commits",)),
    Mutation("README lines group rows by their labels, not the commits that compute them",
             "pipeline/experiments/table1_report.py",
             'commits = dict(zip(mine.commit, mine.commits.fillna("").str.split()))', "commits = {c: [c] for c in mine.commit}",
             (REPORT,)),
    Mutation("an effect compares the first pair of rows sharing a commit, not the one with most seeds",
             "pipeline/experiments/table1_report.py",
             "pair = max(pairs, key=lambda p: min(len(rows_a[p[0]]), len(rows_b[p[1]])), default=None)",
             "pair = next(iter(pairs), None)",
             ("tests/test_report.py::test_an_effect_compares_the_pair_of_rows_with_the_most_seeds",)),
    Mutation("rows of two variants bridged without a commit in common", "pipeline/report/runs.py",
             "return next((c for c in commits_of(a) if c in theirs), None)",
             "return next((c for c in commits_of(a) + commits_of(b)), None)",
             ("tests/test_report.py::test_runs_with_one_training_fingerprint_pool_across_commits",)),
    Mutation("a fingerprint table bridges a run whatever fingerprint it computes for it", "pipeline/report/runs.py",
             '== t["fingerprints"][r.variant]))', 'is not None or True))',
             ("tests/test_report.py::test_a_fingerprint_table_lets_rows_of_two_commits_compare",)),
    Mutation("fingerprints of two environments compare (a table bridges, the GPU queue counts)", "pipeline/core/lineage.py",
             "    if own_env == environment:\n", "    if True:\n",
             ("tests/test_report.py::test_a_fingerprint_table_lets_rows_of_two_commits_compare", QUEUE)),
    Mutation("a run is carried into another environment without its commit's table of its own", "pipeline/core/lineage.py",
             "    if not any(t.get(\"environment\") == own_env", "    if False and any(t.get(\"environment\") == own_env",
             ("tests/test_report.py::test_a_table_of_a_runs_own_commit_carries_it_into_a_new_environment",)),
    Mutation("a run is carried into another environment through another commit's table", "pipeline/core/lineage.py",
             "mine = [t for t in tables if commit is not None and t.get(\"commit\") == commit]", "mine = list(tables)",
             ("tests/test_report.py::test_a_table_of_a_runs_own_commit_carries_it_into_a_new_environment",)),
    Mutation("a seed an earlier call trained is trained again", "scripts/gpu_session.sh",
             'if [ -f "models/$variant/seed$s/config.json" ]; then trained=', 'if false; then trained=',
             ("tests/test_gpu_window.py::test_a_window_evaluates_what_an_earlier_call_trained_and_trains_seeds_one_by_one_where_stacking_is_slower",)),
    Mutation("a failed evaluation is asked again until the deadline", "scripts/gpu_session.sh",
             '[ "$evaluated" = 0 ] && [ -n "$seeds" ] && return 3', '[ -n "$seeds" ] && return 3',
             ("tests/test_gpu_window.py::test_a_window_evaluates_what_an_earlier_call_trained_and_trains_seeds_one_by_one_where_stacking_is_slower",)),
    Mutation("a job stops after the first seed it trains", "scripts/gpu_session.sh",
             'while run_job "$1"; [ $? = 3 ]; do :; done', 'run_job "$1"',
             ("tests/test_gpu_window.py::test_a_window_evaluates_what_an_earlier_call_trained_and_trains_seeds_one_by_one_where_stacking_is_slower",)),
    Mutation("seeds train stacked where the bench says stacking is slower", "scripts/gpu_queue.py",
             "alone = not stacking_pays(params, variant, len(seeds), rows, parallel)", "alone = False",
             ("tests/test_gpu_window.py::test_where_stacked_seeds_train_slower_a_job_trains_one_seed_and_asks_again_for_the_next",)),
    Mutation("a captured run is priced at the uncaptured step's speed", "pipeline/report/costs.py",
             "return CONFIGURATIONS[amp, compiled] if plain or name is None else name", "return CONFIGURATIONS[amp, compiled]",
             ("tests/test_gpu_window.py::test_the_bench_table_is_what_the_report_prices_seeds_with",)),
    Mutation("the levers pick a stacked mode where one seed alone trains faster", "scripts/gpu_levers.py",
             "seeds = STACKED if fastest[STACKED] > fastest[1] else 1", "seeds = STACKED if fastest[STACKED] else 1",
             ("tests/test_profiles.py::test_gpu_levers_picks_the_fastest_mode_its_cuda_tests_prove",)),
    Mutation("a seed trained again overwrites its published record", "pipeline/report/publish.py",
             "        set_aside(dest, variant, seed_dir, run_id(models_dir / variant / seed_dir))\n", "",
             ("tests/test_report.py::test_a_seed_trained_again_sets_its_published_record_aside_and_the_report_keeps_both",)),
    Mutation("the report leaves out the published records set aside", "pipeline/stages/report.py",
             "models_dir, variants, seeds, p),", "models_dir / 'none', variants, seeds, p),",
             ("tests/test_published.py",)),
    Mutation("the report never reads the fingerprint tables", "pipeline/stages/report.py",
             "rr.load_tables(fingerprints))", "rr.load_tables(None))",
             ("tests/test_published.py", "tests/test_report.py::test_report_stage_reads_its_fingerprint_tables")),
    Mutation("capsnet fingerprint tables another configuration than the train stage fingerprints",
             "pipeline/training/fingerprint.py",
             "pool.submit(training_fingerprint, run_config(params, v, seed=0))",
             "pool.submit(training_fingerprint, run_config(params, v, seed=0, max_shift=0))",
             ("tests/test_fingerprint.py::test_the_train_stage_records_it_in_config_and_mlflow",)),
    Mutation("§5.2's gap compares two fingerprints only when equal", "pipeline/experiments/affnist_report.py",
             "and len({r.commit_key for r in cnn}) == 1 and shared_commit(caps, cnn) is not None)",
             "and len({r.commit_key for r in caps + cnn}) == 1 and shared_commit(caps, cnn) is not None)",
             ("tests/test_report.py::test_affnist_gap_of_two_fingerprints_from_one_commit_has_an_interval",)),
    Mutation("effect interval without the seed terms", "pipeline/report/stats.py",
             "return [(self.var_a / n_a, n_a - 1), (self.var_b / n_b, n_b - 1), (v_test, self.units - 1)]",
             "return [(v_test, self.units - 1)]", (STATS,)),
    Mutation("90 % intervals called 95 %", "pipeline/report/stats.py", "LEVEL = 0.95", "LEVEL = 0.90", (STATS,)),
    Mutation("normal instead of t quantile", "pipeline/report/stats.py",
             "float(stats.t.ppf(0.5 + level / 2, df))", "float(stats.norm.ppf(0.5 + level / 2))", (STATS,)),
    Mutation("power computed one-sided", "pipeline/report/power.py",
             "value = float(sps.nct.sf(critical, df, shift) + sps.nct.cdf(-critical, df, shift))",
             "value = float(sps.nct.sf(float(sps.t.ppf(level, df)), df, shift))", (POWER,)),
    Mutation("power from the normal quantile instead of t", "pipeline/report/power.py",
             "critical = float(sps.t.ppf(0.5 + level / 2, df))", "critical = float(sps.norm.ppf(0.5 + level / 2))",
             (POWER,)),
    Mutation("seeds needed from one arm's seed variance for both", "pipeline/report/stats.py",
             "(self.var_b / n_b, n_b - 1)", "(self.var_a / n_b, n_b - 1)", (POWER,)),
    Mutation("GPU time from another variant's speed", "pipeline/report/costs.py",
             "if (row.variant == variant and row.device", "if (row.device", (POWER,)),
    Mutation("an effect's GPU time counts one arm twice", "pipeline/report/claims.py",
             "run_cost(runs_a, seeds, bench, epochs), run_cost(runs_b, seeds, bench, epochs)",
             "run_cost(runs_a, seeds, bench, epochs), run_cost(runs_a, seeds, bench, epochs)", (POWER,)),
    Mutation("make gpu starts without CUDA", "pipeline/profiles.py",
             'if device.startswith("cuda") and not _cuda_available():', "if False:",
             ("tests/test_profiles.py::test_a_cuda_profile_without_cuda_is_refused_before_anything_runs",)),
    Mutation("the effects figure pools every protocol's effects", "pipeline/experiments/table1_figures.py",
             "    here = effect_table[effect_table.protocol == protocol]\n    path =", "    here = effect_table\n    path =",
             ("tests/test_report.py::test_the_effects_figure_plots_the_headline_protocols_effects_with_what_would_settle_each",)),
    Mutation("capsnet ui starts mlflow ui on a taken port", "pipeline/cli.py",
             "problem = None if dry_run else tracking.port_problem(port)", "problem = None",
             ("tests/test_tracking.py::test_ui_on_a_taken_port_says_so_before_loading_anything",)),
    Mutation("the paper protocol's cost is the runs' own length", "pipeline/report/claims.py",
             "float(np.mean(per_epoch)) * epochs", "float(np.mean(recorded))", (POWER,)),
    Mutation("the paper protocol's cost asks for no epochs", "pipeline/report/claims.py",
             "pair_cost(runs_a, runs_b, seeds, bench, costs.PAPER_EPOCHS)[0]", "pair_cost(runs_a, runs_b, seeds, bench)[0]",
             (POWER,)),
    Mutation("a claim's status leaves out its cost at the paper's epochs", "pipeline/report/claims.py",
             "{goal}{hours_phrase(seeds, hours, why, paper_hours)}\"\n", "{goal}{hours_phrase(seeds, hours, why)}\"\n",
             (POWER,)),
    Mutation("effect rows leave out the paper protocol's cost", "pipeline/report/claims.py",
             '"paper_protocol_hours": paper_protocol_cost(runs_a, runs_b, needed, bench)',
             '"paper_protocol_hours": math.nan', ("tests/test_published.py",)),
    Mutation("rows pool commits", "pipeline/report/runs.py",
             "out.setdefault((r.variant, r.protocol_key, r.commit_key), []).append(r)",
             'out.setdefault((r.variant, r.protocol_key, ""), []).append(r)', (REPORT,)),
    Mutation("§5.2 has no word for a gap below 0", "pipeline/experiments/affnist_report.py",
             '    if ci_high < 0:\n        return "opposite"\n', "", (REPORT,)),
    Mutation("old runs' Adam ε filled from a default", "pipeline/report/runs.py",
             'return self.config.get("optimizer", {}).get("adam_eps", NOT_RECORDED)',
             'return self.config.get("optimizer", {}).get("adam_eps", 1e-7)', (REPORT,)),
    Mutation("the published report rounds one more digit", "pipeline/report/document.py",
             "def fmt_pct(x: float, digits: int = 2)", "def fmt_pct(x: float, digits: int = 3)",
             ("tests/test_published.py",)),
    Mutation("the published learning curves lose a panel", "pipeline/stages/report.py",
             "learning_curves([(e.CURVES, mine[e.NAME]) for e in experiments]",
             "learning_curves([(e.CURVES, mine[e.NAME]) for e in experiments[:1]]",
             ("tests/test_published.py",)),
    Mutation("the report stage hands runs to experiments by image size", "pipeline/stages/report.py",
             "[r for r in runs if r.experiment == e.NAME]", "[r for r in runs if r.image_size == e.IMAGE_SIZE]",
             (EXTENSION, LAYOUT)),
    Mutation("the train stage scores every experiment on MNIST's test set", "pipeline/stages/train.py",
             "eval_set = cfgs[0].experiment_module().TEST_SETS[0]", 'eval_set = "test"', (EXTENSION,)),
    Mutation("prepare knows only the built-in experiments", "pipeline/stages/prepare.py",
             "for name in registry.names()]", "for name in registry.EXPERIMENTS]", (EXTENSION,)),
    Mutation("a variant's image size is not checked against its experiment", "pipeline/core/params.py",
             "if self.image_size and self.image_size != experiment.image_size:", "if False:", ("tests/test_params.py",)),
    Mutation("records from before the experiment key all read as Table 1", "pipeline/core/registry.py",
             "return LEGACY_IMAGE_SIZES[image_size]", 'return "table1"', ("tests/test_published.py",)),
    Mutation("runs of one training fingerprint split by commit", "pipeline/report/runs.py",
             'return f"fp {self.fingerprint[:8]}" if self.fingerprint != NOT_RECORDED else short(self.commit)',
             "return short(self.commit)", (REPORT,)),
    Mutation("a fingerprint row's figure misses the runs of its other commits", "pipeline/experiments/table1_figures.py",
             "r.commit_key == rr.row_key(best.commit)", "r.commit == best.commit", (REPORT,)),
    Mutation("train.compile_mode never reaches torch.compile", "pipeline/training/train.py",
             "torch.compile(stack, mode=cfg.compile_mode)", "torch.compile(stack)",
             ("tests/test_train.py::test_the_compile_mode_reaches_torch_compile_and_is_not_part_of_the_checkpoint_key",)),
    Mutation("bmm with a transposed kernel", "pipeline/training/stack.py",
             "out = conv.weight.flatten(1) @ cols", "out = conv.weight.transpose(2, 3).flatten(1) @ cols", (STACK,)),
    Mutation("the bmm layout runs the grouped convolutions", "pipeline/training/stack.py",
             'convs_as_matmul(copy.deepcopy(models[0])) if layout == "bmm" else models[0]',
             'models[0] if layout == "bmm" else models[0]', (STACK,)),
    Mutation("train.stack_layout never reaches the stack", "pipeline/training/train.py",
             "SeedStack(models, loss_recipe(cfg), cfg.stack_layout)", "SeedStack(models, loss_recipe(cfg))",
             ("tests/test_stack.py::test_the_bmm_layout_trains_as_separate_runs",)),
    Mutation("Table 1's shifts one pixel short (training computes something else)", "pipeline/data/transforms.py",
             "torch.randint(-max_shift, max_shift + 1, (b, 2)", "torch.randint(-max_shift, max_shift, (b, 2)",
             (FINGERPRINT,)),
    # --- the capturable step (train.cuda_graph, #37) against the eager step ---
    Mutation("the captured step's learning rate frozen at its first value", "pipeline/training/steps.py",
             "self.lr.copy_(self.lr_table.index_select(0, self.global_step.view(1)).squeeze(0))",
             "self.lr.copy_(self.lr_table[0])", (CAPTURED,)),
    Mutation("the captured step draws every seed from one generator", "pipeline/training/steps.py",
             "draw_step(self.exp, self.stack, self.order_rows, self.step, self.generators)",
             "draw_step(self.exp, self.stack, self.order_rows, self.step, [self.generators[0]] * len(self.generators))",
             (CAPTURED,)),
    Mutation("the captured step's order buffer not refreshed at an epoch", "pipeline/training/steps.py",
             "            torch.stack(orders, out=self.orders)\n", "            pass\n", (CAPTURED,)),
    Mutation("the captured step's counter not advanced", "pipeline/training/steps.py",
             "        self.step.add_(1)\n", "", (CAPTURED,)),
    Mutation("the captured step's global counter not set at an epoch (a resume restarts the schedule)",
             "pipeline/training/steps.py", "self.global_step.fill_(epoch * self.steps_per_epoch)",
             "self.global_step.add_(0)", (CAPTURED,)),
    Mutation("Adam reads its float learning rate, not the captured step's", "pipeline/training/steps.py",
             "with tensor_lr(self.optimizer, self.lr):", "with contextlib.nullcontext():", (CAPTURED,)),
    Mutation("the scheduler left behind the captured step", "pipeline/training/steps.py",
             "        self.scheduler.step()\n", "        pass\n", (CAPTURED,)),
    Mutation("a step's loss parts overwrite the epoch's, not summed", "pipeline/training/steps.py",
             "self.sums.add_(parts)", "self.sums.copy_(parts)", (TALLY,)),
    Mutation("a later non-finite step overwrites the first", "pipeline/training/steps.py",
             "& (self.first_bad < 0)  # (S,)", "  # (S,)", (TALLY,)),
    Mutation("train.cuda_graph never reaches the loop", "pipeline/training/train.py",
             "    if not cfg.cuda_graph:\n", "    if True:\n", (CAPTURED,)),
    Mutation("a failed capture goes on with the generators it moved", "pipeline/training/steps.py",
             "                generator.set_state(state)\n", "                pass\n",
             ("tests/test_steps.py::test_a_failed_capture_says_so_and_trains_on_uncaptured_from_the_same_state",)),
    Mutation("Table 1's batch ignores the step's place in the order", "pipeline/experiments/table1.py",
             "idx = order[step * self.batch_size + self.offsets]", "idx = order[step + self.offsets]",
             ("tests/test_steps.py::test_a_batch_drawn_for_a_device_counter_is_the_batch_drawn_for_the_step",)),
    Mutation("a seed trained with settings the CUDA tests fail is evaluated as it is", "scripts/gpu_session.sh",
             '  if [ $status = 0 ]; then proofs "$variant" "$seeds" || return $?; fi\n', "",
             (WINDOW + "::test_the_cuda_tests_run_beside_the_first_jobs_and_a_seed_they_do_not_prove_trains_again",)),
    Mutation("the CUDA tests hold back the window's first jobs", "scripts/gpu_session.sh",
             "  cuda_tests &\n", "  cuda_tests\n",
             (WINDOW + "::test_the_cuda_tests_run_beside_the_first_jobs_and_a_seed_they_do_not_prove_trains_again",)),
    Mutation("a model whose profile mode fails its CUDA tests keeps that mode", "scripts/gpu_levers.py",
             "    if ok:\n        return None, f\"{model}: {why}; the profile's {mode} stays\"",
             "    if True:\n        return None, f\"{model}: {why}; the profile's {mode} stays\"",
             ("tests/test_profiles.py::test_gpu_levers_picks_the_fastest_mode_its_cuda_tests_prove",)),
    Mutation("an fp32 run's evaluation on CUDA convolves in TF32 (torch's default)", "pipeline/stages/evaluate.py",
             "    configure_precision(cfg, device)  # evaluated in the precision it trained in\n", "",
             ("tests/test_wiring.py::test_the_evaluate_stage_runs_the_model_in_the_precision_it_trained_in",)),
    Mutation("an fp32 run on CUDA convolves in TF32 (torch's default)", "pipeline/training/train.py",
             "        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.tf32\n", "",
             ("tests/test_wiring.py::test_tf32_is_on_only_where_train_tf32_says",)),
    Mutation("a TF32 run reads as fp32 in the report", "pipeline/core/protocol.py",
             'if "tf32" not in cfg:', 'if cfg.get("tf32"):',
             ("tests/test_report.py::test_run_provenance_shows_what_each_run_recorded_and_nothing_else",)),
    Mutation("the gpu levers pick a captured mode the bench ran uncaptured", "scripts/gpu_levers.py",
             'return "the bench ran it uncaptured"', "pass",
             ("tests/test_profiles.py::test_gpu_levers_picks_the_fastest_mode_its_cuda_tests_prove",)),
    Mutation("the gpu levers pick a mode no CUDA test proves", "scripts/gpu_levers.py",
             "    for prefix in PROOFS[mode]:", "    for prefix in []:",
             ("tests/test_profiles.py::test_gpu_levers_picks_the_fastest_mode_its_cuda_tests_prove",)),
    Mutation("a stacked job is priced as one seed", "scripts/gpu_queue.py",
             "images = seeds * train[\"epochs\"]", "images = train[\"epochs\"]", (WINDOW,)),
    Mutation("a job is priced at MNIST's image size whatever its experiment's", "scripts/gpu_queue.py",
             "* (registry.entry(experiment).image_size / MNIST_SIDE) ** 2", "",
             ("tests/test_gpu_window.py::test_the_estimate_is_the_bench_row_of_the_settings_the_job_trains_with",)),
    Mutation("a job's estimate ignores the processes sharing the GPU", "scripts/gpu_queue.py",
             "(row[\"train_images_per_s\"] / parallel)", "row[\"train_images_per_s\"]", (WINDOW,)),
    Mutation("a job that does not fit the window never starts with its first seeds", "scripts/gpu_queue.py",
             "else range(len(seeds), 0, -1):", "else range(len(seeds), len(seeds) - 1, -1):", (WINDOW,)),
    Mutation("a job the last call stopped is estimated afresh instead of resumed", "scripts/gpu_queue.py",
             "if set(stopped) <= set(seeds):", "if False:", (WINDOW,)),
    Mutation("the bench table puts stacked aggregates where the costs read one seed's speed", "scripts/bench_table.py",
             'lines.append(f"| stacked {label(r)}', 'lines.append(f"| capsnet-repro {label(r)}', (WINDOW,)),
    Mutation("a CNN job is priced at the compiled row it does not train with", "scripts/gpu_levers.py",
             "compiled = train[\"compile\"] and (model == \"capsnet\" or train.get(\"compile_cnns\", True))",
             "compiled = train[\"compile\"]", (WINDOW,)),
    Mutation("a window benches again what an earlier one on its GPU model benched", "scripts/gpu_session.sh",
             '&& cp "$kept" logs/bench/ &&', "&& true &&", (WINDOW,)),
    Mutation("benching never yields to training", "scripts/gpu_session.sh",
             '-ge "$BENCH_BUDGET" ]', "-ge 999999 ]", (WINDOW,)),
    Mutation("the fingerprint hashes the first seed only", "pipeline/training/fingerprint.py",
             "for k, model in enumerate(models):", "for k, model in enumerate(models[:1]):", (FINGERPRINT,)),
    Mutation("the fingerprint leaves the process on one thread", "pipeline/training/fingerprint.py",
             "        torch.set_num_threads(threads)\n", "        pass\n", (FINGERPRINT,)),
    Mutation("the fingerprint draws from the caller's random stream", "pipeline/training/fingerprint.py",
             "with torch.random.fork_rng(devices=[]), one_thread()", "with one_thread()", (FINGERPRINT,)),
    Mutation("the train stage records a fingerprint of a fixed family", "pipeline/stages/train.py",
             "fingerprint = training_fingerprint(cfg)",
             "fingerprint = training_fingerprint(dataclasses.replace(cfg, max_shift=0))", (FINGERPRINT,)),
    Mutation("the fingerprint runs on the host's ATen kernels", "pipeline/training/fingerprint.py",
             'CAPPED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}', 'CAPPED = {"MKL_CBWR": "COMPATIBLE"}',
             (f"{FINGERPRINT}::test_the_hosts_kernels_do_not_reach_it",)),
    Mutation("the fingerprint runs on the host's MKL GEMM", "pipeline/training/fingerprint.py",
             'CAPPED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}', 'CAPPED = {"ATEN_CPU_CAPABILITY": "avx2"}',
             (f"{FINGERPRINT}::test_the_hosts_kernels_do_not_reach_it",)),
    Mutation("the fingerprint's MKL GEMM in its Intel-only AVX2 branch", "pipeline/training/fingerprint.py",
             'CAPPED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}', 'CAPPED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}',
             (f"{FINGERPRINT}::test_every_family_computes_what_it_was_pinned_to",)),
    Mutation("the fingerprint's environment says the branch asked for, not the one MKL ran", "pipeline/training/fingerprint.py",
             'return MKL_BRANCHES.get(branch, f"branch {branch}")', 'return "COMPATIBLE"',
             (f"{FINGERPRINT}::test_its_environment_names_the_branch_mkl_itself_reports",)),
    Mutation("the fingerprint's environment leaves out MKL's branch", "pipeline/training/fingerprint.py",
             ' capped, MKL {mkl_branch()}"', ' capped"',
             (f"{FINGERPRINT}::test_every_family_computes_what_it_was_pinned_to",)),
    Mutation("the fingerprint runs on oneDNN's kernels", "pipeline/training/fingerprint.py",
             "    torch.backends.mkldnn.enabled = False  # oneDNN's blocking follows the processor's caches\n", "",
             (f"{FINGERPRINT}::test_every_family_computes_what_it_was_pinned_to",)),
    Mutation("the fingerprint runs in the caller's process, on its kernels", "pipeline/training/fingerprint.py",
             'return in_capped_process([small])["fingerprints"][0]', "return _compute(small)",
             (f"{FINGERPRINT}::test_the_hosts_kernels_do_not_reach_it",)),
    Mutation("the fingerprint's process knows no registered experiment", "pipeline/training/fingerprint.py",
             'for name, module in asked["experiments"].items():', "for name, module in {}.items():", (EXTENSION,)),
    Mutation("the fingerprint writes its checkpoint into a /dev/shm without room", "pipeline/training/fingerprint.py",
             "return SCRATCH if SCRATCH.is_dir() and shutil.disk_usage(SCRATCH).free >= SCRATCH_BYTES else None",
             "return SCRATCH if SCRATCH.is_dir() else None", (FINGERPRINT,)),
    Mutation("a failed fingerprint process's error leaves out why", "pipeline/training/fingerprint.py",
             'why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]', 'why = f"exit {done.returncode}"',
             (f"{FINGERPRINT}::test_a_failed_fingerprint_process_says_why_in_one_line",)),
    Mutation("the GPU queue ignores the fingerprint table", "scripts/gpu_queue.py",
             '    if table is None or config.get("training_fingerprint") is None:\n', "    if True:\n", (QUEUE,)),
    Mutation("the GPU queue carries no record over through the published tables", "scripts/gpu_queue.py",
             "[*published_tables, table]", "[table]", (QUEUE,)),
    Mutation("the window asks the queue without its fingerprint table", "scripts/gpu_plan.sh",
             '[ -s "$FP_TABLE" ] && QUEUE_ARGS=(--fingerprints "$FP_TABLE")', "true",
             (f"{WINDOW}::test_the_window_queues_again_what_other_training_code_published",)),
    # --- the precision check (#36 item 6): the fp32 twin, its queue, its levers, its effect ---
    Mutation("a precision twin trains in its profile's precision", "pipeline/training/train.py",
             '    recipe["amp"] = protocol.amp_of(v.precision, params.train.amp)  # a precision twin\'s own\n', "",
             (f"{PROFILES}::test_the_precision_twin_trains_in_fp32_beside_the_gpu_and_smoke_profiles_bf16_original",)),
    Mutation("a profile adds the precision twin where its original does not train", "pipeline/profiles.py",
             "if original in trained and t not in trained", "if t not in trained",
             (f"{PROFILES}::test_the_precision_twin_trains_in_fp32_beside_the_gpu_and_smoke_profiles_bf16_original",)),
    Mutation("the GPU queue plans the twin in its profile's precision", "pipeline/core/protocol.py",
             '"amp": variant_amp(raw, variant)', '"amp": raw["train"].get("amp", False)', (QUEUE,)),
    Mutation("the GPU queue ignores the published records a later run set aside", "scripts/gpu_queue.py",
             '*sorted(runs.glob(f"{EARLIER}/*/models/{variant}/seed{seed}/config.json"))', "*[]", (QUEUE,)),
    Mutation("the fp32 twin trains with its model's bf16 levers", "scripts/gpu_levers.py",
             'return model if amp == bool(raw["train"].get("amp", False)) else', "return model if True else",
             (f"{PROFILES}::test_the_fp32_twin_trains_with_the_fastest_fp32_mode_its_cuda_tests_prove",)),
    Mutation("the fp32 twin's job is priced at the profile's bf16 rows", "scripts/gpu_queue.py",
             'spec, train = params["variants"][variant], variant_train(params, variant)',
             'spec, train = params["variants"][variant], params["train"]',
             (f"{PROFILES}::test_the_fp32_twin_trains_with_the_fastest_fp32_mode_its_cuda_tests_prove",)),
    Mutation("the precision effect looks for the fp32 twin in the bf16 protocol", "pipeline/experiments/table1_report.py",
             "twins = _by_variant(runs, (*key[:-1], FP32)) if key[-1] == BF16 else {}", "twins = by_variant",
             (f"{REPORT}::test_the_precision_check_compares_bf16_with_its_fp32_twin_across_the_precisions",)),
    Mutation("the precision check allows bf16 whatever its interval", "pipeline/experiments/table1_report.py",
             "within = effect.ci_low <= 0 <= effect.ci_high", "within = True",
             (f"{REPORT}::test_the_precision_check_compares_bf16_with_its_fp32_twin_across_the_precisions",)),
    Mutation("every stage process imports scipy with the report's power analysis", "pipeline/report/power.py",
             "from collections.abc import Callable\n", "from collections.abc import Callable\nfrom scipy import optimize\n",
             (f"{LAYOUT}::test_a_train_or_evaluate_stage_imports_neither_scipy_nor_torchvision",)),
    Mutation("a missing input folder's error no longer says what makes it", "pipeline/cli.py",
             'self.fail(f"folder {str(value)!r} does not exist: {self.made_by}", param, ctx)', "pass",
             ("tests/test_cli.py::test_a_missing_input_folder_names_what_makes_it",)),
    Mutation("train's data folder hint points at the wrong step", "pipeline/cli.py",
             '@click.argument("data_dir", type=PREPARED)\n@click.argument("out_dir", type=click.Path(file_okay=False))\n@click.option("--checkpoint"',
             '@click.argument("data_dir", type=TRAINED)\n@click.argument("out_dir", type=click.Path(file_okay=False))\n@click.option("--checkpoint"',
             ("tests/test_cli.py::test_a_missing_input_folder_names_what_makes_it",)),
    Mutation("reports/metrics pools a variant's protocols and training code", "pipeline/stages/report.py",
             "for name, rows in row_names(runs).items():",
             "for name, rows in {v: [r for r in runs if r.variant == v] for v in dict.fromkeys(r.variant for r in runs)}.items():",
             (f"{REPORT}::test_variant_metrics_never_pool_protocols_or_training_code",)),
    Mutation("a protocol a window has only begun becomes the headline", "pipeline/report/runs.py",
             "key=lambda k: (-counts[k], -k[1], -current[k])", "key=lambda k: -k[1]",
             (f"{REPORT}::test_the_headline_protocol_is_the_one_with_most_runs_then_the_longest_then_the_newest",
              f"{BEGUN}[paper length]")),
    Mutation("of two protocols with as many runs the shorter heads the report", "pipeline/report/runs.py",
             "key=lambda k: (-counts[k], -k[1], -current[k])", "key=lambda k: (-counts[k], -current[k])",
             (f"{REPORT}::test_the_headline_protocol_is_the_one_with_most_runs_then_the_longest_then_the_newest",)),
    Mutation("of two complete protocols the one whose records were displaced heads the report", "pipeline/report/runs.py",
             "key=lambda k: (-counts[k], -k[1], -current[k])", "key=lambda k: (-counts[k], -k[1])",
             (f"{REPORT}::test_the_headline_protocol_is_the_one_with_most_runs_then_the_longest_then_the_newest",)),
    Mutation("§5.2's gap pools a protocol a window has only begun", "pipeline/experiments/affnist_report.py",
             "    runs = headline_runs(runs)\n", "",
             (f"{REPORT}::test_affnist_gap_reads_the_protocol_both_models_have_most_runs_of_and_names_it",
              f"{BEGUN}[compressed]")),
    Mutation("report rows in the order first seen, a begun protocol's among the headline's", "pipeline/report/runs.py",
             "return sorted(group(runs).items(), key=lambda item: order[item[0][1]])", "return list(group(runs).items())",
             (f"{REPORT}::test_affnist_gap_reads_the_protocol_both_models_have_most_runs_of_and_names_it",)),
    Mutation("the README's §5.2 line lists every protocol's rows", "pipeline/experiments/affnist.py",
             "shown = table[table.protocol == g.gap_protocol]", "shown = table",
             (f"{REPORT}::test_affnist_gap_reads_the_protocol_both_models_have_most_runs_of_and_names_it",)),
    Mutation("a claim of another protocol than the headline does not name it", "pipeline/report/claims.py",
             'return claim.ours if claim.protocol == headline else f"{claim.ours}, under {claim.protocol}"', "return claim.ours",
             (f"{REPORT}::test_affnist_gap_reads_the_protocol_both_models_have_most_runs_of_and_names_it",)),
    Mutation("the MultiMNIST column reads the last row of a variant, whatever its protocol", "pipeline/experiments/multimnist_report.py",
             "    for r in multi[multi.protocol == multi.protocol.iloc[0]].itertuples():\n        ours_by_row.setdefault(r.table1_row, r)",
             "    for r in multi.itertuples():\n        ours_by_row[r.table1_row] = r", ("tests/test_multimnist.py::test_the_multimnist_column_reads_its_first_protocols_rows_and_names_it",)),
    Mutation("a one-seed recipe comparison is told to train both recipes at one commit", "pipeline/report/claims.py",
             'first = "both recipes at one commit" if str(e.status).startswith("confounded") else "a second seed of each recipe"',
             'first = "both recipes at one commit"',
             ("tests/test_power.py::test_claims_are_supported_contradicted_or_say_what_would_settle_them",)),
    # --- the docs: every command, link and path they give exists ---
    Mutation("a make target the README names is gone", "Makefile", "ui: venv  ##", "serve: venv  ##", (DOCS,)),
    Mutation("a make target has no line in a bare make's list", "Makefile", "gpu: venv  ## the whole", "gpu: venv  # the whole",
             (DOCS,)),
    Mutation("the README links a page that is not there", "README.md", "[docs/testing.md](docs/testing.md)",
             "[docs/testing.md](docs/tests.md)", (DOCS,)),
    Mutation("the README's mutation count is not the list's", "README.md", "applies 1", "applies 9",
             (DOCS,)),  # the count's first digit: stays valid as mutations are added (100-199)
]


def scratch_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)  # tests that ask git what it ignores need a repo


def run_tests(copy: Path, tests: tuple[str, ...]) -> bool:
    """True when the tests pass (the mutation survives)."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                            cwd=copy, env=env, capture_output=True, text=True)
    return result.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only mutations whose name contains this")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if args.k in m.name]
    if not chosen:  # else the unmutated check below would run the whole suite for nothing
        print(f"no mutation's name contains {args.k!r}", file=sys.stderr)
        return 2
    survived = []
    with tempfile.TemporaryDirectory(prefix="capsnet-mutate-") as tmp:
        copy = Path(tmp)
        scratch_copy(copy)
        if not run_tests(copy, tuple(dict.fromkeys(t for m in chosen for t in m.tests))):
            print("the unmutated copy fails its tests: fix those first", file=sys.stderr)
            return 2
        for m in chosen:
            target = copy / m.path
            original = target.read_text()
            if m.old not in original:
                print(f"STALE    {m.name}: {m.path} no longer contains the line to mutate", file=sys.stderr)
                survived.append(m.name)
                continue
            target.write_text(original.replace(m.old, m.new, 1))
            t0 = time.perf_counter()
            alive = run_tests(copy, m.tests)
            target.write_text(original)
            print(f"{'SURVIVED' if alive else 'caught  '} {m.name} ({time.perf_counter() - t0:.0f} s, {' '.join(m.tests)})",
                  flush=True)
            if alive:
                survived.append(m.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutations caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
