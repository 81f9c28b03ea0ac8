"""The seed applications in examples/, each run as a real program on small inputs.

Each example runs as a subprocess against the session's server (SPINDLE_ADDRESS), or through
`spindle run`, prints a JSON line with `--json`, and is checked against a local computation
on the same data (imported from the example itself).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def example_module(name: str):
    """Import examples/<name>.py as a module (for its data and its local computation)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run(env: dict, name: str, *args: str, via_spindle_run: bool = False,
        spindle_args: tuple = ()) -> dict:
    """Run an example to its end; return its JSON result line."""
    script = str(EXAMPLES / f"{name}.py")
    if via_spindle_run:
        cmd = [env["SPINDLE_BIN"], "run", *spindle_args, script, *args, "--json"]
    else:
        cmd = [sys.executable, script, *args, "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pi_with_spindle_run(child_env):
    threads, points = 4, 250_000
    result = run(child_env, "pi", "--threads", str(threads), "--points", str(points),
                 via_spindle_run=True)
    n = threads * points
    sigma = 4 * math.sqrt((math.pi / 4) * (1 - math.pi / 4) / n)
    assert result["points"] == n
    assert abs(result["pi"] - math.pi) < 6 * sigma


def test_mandelbrot_png_matches_a_local_computation(child_env, tmp_path):
    from PIL import Image

    mandelbrot = example_module("mandelbrot")
    width, height, max_iter = 120, 90, 60
    out = tmp_path / "m.png"
    run(child_env, "mandelbrot", "--width", str(width), "--height", str(height),
        "--max-iter", str(max_iter), "--tasks", "3", "--band", "7", "-o", str(out))
    pixels = np.asarray(Image.open(out).convert("RGB"))
    assert pixels.shape == (height, width, 3)
    for first in (0, 6, 7, 44, 89):  # band edges and the middle row
        counts = mandelbrot.compute_rows(first, first + 1, width, height, max_iter)
        assert np.array_equal(pixels[first], mandelbrot.colour(counts, max_iter)[0])


@pytest.mark.parametrize("objects", ["shared", "compiled", "array"])
def test_kmeans_matches_numpy_on_the_same_data(child_env, objects):
    # shared: GlobalCentroids/GlobalDelta (@spindle.shared, Listing 5); compiled: the same with
    # GlobalCentroids in WebAssembly (examples/wasm/kmeans.c); array: built-in Arrays.
    args = ["--points", "20000", "--dims", "8", "-k", "5", "--threads", "3",
            "--iterations", "6", "--seed", "7", "--tol", "-1"]  # all 6
    spindled = run(child_env, "kmeans", *args, "--objects", objects)
    local = run(child_env, "kmeans", *args, "--local")
    assert spindled["objects"] == objects
    assert spindled["iterations"] == local["iterations"] == 6
    np.testing.assert_allclose(spindled["inertia"], local["inertia"], rtol=1e-9)
    inertia = spindled["inertia"]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(inertia, inertia[1:]))
    assert inertia[-1] < inertia[0]


def test_kmeans_shared_objects_stop_when_converged(child_env):
    # --tol 0: GlobalDelta reports convergence once no centroid moves; both modes agree.
    args = ["--points", "6000", "--dims", "4", "-k", "3", "--threads", "2",
            "--iterations", "50", "--seed", "3", "--tol", "0"]
    shared = run(child_env, "kmeans", *args, "--objects", "shared")
    local = run(child_env, "kmeans", *args, "--local")
    assert shared["iterations"] == local["iterations"] < 50
    np.testing.assert_allclose(shared["inertia"], local["inertia"], rtol=1e-9)
    # The compiled centroids give the Python class's results bit for bit.
    compiled = run(child_env, "kmeans", *args, "--objects", "compiled")
    assert compiled["inertia"] == shared["inertia"]


def test_logistic_regression_loss_decreases_and_matches_numpy(child_env):
    args = ["--samples", "20000", "--features", "10", "--threads", "2", "--epochs", "8"]
    spindled = run(child_env, "logistic_regression", *args)
    local = run(child_env, "logistic_regression", *args, "--local")
    loss = spindled["loss"]
    assert len(loss) == 8
    assert loss[0] == pytest.approx(math.log(2))
    assert all(b < a for a, b in zip(loss, loss[1:]))
    np.testing.assert_allclose(loss, local["loss"], rtol=1e-9)


def check_santa(result: dict, deliveries: int) -> None:
    assert result["deliveries"] == deliveries
    for kind, members in result["groups"]:
        size = 9 if kind == "reindeer" else 3
        assert len(members) == len(set(members)) == size
        assert all(0 <= m < (9 if kind == "reindeer" else 10) for m in members)


@pytest.mark.parametrize("mode", ["threading", "objects"])
def test_santa_claus_local_threads(child_env, mode):
    check_santa(run(child_env, "santa_claus", "--mode", mode, "--scale", "0.2"), 15)


def test_santa_claus_cloud_threads(child_env):
    # 20 cloud threads need 20 workers at once: an embedded server with room for them.
    env = {k: v for k, v in child_env.items() if k != "SPINDLE_ADDRESS"}
    result = run(env, "santa_claus", "--mode", "cloud", "--scale", "0.2",
                 via_spindle_run=True, spindle_args=("--max-workers", "24"))
    check_santa(result, 15)


def test_wordcount_generated_equals_a_local_counter(child_env):
    wordcount = example_module("wordcount")
    result = run(child_env, "wordcount", "--words", "40000", "--chunks", "4", "--seed", "3")
    expected = Counter()
    for chunk in range(4):
        expected.update(wordcount.words_of(wordcount.generated_chunk(3, chunk, 10_000)))
    assert result["counts"] == dict(expected)
    assert result["total"] == 40_000


def test_wordcount_file_chunks_split_no_word(child_env, tmp_path):
    rng = np.random.default_rng(5)
    vocab = ["spindle", "serverless", "thread", "don't", "Barrier", "a", "objects", "zz"]
    seps = [" ", "  ", "\n", ", ", ". ", "-", "\t", "é"]
    text = "".join(vocab[rng.integers(len(vocab))] + seps[rng.integers(len(seps))]
                   for _ in range(5000))
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    result = run(child_env, "wordcount", str(path), "--chunks", "7")
    expected = Counter(w.lower() for w in re.findall(r"[A-Za-z']+", text))
    assert result["counts"] == dict(expected)


def test_random_forest_through_joblib(child_env):
    result = run(child_env, "random_forest", "--samples", "1500", "--features", "10",
                 "--classes", "3", "--trees", "12")
    assert result["backend"] == "spindle"
    assert result["trees"] == 12
    assert result["accuracy"] > 0.6  # chance is 1/3
