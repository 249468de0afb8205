"""simulate's arguments, its reader of the user's DeepSpeed config, and its search of zero_optimization sizes: every
bad value stops the command with one line before an engine is built, and the search (a pure function of a fake
``measure`` here) keeps the fastest settings that fit the GPU and ran cleanly, within its budget."""
import json

import pytest

from deepspeed_zeropp import cli
from deepspeed_zeropp.simulate import config, runner, search, world

PREFETCH, REDUCE, HPZ = "stage3_prefetch_bucket_size", "reduce_bucket_size", config.HPZ


@pytest.fixture
def nothing_built(monkeypatch):
    """Any attempt to start the world or build an engine fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("an engine was about to be built")

    monkeypatch.setattr(world, "install", refuse)
    monkeypatch.setattr(runner, "build", refuse)


def simulate(*argv):
    return cli.main(["simulate", "--model", "tiny", "--device", "cpu", *argv])


@pytest.mark.parametrize("argv, message", [
    (["--reps", "0"], "--reps 0: accepted: an integer >= 1"),
    (["--steps", "0"], "--steps 0: accepted: an integer >= 1"),
    (["--steps", "-1"], "--steps -1: accepted: an integer >= 1"),
    (["--micro-batch", "0"], "--micro-batch 0: accepted: an integer >= 1"),
    (["--vocab", "0"], "--vocab 0: accepted: an integer >= 1"),
    (["--seq", "0"], "--seq 0: accepted: an integer >= 1"),
    (["--width", "0"], "--width 0: accepted: an integer >= 1"),
    (["--heads", "0"], "--heads 0: accepted: an integer >= 1"),
    (["--layers", "0"], "--layers 0: accepted: an integer >= 1"),
    (["--warmup", "-2"], "--warmup -2: accepted: an integer >= 0"),
    (["--reuse-distance", "-1"], "--reuse-distance -1: accepted: an integer >= 0"),
    (["--heads", "3", "--width", "64"], "--width 64 --heads 3: the width is split evenly over the attention heads; "
     "accepted: a --width that --heads divides"),
    (["--heads", "3"], "--width 64 (--model tiny's) --heads 3"),
    (["--nodes", "0"], "--nodes 0: accepted: an integer >= 1"),
    (["--gpus-per-node", "0"], "--gpus-per-node 0: accepted: an integer >= 1"),
    (["--gpus-per-node", "1", "--nodes", "1"], "a world of 1 rank; accepted: 2 or more ranks"),
    (["--inter-gbps", "-5"], "--inter-gbps -5: accepted: link speeds > 0 Gbit/s"),
    (["--inter-gbps", "0"], "--inter-gbps 0: accepted: link speeds > 0 Gbit/s"),
    (["--inter-gbps", "100", "0"], "--inter-gbps 0: accepted: link speeds > 0 Gbit/s"),
    (["--intra-gbps", "0"], "--intra-gbps 0: accepted: a link speed > 0 Gbit/s"),
    (["--intra-gbps", "-1"], "--intra-gbps -1: accepted: a link speed > 0 Gbit/s"),
    (["--inter-alpha-us", "-1"], "--inter-alpha-us -1: accepted: a latency >= 0 us"),
    (["--search", "--budget-minutes", "0"], "--budget-minutes 0: accepted: minutes > 0"),
    (["--search", "--gpu-memory-gib", "-1"], "--gpu-memory-gib -1: accepted: GiB > 0"),
    (["--budget-minutes", "5"], "--budget-minutes 5: accepted with --search only"),
    (["--gpu-memory-gib", "80"], "--gpu-memory-gib 80: accepted with --search only"),
    (["--search", "--grid", "bogus=1"], "--grid bogus=1: 'bogus' is not a knob"),
    (["--search", "--grid", "reduce_bucket_size=big"], "--grid reduce_bucket_size=big: accepted: KEY=V,V"),
    (["--search", "--grid", "reduce_bucket_size=1.5"], "whole numbers >= 0, or auto"),
    (["--search", "--grid", "stage3_max_live_parameters=auto"], "auto is the HF Trainer's value of"),
    (["--search", "--grid", f"{HPZ}=3"], f"--grid {HPZ}=3: accepted: divisors > 1 of --gpus-per-node 8"),
    (["--deepspeed-config", "/no/such/ds.json"], "--deepspeed-config /no/such/ds.json: cannot be read"),
])
def test_every_bad_argument_stops_before_an_engine_is_built(argv, message, nothing_built, capsys):
    assert simulate(*argv) == 2
    out = capsys.readouterr().out
    errors = [line for line in out.splitlines() if line.startswith("[simulate] error:")]
    assert len(errors) == 1 and message in errors[0], out


def write(tmp_path, content):
    path = tmp_path / "ds.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_config_resolves_the_hf_trainers_auto_values(tmp_path):
    path = write(
        tmp_path, {
            "train_micro_batch_size_per_gpu": 8,
            "zero_optimization": {
                "stage": 3,
                "reduce_bucket_size": "auto",
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto",
                "stage3_max_live_parameters": 5e8,
                "overlap_comm": True,
                "zero_quantized_weights": True,
            }
        })
    user = config.read(path, 2048)
    assert user.buckets == {
        REDUCE: 2048 * 2048,
        PREFETCH: int(0.9 * 2048 * 2048),
        "stage3_param_persistence_threshold": 20480,
        "stage3_max_live_parameters": 500_000_000,
    }
    assert user.micro_batch == 8 and user.other == {"overlap_comm": True}
    assert user.zeropp == {"zero_quantized_weights": True}
    assert config.read(write(tmp_path, {
        "train_micro_batch_size_per_gpu": "auto",
        "zero_optimization": {
            "stage": 3
        }
    }), 64).micro_batch is None


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not JSON (Expecting property name enclosed in double quotes at line 1"),
    ([1, 2], "holds a JSON list; accepted: a JSON object"),
    ({
        "train_batch_size": 8
    }, "has no zero_optimization object"),
    ({
        "zero_optimization": {
            "stage": 2
        }
    }, "zero_optimization.stage is 2; accepted: 3"),
    ({
        "zero_optimization": {
            "stage": True
        }
    }, "zero_optimization.stage is true; accepted: 3"),
    ({
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": "big"
        }
    }, 'zero_optimization.reduce_bucket_size is "big"; accepted: a whole number >= 0 or "auto"'),
    ({
        "zero_optimization": {
            "stage": 3,
            "stage3_max_live_parameters": "auto"
        }
    }, 'stage3_max_live_parameters is "auto"; accepted: a whole number >= 0'),
    ({
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": -1
        }
    }, "reduce_bucket_size is -1"),
    ({
        "zero_optimization": {
            "stage": 3,
            "zero_quantized_weights": "yes"
        }
    }, 'zero_quantized_weights is "yes"; accepted: true or false'),
    ({
        "train_micro_batch_size_per_gpu": 0,
        "zero_optimization": {
            "stage": 3
        }
    }, "train_micro_batch_size_per_gpu is 0; accepted: a whole number >= 1"),
])
def test_config_that_cannot_be_used_is_named(tmp_path, content, message, nothing_built, capsys):
    path = write(tmp_path, content)
    with pytest.raises(ValueError) as raised:
        config.read(path, 64)
    assert message in str(raised.value)
    assert simulate("--deepspeed-config", path) == 2
    errors = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[simulate] error:")]
    assert errors == [f"[simulate] error: --deepspeed-config {path}: {raised.value}"]


def test_config_missing_file():
    with pytest.raises(ValueError, match="cannot be read"):
        config.read("/no/such/ds.json", 64)


def test_the_users_sizes_reach_the_engine_config(tmp_path):
    unquantized, hpz = runner.CONFIGS["unquantized"], runner.CONFIGS["ours-qwz-qgz-hpz"]
    topology, shape = world.Topology(16, 8), runner.models.SHAPES["tiny"]
    zero = runner.ds_config(unquantized, shape, topology, 4, None)["zero_optimization"]
    assert zero == dict(config.hf_auto(64), stage=3)
    zero = runner.ds_config(unquantized, shape, topology, 4, None, buckets={REDUCE: 7, HPZ: 2})["zero_optimization"]
    assert zero == {"stage": 3, REDUCE: 7}  # no hpZ size for a configuration without hpZ
    zero = runner.ds_config(hpz, shape, topology, 4, None, 0, buckets={HPZ: 2})["zero_optimization"]
    assert zero[HPZ] == 2 and zero["zero_quantized_gradients"] and zero["stage3_max_reuse_distance"] == 0


def test_hpz_that_would_never_read_its_copy_is_left_out_up_front():
    topology = world.Topology(4, 2)
    keys = ("unquantized", "ours-qwz-qgz-hpz")
    kept, left_out = runner.available(keys, topology, "cpu", runner.models.SHAPES["tiny"])
    assert kept == ["unquantized"] and "--reuse-distance 0 measures hpZ" in left_out["ours-qwz-qgz-hpz"]
    assert runner.available(keys, topology, "cpu", runner.models.SHAPES["tiny"], 0)[0] == list(keys)
    assert runner.available(keys, topology, "cpu", runner.models.SHAPES["gpt-1.4b"])[0] == list(keys)


# -- the search, on a fake measure --

GRID = ((PREFETCH, (100, 200, 300), False), (REDUCE, (10, 20), False), (HPZ, (2, 4, 8), True))
START = {PREFETCH: 100, REDUCE: 10}


class Fake:
    """measure() from a formula: step ms of a candidate per link, memory, and the calls made."""

    def __init__(self, ms, memory=lambda c: None, problems=lambda c: (), seconds=10.0, links=("slow", )):
        self.ms, self.memory, self.problems, self.seconds, self.links = ms, memory, problems, seconds, links
        self.calls = []

    def __call__(self, candidates):
        self.calls.append(candidates)
        return {
            c:
            search.Result({link: [self.ms(c, link)] * 2
                           for link in self.links}, self.memory(c), self.seconds, self.problems(c), len(self.calls))
            for c in candidates
        }


def settings(candidate):
    return dict(candidate.settings)


def quantized_gains_from_prefetch(c, link="slow"):
    s = settings(c)
    base = 1000 if c.key == "unquantized" else 800
    gain = 0 if c.key == "unquantized" else {100: 0, 200: 300, 300: 200}[s[PREFETCH]]
    return base - gain - (5 if s[REDUCE] == 20 else 0) - (10 if s.get(HPZ) == 4 else 0)


def test_search_finds_the_best_of_each_knob():
    fake = Fake(quantized_gains_from_prefetch)
    outcome = search.search(["ours-qwz-qgz", "ours-qwz-qgz-hpz"], START, GRID, ["slow"], fake)
    answer, = outcome.answers
    assert answer.best.key == "ours-qwz-qgz-hpz" and settings(answer.best) == {PREFETCH: 200, REDUCE: 20, HPZ: 4}
    assert answer.baseline == search.Candidate.of("unquantized", START)
    assert settings(answer.tuned_unquantized) == {PREFETCH: 100, REDUCE: 20}
    assert search.ratio(answer, answer.baseline, answer.best) == (1000 / 485, 1000 / 485, 1000 / 485)
    assert answer.interleaved and outcome.unexplored == () and outcome.rejected == ()
    # first the user's sizes, each decision within one call, the finalists side by side at the end
    assert fake.calls[0] == [
        search.Candidate.of(k, START) for k in ("unquantized", "ours-qwz-qgz", "ours-qwz-qgz-hpz")
    ]
    for call in fake.calls[1:-1]:
        assert len({c.key for c in call}) == 1
    assert set(fake.calls[-1]) == set(answer.finalists)


def test_hpz_sizes_only_for_hpz_configurations():
    fake = Fake(quantized_gains_from_prefetch)
    search.search(["ours-qwz-qgz", "ours-qwz-qgz-hpz"], START, GRID, ["slow"], fake)
    assert all(HPZ not in settings(c) or c.key == "ours-qwz-qgz-hpz" for call in fake.calls for c in call)
    hpz_calls = [call for call in fake.calls[1:-1] if any(HPZ in settings(c) for c in call)]
    assert len(hpz_calls) == 1 and sorted(settings(c)[HPZ] for c in hpz_calls[0]) == [2, 4, 8]
    assert {c.key for c in hpz_calls[0]} == {"ours-qwz-qgz-hpz"}


def test_settings_that_do_not_fit_the_gpu_are_never_kept():
    fake = Fake(quantized_gains_from_prefetch, memory=lambda c: 90.0 if settings(c).get(PREFETCH) == 200 else 60.0)
    outcome = search.search(["ours-qwz-qgz"], START, GRID, ["slow"], fake, memory_gb=80)
    answer, = outcome.answers
    assert settings(answer.best)[PREFETCH] == 300
    assert outcome.rejected and all("does not fit 80 GiB" in why for why in outcome.rejected)


def test_runs_that_are_not_valid_are_never_kept():
    fake = Fake(quantized_gains_from_prefetch,
                problems=lambda c: ("no 4-bit all-to-all", ) if c.key != "unquantized" else ())
    outcome = search.search(["ours-qwz-qgz"], START, GRID, ["slow"], fake)
    assert outcome.answers[0].best.key == "unquantized"
    assert any("not valid: no 4-bit all-to-all" in why for why in outcome.rejected)


def test_unquantized_stays_the_answer_where_it_is_fastest():

    def ms(c, link):
        return quantized_gains_from_prefetch(c) + (0 if c.key == "unquantized" else 1000)

    answer, = search.search(["ours-qwz-qgz"], START, GRID, ["slow"], Fake(ms)).answers
    assert answer.best.key == "unquantized"
    zero = search.block(answer.best, 8)["zero_optimization"]
    assert zero["stage"] == 3 and not any(k.startswith("zero_quantized") or k == HPZ for k in zero)


def test_the_budget_stops_exploring_and_says_what_was_left():
    fake = Fake(quantized_gains_from_prefetch, seconds=10.0)
    # 3 runs at the user's sizes (30 s), then the prefetch knob for unquantized (3 runs) fits with the finalists
    # (2 runs at most); the next group would not
    outcome = search.search(["ours-qwz-qgz"], START, GRID, ["slow"], fake, budget_s=90)
    assert outcome.unexplored[0] == f"{PREFETCH} for ours qwZ+qgZ"
    assert f"{REDUCE} for unquantized" in outcome.unexplored and len(outcome.unexplored) == 3
    assert outcome.seconds <= 90 and outcome.answers[0].interleaved
    text = search.render(outcome, 8)
    assert "left unexplored (budget)" in text and PREFETCH in text


def test_a_budget_too_small_for_the_finalists_reads_the_groups_figures():
    fake = Fake(quantized_gains_from_prefetch, seconds=10.0)
    outcome = search.search(["ours-qwz-qgz"], START, GRID, ["slow"], fake, budget_s=25)
    answer, = outcome.answers
    assert len(fake.calls) == 1 and not answer.interleaved and answer.best.key == "ours-qwz-qgz"
    assert "not measured side by side" in search.render(outcome, 8)


def test_each_link_gets_its_own_best():

    def ms(c, link):
        s = settings(c)
        if link == "fast":  # the fast link prefers the smallest prefetch bucket
            return 500 + s[PREFETCH] - (0 if c.key == "unquantized" else 100)
        return quantized_gains_from_prefetch(c)

    fake = Fake(ms, links=("slow", "fast"))
    slow, fast = search.search(["ours-qwz-qgz"], START, GRID[:1], ["slow", "fast"], fake).answers
    assert settings(slow.best)[PREFETCH] == 200 and settings(fast.best)[PREFETCH] == 100
    assert all(len(call) == len(set(call)) for call in fake.calls)  # shared candidates measured once per group


def test_the_printed_block_is_json_to_paste(tmp_path):
    user = config.read(write(tmp_path, {"zero_optimization": {"stage": 3, "overlap_comm": True}}), 64)
    outcome = search.search(["ours-qwz-qgz-hpz"], START, GRID, ["slow"], Fake(quantized_gains_from_prefetch))
    text = search.render(outcome, 8, user=user)
    start = text.index('{\n  "zero_optimization"')
    block, _ = json.JSONDecoder().raw_decode(text[start:])
    assert block == {
        "zero_optimization": {
            "overlap_comm": True,
            "stage": 3,
            "zero_quantized_weights": True,
            "zero_quantized_gradients": True,
            HPZ: 4,
            PREFETCH: 200,
            REDUCE: 20,
        }
    }
    assert "against unquantized ZeRO-3 with your config's sizes" in text
    assert "against unquantized ZeRO-3 with tuned sizes" in text and "peak memory not measured (CPU)" in text
    assert "kept from your zero_optimization as they are (not simulated): overlap_comm" in text
    assert json.loads(json.dumps(search.to_json(outcome)))["answers"][0]["best"]["settings"][HPZ] == 4


def test_default_grid_values():
    prefetch, reduce, live, hpz = search.GRID
    assert search.values(prefetch, 2048, 8) == (int(0.9 * 2048**2), 50_000_000, 200_000_000, 600_000_000)
    assert search.values(reduce, 2048, 8) == (2048**2, 500_000_000)
    assert search.values(live, 2048, 8) == (10**9, 3 * 10**9)
    assert search.values(hpz, 2048, 8) == (2, 4, 8) and search.values(hpz, 2048, 1) == ()


def test_tuned_unquantized_is_the_faster_of_yours_and_the_searchs_side_by_side():
    fake = Fake(lambda c, link: 0)

    def ms(c, link):  # the exploring group favours prefetch 200; side by side, the user's sizes are faster
        final = len(fake.calls) > 2
        return 1000 - (100 if settings(c)[PREFETCH] == 200 else 0) * (-1 if final else 1)

    fake.ms = ms
    answer, = search.search([], START, GRID[:1], ["slow"], fake).answers
    assert answer.best == answer.tuned_unquantized == answer.baseline
    assert search.Candidate.of("unquantized", dict(START, **{PREFETCH: 200})) in answer.finalists
