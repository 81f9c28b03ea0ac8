"""Check numbers for primality with a ProcessPoolExecutor (the concurrent.futures
documentation's example, with smaller numbers)."""

from spindle import concurrent
import math

PRIMES = [
    1_000_003,
    1_000_033,
    1_000_037,
    1_000_039,
    1_000_081,
    999_999_999_989,
    999_999_999_991,
    1_000_000_007 * 3,
]


def is_prime(n):
    if n < 2:
        return False
    if n == 2:
        return True
    if n % 2 == 0:
        return False
    sqrt_n = int(math.floor(math.sqrt(n)))
    for i in range(3, sqrt_n + 1, 2):
        if n % i == 0:
            return False
    return True


def main():
    with concurrent.futures.ProcessPoolExecutor() as executor:
        for number, prime in zip(PRIMES, executor.map(is_prime, PRIMES)):
            print("%d is prime: %s" % (number, prime))


if __name__ == "__main__":
    main()
