"""A daemon worker thread consumes a queue; the main thread waits with q.join() (the queue
documentation's example; the worker hands its results back on a second queue rather than
printing them, so that the output's order is the same in every run)."""

import queue
import threading

q = queue.Queue()
results = queue.Queue()


def worker():
    while True:
        item = q.get()
        results.put(f"Finished {item}: {item * item}")
        q.task_done()


def main():
    threading.Thread(target=worker, daemon=True).start()
    for item in range(30):
        q.put(item)
    q.join()
    finished = [results.get() for _ in range(30)]
    print("\n".join(finished))
    print("All work completed")


if __name__ == "__main__":
    main()
