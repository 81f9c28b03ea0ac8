"""Property tests: Spindle objects behave like their standard-library twins under random
sequences of operations (hypothesis; modest example counts keep the suite fast)."""

from __future__ import annotations

import queue

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spindle

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

keys = st.one_of(
    st.integers(-4, 4),
    st.text(alphabet="abc", max_size=2),
    st.tuples(st.integers(0, 2), st.text(alphabet="xy", max_size=1)),
)
values = st.one_of(
    st.none(),
    st.integers(-100, 100),
    st.text(max_size=3),
    st.lists(st.integers(0, 3), max_size=3),
)


def outcome(fn, *args):
    """The result of ``fn(*args)`` or the type of the exception it raised."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # compared by type: messages differ
        return ("raised", type(exc).__name__)


# -- Dict --------------------------------------------------------------------------------

dict_ops = st.one_of(
    st.tuples(st.just("set"), keys, values),
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("getdefault"), keys, values),
    st.tuples(st.just("del"), keys),
    st.tuples(st.just("pop"), keys),
    st.tuples(st.just("popdefault"), keys, values),
    st.tuples(st.just("popitem")),
    st.tuples(st.just("setdefault"), keys, values),
    st.tuples(st.just("contains"), keys),
    st.tuples(st.just("update"), st.lists(st.tuples(keys, values), max_size=3)),
    st.tuples(st.just("len")),
    st.tuples(st.just("clear")),
)


def apply_dict(d, op):
    name, *args = op
    if name == "set":
        d[args[0]] = args[1]
    elif name == "get":
        return d[args[0]]
    elif name == "getdefault":
        return d.get(args[0], args[1])
    elif name == "del":
        del d[args[0]]
    elif name == "pop":
        return d.pop(args[0])
    elif name == "popdefault":
        return d.pop(args[0], args[1])
    elif name == "popitem":
        return d.popitem()
    elif name == "setdefault":
        return d.setdefault(args[0], args[1])
    elif name == "contains":
        return args[0] in d
    elif name == "update":
        d.update(args[0])
    elif name == "len":
        return len(d)
    elif name == "clear":
        d.clear()


@SETTINGS
@given(st.lists(dict_ops, max_size=25))
def test_dict_matches_dict(ops):
    model, proxy = {}, spindle.Dict()
    for op in ops:
        assert outcome(apply_dict, proxy, op) == outcome(apply_dict, model, op), op
    assert list(proxy.items()) == list(model.items())
    assert list(proxy) == list(model)
    assert proxy.values() == list(model.values())


int_keys = st.integers(-20, 20)
sorted_ops = st.one_of(
    st.tuples(st.just("set"), int_keys, st.integers(0, 5)),
    st.tuples(st.just("del"), int_keys),
    st.tuples(st.just("pop"), int_keys),
    st.tuples(st.just("get"), int_keys),
    st.tuples(st.just("range"), st.none() | int_keys, st.none() | int_keys),
    st.tuples(st.just("first")),
    st.tuples(st.just("last")),
    st.tuples(st.just("most_common"), st.none() | st.integers(0, 5)),
)


def apply_sorted(d, op):
    name, *args = op
    if name == "set":
        d[args[0]] = args[1]
        return None
    if name == "del":
        del d[args[0]]
        return None
    if name == "pop":
        return d.pop(args[0])
    if name == "get":
        return d[args[0]]
    if isinstance(d, spindle.SortedDict):
        return getattr(d, name)(*args)
    items = sorted(d.items())
    if name == "range":
        lo, hi = args
        return [(k, v) for k, v in items if (lo is None or k >= lo) and (hi is None or k < hi)]
    if name in ("first", "last"):
        if not items:
            raise KeyError("empty")
        return items[0] if name == "first" else items[-1]
    if name == "most_common":
        ranked = sorted(items, key=lambda kv: (-kv[1], kv[0]))
        return ranked if args[0] is None else ranked[: args[0]]


@SETTINGS
@given(st.lists(sorted_ops, max_size=25))
def test_sorted_dict_matches_a_sorted_dict(ops):
    model, proxy = {}, spindle.SortedDict()
    for op in ops:
        assert outcome(apply_sorted, proxy, op) == outcome(apply_sorted, model, op), op
    assert list(proxy.items()) == sorted(model.items())


# -- List --------------------------------------------------------------------------------

idx = st.integers(-6, 6)
opt_idx = st.none() | idx
step = st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3])
list_ops = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 5)),
    st.tuples(st.just("extend"), st.lists(st.integers(0, 5), max_size=3)),
    st.tuples(st.just("insert"), idx, st.integers(0, 5)),
    st.tuples(st.just("pop"), idx),
    st.tuples(st.just("getitem"), idx),
    st.tuples(st.just("setitem"), idx, st.integers(0, 5)),
    st.tuples(st.just("delitem"), idx),
    st.tuples(st.just("getslice"), opt_idx, opt_idx, step),
    st.tuples(st.just("setslice"), opt_idx, opt_idx, step, st.lists(st.integers(0, 5), max_size=4)),
    st.tuples(st.just("delslice"), opt_idx, opt_idx, step),
    st.tuples(st.just("remove"), st.integers(0, 5)),
    st.tuples(st.just("index"), st.integers(0, 5)),
    st.tuples(st.just("count"), st.integers(0, 5)),
    st.tuples(st.just("contains"), st.integers(0, 5)),
    st.tuples(st.just("reverse")),
    st.tuples(st.just("sort"), st.booleans()),
    st.tuples(st.just("len")),
)


def apply_list(lst, op):
    name, *args = op
    if name == "getitem":
        return lst[args[0]]
    if name == "setitem":
        lst[args[0]] = args[1]
    elif name == "delitem":
        del lst[args[0]]
    elif name == "getslice":
        return list(lst[slice(*args)])
    elif name == "setslice":
        lst[slice(*args[:3])] = args[3]
    elif name == "delslice":
        del lst[slice(*args)]
    elif name == "contains":
        return args[0] in lst
    elif name == "len":
        return len(lst)
    elif name == "sort":
        lst.sort(reverse=args[0])
    else:
        return getattr(lst, name)(*args)


@SETTINGS
@given(st.lists(list_ops, max_size=25))
def test_list_matches_list(ops):
    model, proxy = [], spindle.List()
    for op in ops:
        assert outcome(apply_list, proxy, op) == outcome(apply_list, model, op), op
    assert list(proxy) == model


# -- Counter and Value -------------------------------------------------------------------

I64 = (-(2**63), 2**63 - 1)
big = st.integers(*I64)
counter_ops = st.one_of(
    st.tuples(st.just("add"), st.integers(-1000, 1000) | big),
    st.tuples(st.just("get_and_add"), st.integers(-1000, 1000)),
    st.tuples(st.just("set"), st.integers(-5, 5) | big),
    st.tuples(st.just("compare_and_set"), st.integers(-3, 3), st.integers(-3, 3)),
    st.tuples(st.just("increment")),
    st.tuples(st.just("decrement")),
)


class CounterModel:
    """What a 64-bit Counter must do: Python ints that refuse to leave the range."""

    def __init__(self) -> None:
        self.value = 0

    def _store(self, value: int) -> int:
        if not I64[0] <= value <= I64[1]:
            raise OverflowError("overflow")
        self.value = value
        return value

    def add(self, delta):
        return self._store(self.value + delta)

    def get_and_add(self, delta):
        old = self.value
        self._store(self.value + delta)
        return old

    def set(self, value):
        self._store(value)

    def compare_and_set(self, expected, new):
        if self.value == expected:
            self.value = new
            return True
        return False

    def increment(self):
        return self.add(1)

    def decrement(self):
        return self.add(-1)

    def get(self):
        return self.value


@SETTINGS
@given(st.lists(counter_ops, max_size=25))
def test_counter_matches_a_64_bit_int(ops):
    model, proxy = CounterModel(), spindle.Counter()
    for name, *args in ops:
        assert outcome(getattr(proxy, name), *args) == outcome(getattr(model, name), *args)
        assert proxy.get() == model.get()


class ValueModel:
    def __init__(self) -> None:
        self.value = None

    def get(self):
        return self.value

    def set(self, v):
        self.value = v

    def get_and_set(self, v):
        old, self.value = self.value, v
        return old

    def compare_and_set(self, expected, new):
        if self.value == expected:
            self.value = new
            return True
        return False


value_ops = st.one_of(
    st.tuples(st.just("get")),
    st.tuples(st.just("set"), values),
    st.tuples(st.just("get_and_set"), values),
    st.tuples(st.just("compare_and_set"), values, values),
)


@SETTINGS
@given(st.lists(value_ops, max_size=20))
def test_value_matches_a_variable(ops):
    model, proxy = ValueModel(), spindle.Value()
    for name, *args in ops:
        assert outcome(getattr(proxy, name), *args) == outcome(getattr(model, name), *args)


# -- Queues ------------------------------------------------------------------------------

items = st.integers(0, 9) | st.tuples(st.integers(0, 3), st.text(alphabet="ab", max_size=1))
queue_ops = st.one_of(
    st.tuples(st.just("put_nowait"), items),
    st.tuples(st.just("get_nowait")),
    st.tuples(st.just("qsize")),
    st.tuples(st.just("empty")),
    st.tuples(st.just("full")),
)


def run_queue_ops(pair, maxsize, ops):
    spindle_cls, stdlib_cls = pair
    if stdlib_cls is queue.PriorityQueue:  # keep items comparable, like a real program
        ops = [op for op in ops if op[0] != "put_nowait" or isinstance(op[1], int)]
    model, proxy = stdlib_cls(maxsize), spindle_cls(maxsize)
    for name, *args in ops:
        got = outcome(getattr(proxy, name), *args)
        want = outcome(getattr(model, name), *args)
        assert got == want, (name, args)
    assert proxy.maxsize == model.maxsize


QUEUES = [
    (spindle.Queue, queue.Queue),
    (spindle.LifoQueue, queue.LifoQueue),
    (spindle.PriorityQueue, queue.PriorityQueue),
]


@SETTINGS
@given(st.sampled_from(QUEUES), st.integers(0, 4), st.lists(queue_ops, max_size=25))
def test_queues_match_the_queue_module(pair, maxsize, ops):
    run_queue_ops(pair, maxsize, ops)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=15))
def test_priority_queue_is_fifo_among_equal_items(entries):
    # 2 and 2.0 are equal items but distinguishable: equal items must come out FIFO.
    proxy = spindle.PriorityQueue()
    for prio, as_float in entries:
        proxy.put(float(prio) if as_float else prio)
    got = [proxy.get_nowait() for _ in entries]
    expected = sorted((float(p) if f else p for p, f in entries), key=lambda x: x)  # stable
    assert [(type(x), x) for x in got] == [(type(x), x) for x in expected]
