"""A threaded pipeline: a producer fills a bounded queue, workers square the items under a
lock, meet at a barrier, and one of them publishes the mean.

threaded.py is the plain `threading` version and spindled.py the same program on Spindle
objects: the lines marked "port:" are the only ones that differ.
"""

from spindle import Thread  # port: each thread runs as a cloud function
from spindle import Barrier, Condition, Lock, Queue  # port: Spindle's drop-in objects

from spindle import Dict as SharedDict  # port: a dict that lives in the server

N_WORKERS = 4
N_ITEMS = 500


def worker(tasks, results, lock, barrier, start, state):
    with start:
        start.wait_for(lambda: state["go"])
    while True:
        item = tasks.get()
        if item is None:
            tasks.task_done()
            break
        with lock:
            results["sum"] = results["sum"] + item * item
            results["count"] = results["count"] + 1
        tasks.task_done()
    if barrier.wait() == 0:  # exactly one worker (arrival index 0) publishes the mean
        with lock:
            results["mean"] = results["sum"] / results["count"]
    barrier.wait()
    with lock:
        if "mean" in results:
            results["saw_mean"] = results["saw_mean"] + 1


def main():
    tasks = Queue(16)
    results = SharedDict(sum=0, count=0, saw_mean=0)
    state = SharedDict(go=False)
    lock = Lock()
    barrier = Barrier(N_WORKERS)
    start = Condition()
    threads = [
        Thread(target=worker, args=(tasks, results, lock, barrier, start, state))
        for _ in range(N_WORKERS)
    ]
    for t in threads:
        t.start()
    with start:
        state["go"] = True
        start.notify_all()
    for item in range(1, N_ITEMS + 1):
        tasks.put(item)
    for _ in threads:
        tasks.put(None)
    tasks.join()
    for t in threads:
        t.join()
    print(f"items={results['count']} sum={results['sum']}")
    print(f"mean={results['mean']:.4f} saw_mean={results['saw_mean']}")


if __name__ == "__main__":
    main()
