"""A bank account object deposited into from an executor's threads. With threads the
deposits land in the one object; as cloud functions each call changes a copy of it, which
Spindle must say (spindle.LostUpdateWarning) rather than print a wrong balance silently."""

import threading
from concurrent.futures import ThreadPoolExecutor


class Account:
    def __init__(self):
        self.balance = 0
        self.lock = threading.Lock()

    def deposit(self, amount):
        with self.lock:
            self.balance += amount


def main():
    account = Account()
    with ThreadPoolExecutor(max_workers=4) as executor:
        for _ in range(100):
            executor.submit(account.deposit, 10)
    print(f"balance: {account.balance}")


if __name__ == "__main__":
    main()
