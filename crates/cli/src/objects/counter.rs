//! `counter`: a shared 64-bit integer (`Counter`).

use super::args::{flag, int_arg, long_flag, Slot};
use super::{Exit, Invocation, Object, Op, Out, Outcome, Spec, DELETE};

pub(crate) static COUNTER: Spec = Spec {
    name: "counter",
    spindle: "Counter",
    about: "a shared 64-bit integer",
    ops: &[
        Op {
            name: "reset",
            aliases: &[],
            usage: "",
            help: "set it to 0",
        },
        Op {
            name: "increment",
            aliases: &[],
            usage: "[-1 N | -i N]",
            help: "add N (default 1); prints the new value",
        },
        Op {
            name: "decrement",
            aliases: &[],
            usage: "[-1 N | -i N]",
            help: "subtract N (default 1); prints the new value",
        },
        Op {
            name: "tally",
            aliases: &["get"],
            usage: "",
            help: "print the value",
        },
        Op {
            name: "set",
            aliases: &[],
            usage: "-1 N",
            help: "set it to N",
        },
        Op {
            name: "compareAndSet",
            aliases: &[],
            usage: "-1 EXPECTED -2 NEW",
            help: "set it to NEW if it is EXPECTED; prints true or false",
        },
        DELETE,
    ],
    flags: &[
        flag(Slot::One, "-1", "N", "the operation's first argument"),
        flag(Slot::Two, "-2", "N", "its second argument"),
        long_flag(Slot::Increment, "-i", "--increment", "N", "the increment (as -1)"),
        // CRUCIAL's initial count, used when the counter is created.
        flag(Slot::Initial, "-c", "N", ""),
    ],
    notes: "Example: counter -n hits reset; counter -n hits increment -i 5; counter -n hits tally",
    run,
};

fn run(inv: &Invocation, counter: &mut Object, out: &mut Out) -> Outcome {
    let initial = match inv.optional(Slot::Initial, "-c N")? {
        Some(text) => int_arg(text, "-c")?,
        None => 0,
    };
    // Read every argument before the first call, so a usage error changes nothing.
    let reply = match inv.op {
        "reset" => {
            counter.ensure(vec![initial.into()])?;
            counter.ask("set", vec![0.into()])?;
            None
        }
        "increment" | "decrement" => {
            let step = step(inv)?;
            let delta = if inv.op == "increment" {
                Some(step)
            } else {
                step.checked_neg()
            };
            let delta = delta.ok_or_else(|| Exit::Usage(format!("{step} cannot be subtracted")))?;
            counter.ensure(vec![initial.into()])?;
            Some(counter.ask("add", vec![delta.into()])?)
        }
        "tally" => {
            counter.ensure(vec![initial.into()])?;
            Some(counter.ask("get", vec![])?)
        }
        "set" => {
            let n = int_arg(inv.single(Slot::One, "-1 N")?, "the value")?;
            counter.ensure(vec![initial.into()])?;
            counter.ask("set", vec![n.into()])?;
            None
        }
        "compareAndSet" => {
            let expected = int_arg(inv.single(Slot::One, "-1 EXPECTED")?, "EXPECTED")?;
            let new = int_arg(inv.single(Slot::Two, "-2 NEW")?, "NEW")?;
            counter.ensure(vec![initial.into()])?;
            Some(counter.ask("compare_and_set", vec![expected.into(), new.into()])?)
        }
        other => unreachable!("counter operation {other}"),
    };
    match reply {
        Some(value) => out.line(&value),
        None => Ok(()),
    }
}

/// `-i N` or `-1 N` (CRUCIAL's shell takes both), 1 when neither is given.
fn step(inv: &Invocation) -> Result<i64, Exit> {
    let by_i = inv.optional(Slot::Increment, "-i N")?;
    let by_1 = inv.optional(Slot::One, "-1 N")?;
    match (by_i, by_1) {
        (Some(_), Some(_)) => Err(Exit::Usage(format!("{} takes -i N or -1 N, not both", inv.op))),
        (Some(text), None) | (None, Some(text)) => int_arg(text, "the increment"),
        (None, None) => Ok(1),
    }
}
