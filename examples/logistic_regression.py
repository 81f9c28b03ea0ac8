"""Logistic regression by gradient descent, gradients aggregated in the server (seed §3.4.2).

`--threads` cloud threads each generate their own fragment of the labelled data, then, at
every epoch:

* read the current weights (one `Array.get`);
* compute the gradient and the log loss of their fragment;
* add both to shared `Array`s (the sums build up in the server, no reduce phase);
* wait on a `Barrier` whose action, run by the last thread to arrive, takes the gradient
  step on the shared weights and records the epoch's loss.

`--local` runs the same full-batch gradient descent in one NumPy process on the same data.

    spindle run examples/logistic_regression.py [--samples 500000] [--features 50] [--epochs 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import numpy as np

import spindle


@dataclass(frozen=True)
class Problem:
    samples: int
    features: int
    parts: int  # the data is generated as this many fragments, one per thread
    seed: int


def true_weights(p: Problem) -> np.ndarray:
    return np.random.default_rng([p.seed, 0]).normal(0, 2 / np.sqrt(p.features), p.features + 1)


def fragment(p: Problem, part: int) -> tuple[np.ndarray, np.ndarray]:
    """Fragment `part`: features (a last column of ones for the bias) and 0/1 labels."""
    bounds = np.linspace(0, p.samples, p.parts + 1).astype(int)
    rng = np.random.default_rng([p.seed, 1, part])
    n = bounds[part + 1] - bounds[part]
    x = np.hstack([rng.standard_normal((n, p.features)), np.ones((n, 1))])
    y = (rng.random(n) < sigmoid(x @ true_weights(p))).astype(np.float64)
    return x, y


def dataset(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    parts = [fragment(p, i) for i in range(p.parts)]
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def partial_gradient(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """The sum over a fragment of the log loss's gradient, and the sum of the log loss."""
    z = x @ w
    loss = float(np.sum(np.logaddexp(0.0, z) - y * z))
    return x.T @ (sigmoid(z) - y), loss


@dataclass(frozen=True)
class Shared:
    weights: spindle.Array   # read by every thread at each epoch
    gradient: spindle.Array  # partial gradients added in the server
    loss: spindle.Array      # (1,): partial losses added in the server
    history: spindle.List    # [mean loss, time] per epoch
    start: spindle.Barrier   # everyone generated its fragment: the clock starts
    step: spindle.Barrier    # everyone added its gradient: take the step


def make_shared(p: Problem, rate: float) -> Shared:
    weights, gradient = spindle.Array(p.features + 1), spindle.Array(p.features + 1)
    loss, history = spindle.Array(1), spindle.List()

    def descend() -> None:  # the barrier's action: once per epoch, in the last thread
        weights.set(weights.get() - rate * gradient.get() / p.samples)
        history.append([float(loss.get()[0]) / p.samples, time.time()])
        gradient.fill(0), loss.fill(0)

    start = spindle.Barrier(p.parts, action=lambda: history.append([None, time.time()]))
    return Shared(weights, gradient, loss, history, start, spindle.Barrier(p.parts, action=descend))


def train_thread(p: Problem, part: int, epochs: int, s: Shared) -> None:
    """One cloud thread: its fragment, `epochs` times."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # one core per thread, like one function per vCPU
        x, y = fragment(p, part)
        s.start.wait()
        for _ in range(epochs):
            gradient, loss = partial_gradient(x, y, s.weights.get())
            s.gradient.add(gradient)  # aggregated in the server
            s.loss.add(loss)
            s.step.wait()             # the last to arrive updates the weights


def run_spindle(p: Problem, epochs: int, rate: float) -> tuple[list[float], list[float]]:
    """Train on cloud threads; return the loss and the end time (from the start) of each epoch."""
    s = make_shared(p, rate)
    threads = [spindle.Thread(target=train_thread, args=(p, i, epochs, s), name=f"logreg-{i}")
               for i in range(p.parts)]
    for t in threads:
        t.start()
    shown = 1
    while any(t.is_alive() for t in threads):  # report progress from the shared history
        shown = report(s.history.copy(), shown)
        time.sleep(0.2)
    for t in threads:
        t.join()
    history = s.history.copy()
    report(history, shown)
    t0 = history[0][1]
    return [h[0] for h in history[1:]], [h[1] - t0 for h in history[1:]]


def report(history: list, shown: int) -> int:
    t0 = history[0][1] if history else 0.0
    for i in range(shown, len(history)):
        print(f"  epoch {i}: loss {history[i][0]:.6f} at {history[i][1] - t0:.2f} s",
              file=sys.stderr, flush=True)
    return max(shown, len(history))


def run_local(p: Problem, epochs: int, rate: float) -> tuple[list[float], list[float]]:
    """The same gradient descent in one NumPy process on one core: the baseline."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        x, y = dataset(p)
        w = np.zeros(p.features + 1)
        losses, times, t0 = [], [], time.perf_counter()
        for epoch in range(epochs):
            gradient, loss = partial_gradient(x, y, w)
            w = w - rate * gradient / p.samples
            losses.append(loss / p.samples)
            times.append(time.perf_counter() - t0)
            print(f"  epoch {epoch + 1}: loss {losses[-1]:.6f} at {times[-1]:.2f} s",
                  file=sys.stderr, flush=True)
    return losses, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=500_000)
    ap.add_argument("--features", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2, help="cloud threads (= data fragments)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--rate", type=float, default=2.0, help="learning rate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--local", action="store_true", help="one NumPy process instead of threads")
    ap.add_argument("--json", action="store_true", help="also print the result as JSON")
    args = ap.parse_args()

    p = Problem(args.samples, args.features, args.threads, args.seed)
    mode = "1 NumPy process" if args.local else f"{p.parts} cloud threads"
    print(f"logistic regression: {p.samples:,} samples x {p.features} features, {mode}",
          file=sys.stderr)
    start = time.perf_counter()
    if args.local:
        losses, times = run_local(p, args.epochs, args.rate)
    else:
        spindle.connect()
        losses, times = run_spindle(p, args.epochs, args.rate)
    total = time.perf_counter() - start

    print(f"{len(losses)} epochs: loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"{times[-1] / len(times):.3f} s per epoch, {total:.2f} s in all ({mode})")
    if args.json:
        print(json.dumps({"loss": losses, "times": times, "total": total,
                          "threads": p.parts, "local": args.local}))


if __name__ == "__main__":
    main()
