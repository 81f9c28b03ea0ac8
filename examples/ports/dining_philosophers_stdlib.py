"""The dining philosophers: five threads share five forks (locks), each taking the lower
numbered fork first so that no cycle of waits can form; a footman (a semaphore) lets at
most four sit at once. Each philosopher reports its meals on a queue."""

import queue
import threading

PHILOSOPHERS = ["Aristotle", "Kant", "Spinoza", "Marx", "Russell"]
MEALS = 20


def dine(seat, forks, footman, eaten, reports):
    name = PHILOSOPHERS[seat]
    first, second = sorted((seat, (seat + 1) % len(forks)))
    for _ in range(MEALS):
        with footman:
            with forks[first]:
                with forks[second]:
                    eaten.put(name)
    reports.put((name, MEALS))


def main():
    forks = [threading.Lock() for _ in PHILOSOPHERS]
    footman = threading.Semaphore(len(PHILOSOPHERS) - 1)
    eaten, reports = queue.Queue(), queue.Queue()
    diners = [
        threading.Thread(target=dine, args=(seat, forks, footman, eaten, reports))
        for seat in range(len(PHILOSOPHERS))
    ]
    for diner in diners:
        diner.start()
    for diner in diners:
        diner.join()
    for name, meals in sorted(reports.get() for _ in diners):
        print(f"{name} ate {meals} times")
    print(f"meals served: {eaten.qsize()}")
    print(f"forks on the table: {sum(not fork.locked() for fork in forks)}")


if __name__ == "__main__":
    main()
