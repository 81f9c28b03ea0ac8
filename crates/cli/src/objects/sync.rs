//! Synchronization between processes: `barrier` (a `Barrier`), `rdv` (a rendezvous, a
//! `Future`), `semaphore` (a `Semaphore`) and `latch` (a `CountDownLatch`). Their waits park
//! in the server, for as long as it takes unless `-t SECONDS` says otherwise.

use spindle_core::Value;

use super::args::{flag, int_arg, long_flag, typed, Slot};
use super::{Exit, Invocation, Object, Op, Out, Outcome, Spec, DELETE};

const TIMEOUT: super::args::Flag = long_flag(
    Slot::Timeout,
    "-t",
    "--timeout",
    "SECONDS",
    "give up after this long (status 1)",
);

fn seconds(timeout: Option<f64>) -> String {
    timeout.map_or_else(String::new, |t| format!(" after {t} s"))
}

pub(crate) static BARRIER: Spec = Spec {
    name: "barrier",
    spindle: "Barrier",
    about: "a cyclic barrier: PARTIES processes wait for each other",
    ops: &[
        Op {
            name: "await",
            aliases: &["wait"],
            usage: "[-p PARTIES] [-t SECONDS]",
            help: "wait until PARTIES processes are here; prints the arrival number, 1 to PARTIES",
        },
        Op {
            name: "reset",
            aliases: &[],
            usage: "",
            help: "break the waiting parties out (their await fails) and start afresh",
        },
        DELETE,
    ],
    flags: &[
        long_flag(
            Slot::Parties,
            "-p",
            "--parties",
            "PARTIES",
            "how many processes meet (needed to create the barrier)",
        ),
        TIMEOUT,
    ],
    notes: "A timeout breaks the barrier for every waiting party, as in Python's threading.\n\
Example: for i in 1 2 3 4; do barrier -n b -p 4 await & done; wait",
    run: run_barrier,
};

fn run_barrier(inv: &Invocation, barrier: &mut Object, out: &mut Out) -> Outcome {
    let parties = inv.parties("the number of parties", 1)?;
    let timeout = inv.timeout()?;
    if let Some(parties) = parties {
        barrier.ensure(vec![parties.into()])?;
    }
    let (method, args) = match inv.op {
        "await" => ("wait", vec![timeout.map_or(Value::Nil, Value::F64)]),
        "reset" => ("reset", vec![]),
        other => unreachable!("barrier operation {other}"),
    };
    let reply = match inv.op {
        "await" => barrier.call_waiting(method, args, timeout),
        _ => barrier.call(method, args),
    };
    match reply {
        // Python counts arrivals from 0; CRUCIAL's shell printed 1 to PARTIES (scripts grep
        // for the last one).
        Ok(Value::Integer(index)) => out.line(&Value::from(index.as_i64().unwrap_or(0) + 1)),
        Ok(_) => Ok(()),
        Err(e) if Object::is_gone(&e) && parties.is_none() => Err(Exit::Error(format!(
            "'{}' does not exist: give -p PARTIES to create it",
            barrier.key
        ))),
        Err(e) if Object::is(&e, "BrokenBarrier") => Err(Exit::Error(match timeout {
            Some(t) => format!(
                "'{}' is broken (timed out after {t} s, or a party left, or it was reset)",
                barrier.key
            ),
            None => format!(
                "'{}' is broken (a party timed out or left, or it was reset)",
                barrier.key
            ),
        })),
        Err(e) => Err(barrier.error(e)),
    }
}

pub(crate) static RDV: Spec = Spec {
    name: "rdv",
    spindle: "Future",
    about: "a rendezvous: one process publishes a value, any number wait for it",
    ops: &[],
    flags: &[
        flag(
            Slot::One,
            "-1",
            "VALUE",
            "publish VALUE (repeat it for a list); without it, wait for the value and print it",
        ),
        TIMEOUT,
    ],
    notes: "A rendezvous takes one value: publishing twice is an error.\n\
Example: rdv -n addr -1 \"$IP\" & HOST=$(rdv -n addr)",
    run: run_rdv,
};

fn run_rdv(inv: &Invocation, rdv: &mut Object, out: &mut Out) -> Outcome {
    let timeout = inv.timeout()?;
    let value = match inv.values(Slot::One) {
        [] => None,
        [one] => Some(typed(one)),
        many => Some(Value::Array(many.iter().map(|v| typed(v)).collect())),
    };
    rdv.ensure(vec![])?;
    match value {
        Some(value) => match rdv.call("set_result", vec![value]) {
            Ok(_) => Ok(()),
            Err(e) if Object::is(&e, "InvalidState") => Err(Exit::Error(format!("'{}' already has a value", rdv.key))),
            Err(e) => Err(rdv.error(e)),
        },
        None => {
            let args = vec![timeout.map_or(Value::Nil, Value::F64)];
            match rdv.call_waiting("result", args, timeout) {
                Ok(value) => out.lines(&value),
                Err(e) if Object::is(&e, "Timeout") => {
                    Err(Exit::Error(format!("'{}' has no value{}", rdv.key, seconds(timeout))))
                }
                Err(e) if Object::is(&e, "FutureException") => {
                    Err(Exit::Error(format!("'{}' holds an exception, not a value", rdv.key)))
                }
                Err(e) => Err(rdv.error(e)),
            }
        }
    }
}

pub(crate) static SEMAPHORE: Spec = Spec {
    name: "semaphore",
    spindle: "Semaphore",
    about: "counted permits shared by processes",
    ops: &[
        Op {
            name: "acquire",
            aliases: &[],
            usage: "[-t SECONDS]",
            help: "take a permit, waiting for one if needed",
        },
        Op {
            name: "release",
            aliases: &[],
            usage: "[-1 N]",
            help: "give back N permits (default 1)",
        },
        Op {
            name: "available",
            aliases: &["availablePermits"],
            usage: "",
            help: "print the number of free permits",
        },
        DELETE,
    ],
    flags: &[
        long_flag(
            Slot::Parties,
            "-p",
            "--permits",
            "PERMITS",
            "permits when the semaphore is created (default 1)",
        ),
        flag(Slot::One, "-1", "N", "permits to release"),
        TIMEOUT,
        long_flag(Slot::Parties, "-p", "--parties", "PERMITS", ""),
    ],
    notes: "A permit taken here stays taken when the process exits, until a release.\n\
Example: semaphore -n slots -p 4 acquire; work; semaphore -n slots release",
    run: run_semaphore,
};

fn run_semaphore(inv: &Invocation, semaphore: &mut Object, out: &mut Out) -> Outcome {
    let permits = inv.parties("the number of permits", 0)?;
    let timeout = inv.timeout()?;
    let (method, args) = match inv.op {
        // keep = true: this process exits holding the permit, which must not come back then.
        "acquire" => (
            "acquire",
            vec![true.into(), timeout.map_or(Value::Nil, Value::F64), true.into()],
        ),
        "release" => {
            let n = match inv.optional(Slot::One, "-1 N")? {
                Some(text) => int_arg(text, "N")?,
                None => 1,
            };
            ("release", vec![n.into()])
        }
        "available" => ("value", vec![]),
        other => unreachable!("semaphore operation {other}"),
    };
    semaphore.ensure(permits.map(Value::from).into_iter().collect())?;
    let reply = match inv.op {
        "acquire" => semaphore.call_waiting(method, args, timeout),
        _ => semaphore.call(method, args),
    };
    match reply {
        Ok(Value::Boolean(false)) => Err(Exit::Error(format!(
            "'{}' has no free permit{}",
            semaphore.key,
            seconds(timeout)
        ))),
        Ok(value) if inv.op == "available" => out.line(&value),
        Ok(_) => Ok(()),
        Err(e) => Err(semaphore.error(e)),
    }
}

pub(crate) static LATCH: Spec = Spec {
    name: "latch",
    spindle: "CountDownLatch",
    about: "a count down latch: processes wait until COUNT others counted down",
    ops: &[
        Op {
            name: "countDown",
            aliases: &[],
            usage: "",
            help: "count down by one",
        },
        Op {
            name: "await",
            aliases: &["wait"],
            usage: "[-t SECONDS]",
            help: "wait until the count is 0",
        },
        Op {
            name: "count",
            aliases: &["getCount"],
            usage: "",
            help: "print the count",
        },
        DELETE,
    ],
    flags: &[
        long_flag(
            Slot::Parties,
            "-p",
            "--count",
            "COUNT",
            "the count when the latch is created (needed to create it)",
        ),
        TIMEOUT,
        long_flag(Slot::Parties, "-p", "--parties", "COUNT", ""),
    ],
    notes: "Example: latch -n ready -p 3 await & for i in 1 2 3; do latch -n ready -p 3 countDown; done",
    run: run_latch,
};

fn run_latch(inv: &Invocation, latch: &mut Object, out: &mut Out) -> Outcome {
    let count = inv.parties("the count", 0)?;
    let timeout = inv.timeout()?;
    if let Some(count) = count {
        latch.ensure(vec![count.into()])?;
    }
    let (method, args) = match inv.op {
        "countDown" => ("count_down", vec![]),
        "await" => ("wait", vec![timeout.map_or(Value::Nil, Value::F64)]),
        "count" => ("count", vec![]),
        other => unreachable!("latch operation {other}"),
    };
    let reply = match inv.op {
        "await" => latch.call_waiting(method, args, timeout),
        _ => latch.call(method, args),
    };
    match reply {
        Ok(Value::Boolean(false)) => Err(Exit::Error(format!(
            "'{}' is still counting{}",
            latch.key,
            seconds(timeout)
        ))),
        Ok(value) if inv.op == "count" => out.line(&value),
        Ok(_) => Ok(()),
        Err(e) if Object::is_gone(&e) && count.is_none() => Err(Exit::Error(format!(
            "'{}' does not exist: give -p COUNT to create it",
            latch.key
        ))),
        Err(e) => Err(latch.error(e)),
    }
}
