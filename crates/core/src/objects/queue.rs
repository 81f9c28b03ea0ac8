//! `Queue`, `LifoQueue` and `PriorityQueue`: Python's `queue` module in the server. The three
//! differ only in which item `get` takes, so they share one implementation (as queue.py does).
//!
//! Invariants: getters park only while the queue is empty, putters only while it is full, so
//! a `put` hands its item to the oldest getter and a `get` admits the oldest putter.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use crate::object::args;
use crate::value::{approx_size, cmp_values};
use crate::{ConnId, Ctx, Error, ErrorKind, Object, Step, Token, Value};

use super::snapshot::{self, Fields};
use super::waiters::WaitQueue;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Fifo,
    Lifo,
    Priority,
}

impl Order {
    fn type_name(self) -> &'static str {
        match self {
            Order::Fifo => "Queue",
            Order::Lifo => "LifoQueue",
            Order::Priority => "PriorityQueue",
        }
    }
}

#[derive(Clone)]
/// A priority item: value order, then arrival order so equal items come out FIFO.
struct Ranked {
    value: Value,
    seq: u64,
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_values(&self.value, &other.value).then(self.seq.cmp(&other.seq))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ranked {}

#[derive(Clone)]
enum Store {
    Deque(VecDeque<Value>),
    Heap(BinaryHeap<Reverse<Ranked>>, u64),
}

#[derive(Clone)]
/// The queued items, with the running total of their approximate sizes so
/// [`Object::size`] is O(1).
struct Items {
    store: Store,
    bytes: usize,
}

impl Items {
    fn new(order: Order) -> Items {
        let store = match order {
            Order::Priority => Store::Heap(BinaryHeap::new(), 0),
            _ => Store::Deque(VecDeque::new()),
        };
        Items { store, bytes: 0 }
    }

    fn len(&self) -> usize {
        match &self.store {
            Store::Deque(d) => d.len(),
            Store::Heap(h, _) => h.len(),
        }
    }

    fn push(&mut self, v: Value) {
        self.bytes += approx_size(&v);
        match &mut self.store {
            Store::Deque(d) => d.push_back(v),
            Store::Heap(h, seq) => {
                *seq += 1;
                h.push(Reverse(Ranked { value: v, seq: *seq }));
            }
        }
    }

    fn pop(&mut self, order: Order) -> Option<Value> {
        let v = match &mut self.store {
            Store::Deque(d) if order == Order::Lifo => d.pop_back(),
            Store::Deque(d) => d.pop_front(),
            Store::Heap(h, _) => h.pop().map(|Reverse(r)| r.value),
        }?;
        self.bytes -= approx_size(&v);
        Some(v)
    }

    /// The items oldest put first (deques), or in `get` order (heap; equal items by age).
    fn to_vec(&self) -> Vec<Value> {
        match &self.store {
            Store::Deque(d) => d.iter().cloned().collect(),
            Store::Heap(h, _) => {
                let mut ranked: Vec<&Ranked> = h.iter().map(|Reverse(r)| r).collect();
                // Arrival numbers are unique: no two entries compare equal.
                ranked.sort_unstable();
                ranked.into_iter().map(|r| r.value.clone()).collect()
            }
        }
    }
}

#[derive(Clone)]
pub struct Queue {
    order: Order,
    /// `None`: unbounded.
    maxsize: Option<usize>,
    maxsize_arg: i64,
    items: Items,
    /// Items put and not yet marked done (`task_done`), for `join`.
    unfinished: u64,
    getters: WaitQueue<()>,
    putters: WaitQueue<Value>,
    /// Bytes of the items parked putters hold: the queue holds them too (`--max-memory`).
    parked_bytes: usize,
    joiners: WaitQueue<()>,
}

fn empty() -> Error {
    Error::new(ErrorKind::Empty, "the queue is empty")
}

fn full() -> Error {
    Error::new(ErrorKind::Full, "the queue is full")
}

/// Read `[block=true], [timeout]`: `None` means "answer now, do not park".
fn block_args(method: &str, a: &[Value], first: usize, ctx: &Ctx) -> Result<Option<Option<std::time::Instant>>, Error> {
    let block = args::bool_or(method, a, first, "block", true)?;
    let timeout = args::timeout(method, a, first + 1)?;
    // Like queue.Queue, a non-blocking call ignores its timeout.
    Ok(match (block, timeout) {
        (false, _) => None,
        (true, Some(0.0)) => None,
        (true, t) => Some(ctx.deadline(t)),
    })
}

impl Queue {
    pub fn new(a: &[Value], order: Order) -> Result<Self, Error> {
        let name = order.type_name();
        args::arity(name, a, 0, 1)?;
        let maxsize_arg = args::int_or(name, a, 0, "maxsize", 0)?;
        let items = Items::new(order);
        Ok(Queue {
            order,
            maxsize: usize::try_from(maxsize_arg).ok().filter(|&n| n > 0),
            maxsize_arg,
            items,
            unfinished: 0,
            getters: WaitQueue::default(),
            putters: WaitQueue::default(),
            parked_bytes: 0,
            joiners: WaitQueue::default(),
        })
    }

    pub(crate) fn restore(state: &Value, order: Order) -> Result<Self, Error> {
        let f = Fields::open(order.type_name(), state, &["maxsize", "items", "unfinished"])?;
        let mut q = Queue::new(&[Value::from(f.i64("maxsize")?)], order).map_err(|e| f.wrap(e))?;
        let items = f.array("items")?;
        if q.maxsize.is_some_and(|m| items.len() > m) {
            return Err(f.corrupt(format!("{} items in a queue of maxsize {}", items.len(), q.maxsize_arg)));
        }
        // Pushed in snapshot order, equal priority items keep their relative age.
        for item in items {
            q.items.push(item.clone());
        }
        q.unfinished = f.u64("unfinished")?;
        Ok(q)
    }

    fn is_full(&self) -> bool {
        self.maxsize.is_some_and(|m| self.items.len() >= m)
    }

    /// Accept an item: straight to the oldest parked getter, else into the queue.
    fn accept(&mut self, item: Value, ctx: &mut Ctx) {
        self.unfinished = self.unfinished.saturating_add(1);
        match self.getters.pop() {
            Some(g) => ctx.deliver(g.token, Ok(item)),
            None => self.items.push(item),
        }
    }

    /// Take an item, letting the oldest parked putter in behind it.
    fn take(&mut self, ctx: &mut Ctx) -> Option<Value> {
        let item = self.items.pop(self.order)?;
        if let Some(w) = self.putters.pop() {
            // A parked put completes now: its item counts for task_done/join like any other.
            self.parked_bytes -= approx_size(&w.data);
            self.unfinished = self.unfinished.saturating_add(1);
            self.items.push(w.data);
            ctx.deliver(w.token, Ok(Value::Nil));
        }
        Some(item)
    }
}

impl Object for Queue {
    fn type_name(&self) -> &'static str {
        self.order.type_name()
    }

    fn is_mutating(&self, method: &str) -> bool {
        matches!(method, "put" | "get" | "task_done")
    }

    fn may_grow(&self, method: &str) -> bool {
        method == "put"
    }

    fn size(&self) -> usize {
        self.items.bytes + self.parked_bytes
    }

    fn snapshot(&self) -> Option<Value> {
        // Parked putters' items are not in the queue yet: their put belongs to a live call.
        Some(snapshot::encode(vec![
            ("maxsize", Value::from(self.maxsize_arg)),
            ("items", Value::Array(self.items.to_vec())),
            ("unfinished", Value::from(self.unfinished)),
        ]))
    }

    fn apply(&mut self, method: &str, a: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "put" => {
                args::arity(method, a, 1, 3)?;
                let park = block_args(method, a, 1, ctx)?;
                let item = a[0].clone();
                if !self.is_full() {
                    self.accept(item, ctx);
                    Value::Nil
                } else {
                    match park {
                        Some(deadline) => {
                            self.parked_bytes += approx_size(&item);
                            return Ok(self.putters.park(ctx, deadline, item));
                        }
                        None => return Err(full()),
                    }
                }
            }
            "get" => {
                args::arity(method, a, 0, 2)?;
                let park = block_args(method, a, 0, ctx)?;
                match self.take(ctx) {
                    Some(item) => item,
                    None => match park {
                        Some(deadline) => return Ok(self.getters.park(ctx, deadline, ())),
                        None => return Err(empty()),
                    },
                }
            }
            "qsize" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.items.len() as u64)
            }
            "empty" => {
                args::arity(method, a, 0, 0)?;
                Value::Boolean(self.items.len() == 0)
            }
            "full" => {
                args::arity(method, a, 0, 0)?;
                Value::Boolean(self.is_full())
            }
            "maxsize" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.maxsize_arg)
            }
            "task_done" => {
                args::arity(method, a, 0, 0)?;
                if self.unfinished == 0 {
                    return Err(Error::value("task_done() called too many times"));
                }
                self.unfinished -= 1;
                if self.unfinished == 0 {
                    for w in self.joiners.drain() {
                        ctx.deliver(w.token, Ok(Value::Boolean(true)));
                    }
                }
                Value::Nil
            }
            "join" => {
                args::arity(method, a, 0, 1)?;
                let timeout = args::timeout(method, a, 0)?;
                if self.unfinished == 0 {
                    Value::Boolean(true)
                } else if timeout == Some(0.0) {
                    Value::Boolean(false)
                } else {
                    return Ok(self.joiners.park(ctx, ctx.deadline(timeout), ()));
                }
            }
            _ => return Err(super::unknown_method(self.type_name(), method)),
        };
        Ok(Step::Reply(v))
    }

    fn expire(&mut self, waiter: Token, ctx: &mut Ctx) {
        // A token waits in one of the three queues at most: stop at the one that answers it.
        if self.getters.expire_with(waiter, ctx, Err(empty())) {
            return;
        }
        if let Some(w) = self.putters.take_due(waiter, ctx) {
            self.parked_bytes -= approx_size(&w.data);
            return ctx.deliver(w.token, Err(full()));
        }
        self.joiners.expire_with(waiter, ctx, Ok(Value::Boolean(false)));
    }

    fn disconnect(&mut self, conn: ConnId, _ctx: &mut Ctx) {
        // A withdrawn put never happened: its item is dropped with it.
        self.getters.remove_conn(conn);
        for w in self.putters.remove_conn(conn) {
            self.parked_bytes -= approx_size(&w.data);
        }
        self.joiners.remove_conn(conn);
    }

    fn drain_waiters(&mut self, ctx: &mut Ctx, reply: &Error) {
        self.getters.fail_all(ctx, reply);
        self.putters.fail_all(ctx, reply);
        self.parked_bytes = 0;
        self.joiners.fail_all(ctx, reply);
    }

    fn has_waiters(&self) -> bool {
        !(self.getters.is_empty() && self.putters.is_empty() && self.joiners.is_empty())
    }

    fn tracks_connections(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

    fn q(kind: &str, maxsize: i64) -> Harness {
        let mut p = Harness::new();
        p.create_ok(kind, "q", vec![maxsize.into()]);
        p
    }

    fn drain(p: &mut Harness, kind: &str) -> Vec<Value> {
        let mut out = Vec::new();
        while p.ok(kind, "q", "qsize", vec![]) != Value::from(0) {
            out.push(p.ok(kind, "q", "get", vec![]));
        }
        out
    }

    #[test]
    fn three_orders() {
        for (kind, want) in [
            ("Queue", [3, 1, 2, 1]),
            ("LifoQueue", [1, 2, 1, 3]),
            ("PriorityQueue", [1, 1, 2, 3]),
        ] {
            let mut p = q(kind, 0);
            for v in [3, 1, 2, 1] {
                p.ok(kind, "q", "put", vec![v.into()]);
            }
            let got = drain(&mut p, kind);
            assert_eq!(got, want.iter().map(|&v| Value::from(v)).collect::<Vec<_>>(), "{kind}");
        }
    }

    #[test]
    fn priority_is_fifo_among_equal_items() {
        let mut p = q("PriorityQueue", 0);
        // [1, "b"] and [1.0, "b"] are equal items: they must come out in put order.
        let items = [
            arr(vec![2.into(), "a".into()]),
            arr(vec![1.into(), "b".into()]),
            arr(vec![Value::F64(1.0), "b".into()]),
            arr(vec![1.into(), "a".into()]),
        ];
        for it in &items {
            p.ok("PriorityQueue", "q", "put", vec![it.clone()]);
        }
        let got = drain(&mut p, "PriorityQueue");
        assert_eq!(
            got,
            vec![items[3].clone(), items[1].clone(), items[2].clone(), items[0].clone()]
        );
    }

    #[test]
    fn get_parks_until_put_in_order() {
        let mut p = q("Queue", 0);
        assert_eq!(p.err("Queue", "q", "get", vec![false.into()]).kind, ErrorKind::Empty);
        assert_eq!(
            p.err("Queue", "q", "get", vec![true.into(), 0.into()]).kind,
            ErrorKind::Empty
        );
        let t2 = p.park(2, "Queue", "q", "get", vec![]);
        let t3 = p.park(3, "Queue", "q", "get", vec![true.into(), 1.into()]);
        let t4 = p.park(4, "Queue", "q", "get", vec![]);
        let (_, out) = p.call(&who(1), 0, "Queue", "q", "put", vec!["a".into()]);
        assert_eq!(value_of(&out, t2), Value::from("a"));
        assert_eq!(error_of(&p.advance(1.0), t3).kind, ErrorKind::Empty);
        let (_, out) = p.call(&who(1), 0, "Queue", "q", "put", vec!["b".into()]);
        assert_eq!(value_of(&out, t4), Value::from("b"));
        assert_eq!(p.ok("Queue", "q", "qsize", vec![]), Value::from(0));
    }

    #[test]
    fn bounded_put_parks_until_a_get() {
        let mut p = q("Queue", 2);
        p.ok("Queue", "q", "put", vec![1.into()]);
        p.ok("Queue", "q", "put", vec![2.into()]);
        assert_eq!(p.ok("Queue", "q", "full", vec![]), Value::Boolean(true));
        assert_eq!(
            p.err("Queue", "q", "put", vec![3.into(), false.into()]).kind,
            ErrorKind::Full
        );
        assert_eq!(
            p.err("Queue", "q", "put", vec![3.into(), true.into(), 0.into()]).kind,
            ErrorKind::Full
        );
        let t2 = p.park(2, "Queue", "q", "put", vec![3.into()]);
        let t3 = p.park(3, "Queue", "q", "put", vec![4.into(), true.into(), 2.into()]);
        p.park(4, "Queue", "q", "put", vec![5.into()]);
        let (t, out) = p.call(&who(1), 0, "Queue", "q", "get", vec![]);
        assert_eq!(value_of(&out, t), Value::from(1));
        assert_eq!(value_of(&out, t2), Value::Nil);
        assert_eq!(error_of(&p.advance(2.0), t3).kind, ErrorKind::Full);
        // The timed-out put never happened; the withdrawn one of a dead connection neither.
        let t5 = p.park(5, "Queue", "q", "put", vec![6.into()]);
        assert!(p.disconnect(4).is_empty());
        let (_, out) = p.call(&who(1), 0, "Queue", "q", "get", vec![]);
        assert_eq!(value_of(&out, t5), Value::Nil);
        assert_eq!(drain(&mut p, "Queue"), vec![Value::from(3), Value::from(6)]);
        assert_eq!(p.ok("Queue", "q", "maxsize", vec![]), Value::from(2));
        assert_eq!(p.ok("Queue", "q", "empty", vec![]), Value::Boolean(true));
        // Items 1, 2, 3 and 6 were put (two after parking): four task_done calls, no more.
        for _ in 0..4 {
            p.ok("Queue", "q", "task_done", vec![]);
        }
        assert_eq!(p.ok("Queue", "q", "join", vec![0.into()]), Value::Boolean(true));
        assert_eq!(p.err("Queue", "q", "task_done", vec![]).kind, ErrorKind::ValueError);
    }

    #[test]
    fn join_and_task_done() {
        let mut p = q("Queue", 0);
        assert_eq!(p.ok("Queue", "q", "join", vec![]), Value::Boolean(true));
        assert_eq!(p.err("Queue", "q", "task_done", vec![]).kind, ErrorKind::ValueError);
        p.ok("Queue", "q", "put", vec![1.into()]);
        p.ok("Queue", "q", "put", vec![2.into()]);
        assert_eq!(p.ok("Queue", "q", "join", vec![0.into()]), Value::Boolean(false));
        let t2 = p.park(2, "Queue", "q", "join", vec![]);
        let t3 = p.park(3, "Queue", "q", "join", vec![1.into()]);
        assert_eq!(value_of(&p.advance(1.0), t3), Value::Boolean(false));
        p.ok("Queue", "q", "get", vec![]);
        p.ok("Queue", "q", "task_done", vec![]);
        let (_, out) = p.call(&who(1), 0, "Queue", "q", "task_done", vec![]);
        assert_eq!(value_of(&out, t2), Value::Boolean(true));
        assert_eq!(p.err("Queue", "q", "task_done", vec![]).kind, ErrorKind::ValueError);
    }

    #[test]
    fn errors_delete_and_mutating() {
        let mut p = q("LifoQueue", -5);
        assert_eq!(p.ok("LifoQueue", "q", "maxsize", vec![]), Value::from(-5));
        assert_eq!(p.ok("LifoQueue", "q", "full", vec![]), Value::Boolean(false));
        assert_eq!(p.err("LifoQueue", "q", "put", vec![]).kind, ErrorKind::BadArguments);
        assert_eq!(
            p.err("LifoQueue", "q", "get", vec![true.into(), (-1).into()]).kind,
            ErrorKind::ValueError
        );
        // Non-blocking ignores its timeout, as in queue.Queue.
        assert_eq!(
            p.err("LifoQueue", "q", "get", vec![false.into(), 5.into()]).kind,
            ErrorKind::Empty
        );
        p.ok("LifoQueue", "q", "put", vec![1.into()]);
        p.ok("LifoQueue", "q", "get", vec![]);
        let t2 = p.park(2, "LifoQueue", "q", "get", vec![]);
        let t3 = p.park(3, "LifoQueue", "q", "join", vec![]);
        assert!(p.p.detach("LifoQueue", "q").is_err());
        let out = p.delete("q");
        assert_eq!(error_of(&out, t2).kind, ErrorKind::NotFound);
        assert_eq!(error_of(&out, t3).kind, ErrorKind::NotFound);
        let o = Queue::new(&[], Order::Fifo).unwrap();
        for m in ["qsize", "empty", "full", "maxsize", "join"] {
            assert!(!o.is_mutating(m), "{m}");
        }
        for m in ["put", "get", "task_done"] {
            assert!(o.is_mutating(m), "{m}");
        }
    }
}
