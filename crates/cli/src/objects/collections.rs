//! `map` (a `Dict`), `treemap` (a `SortedDict`: keys in order) and `list` (a `List`).

use spindle_core::Value;

use super::args::{flag, int_arg, typed, Slot};
use super::{Exit, Invocation, Object, Op, Out, Outcome, Spec, DELETE};
use crate::client::Failure;

macro_rules! map_ops {
    ($($extra:expr),* $(,)?) => {
        &[
            Op { name: "put", aliases: &[], usage: "-1 KEY -2 VALUE", help: "set KEY to VALUE" },
            Op { name: "get", aliases: &[], usage: "-1 KEY", help: "print KEY's value (nothing, and status 1, when absent)" },
            Op { name: "remove", aliases: &[], usage: "-1 KEY", help: "remove KEY; prints the value it had" },
            Op { name: "containsKey", aliases: &[], usage: "-1 KEY", help: "print true or false" },
            Op { name: "size", aliases: &[], usage: "", help: "print the number of keys" },
            Op { name: "isEmpty", aliases: &[], usage: "", help: "print true or false" },
            Op { name: "keySet", aliases: &["keys"], usage: "", help: "print the keys, one per line" },
            Op { name: "values", aliases: &[], usage: "", help: "print the values, one per line" },
            Op { name: "entrySet", aliases: &["list"], usage: "", help: "print KEY=VALUE lines" },
            Op {
                name: "merge",
                aliases: &[],
                usage: "-1 KEY -2 VALUE [-3 OP]",
                help: "combine VALUE into KEY's value with OP (default replace); prints the result",
            },
            Op {
                name: "mergeAll",
                aliases: &[],
                usage: "-1 KEY=VALUE [-1 KEY=VALUE ...] [-2 OP]",
                help: "merge every pair at once with OP (default replace)",
            },
            Op { name: "clear", aliases: &[], usage: "", help: "remove every key" },
            $($extra,)*
            DELETE,
        ]
    };
}

/// `-1` and `-2`, as every collection takes them.
const FIRST_ARG: super::args::Flag = flag(
    Slot::One,
    "-1",
    "ARG",
    "the operation's first argument (repeat it for a list)",
);
const SECOND_ARG: super::args::Flag = flag(Slot::Two, "-2", "ARG", "its second argument");

const MAP_FLAGS: &[super::args::Flag] = &[
    FIRST_ARG,
    SECOND_ARG,
    flag(Slot::Three, "-3", "OP", "its third argument"),
    // CRUCIAL's containsKey took its key as -a.
    flag(Slot::One, "-a", "KEY", ""),
];

const MAP_NOTES: &str = "OP is one of sum, min, max, append, union, replace: the merge runs in the server.\n\
Example: map -n words mergeAll -1 \"a=1\" -1 \"b=1\" -2 sum; map -n words get -1 a";

pub(crate) static MAP: Spec = Spec {
    name: "map",
    spindle: "Dict",
    about: "a shared dictionary",
    ops: map_ops!(),
    flags: MAP_FLAGS,
    notes: MAP_NOTES,
    run: run_map,
};

pub(crate) static TREEMAP: Spec = Spec {
    name: "treemap",
    spindle: "SortedDict",
    about: "a shared dictionary kept in key order",
    ops: map_ops!(
        Op {
            name: "first",
            aliases: &["firstEntry"],
            usage: "",
            help: "print the smallest key's KEY=VALUE (status 1 when empty)",
        },
        Op {
            name: "last",
            aliases: &["lastEntry"],
            usage: "",
            help: "print the largest key's KEY=VALUE (status 1 when empty)",
        },
        Op {
            name: "range",
            aliases: &["subMap"],
            usage: "[-1 LOW] [-2 HIGH]",
            help: "print KEY=VALUE lines with LOW <= KEY < HIGH",
        },
    ),
    flags: MAP_FLAGS,
    notes: MAP_NOTES,
    run: run_map,
};

const MERGE_OPS: [&str; 6] = ["sum", "min", "max", "append", "union", "replace"];

fn merge_op(inv: &Invocation, slot: Slot, flag: &str) -> Result<&'static str, Exit> {
    match inv.optional(slot, flag)? {
        None => Ok("replace"),
        Some(op) => MERGE_OPS
            .iter()
            .find(|known| known.eq_ignore_ascii_case(op))
            .copied()
            .ok_or_else(|| Exit::Usage(format!("unknown merge '{op}' (one of: {})", MERGE_OPS.join(", ")))),
    }
}

fn key(inv: &Invocation) -> Result<Value, Exit> {
    inv.single(Slot::One, "-1 KEY").map(typed)
}

fn run_map(inv: &Invocation, map: &mut Object, out: &mut Out) -> Outcome {
    // Arguments first: a usage error must not have created anything.
    let (method, args) = match inv.op {
        "put" => ("setitem", vec![key(inv)?, typed(inv.single(Slot::Two, "-2 VALUE")?)]),
        "get" => ("getitem", vec![key(inv)?]),
        // pop(key, None): the value, or nothing when absent (CRUCIAL printed nothing too).
        "remove" => ("pop", vec![key(inv)?, Value::Nil]),
        "containsKey" => ("contains", vec![key(inv)?]),
        "size" | "isEmpty" => ("len", vec![]),
        "keySet" => ("keys", vec![]),
        "values" => ("values", vec![]),
        "entrySet" => ("items", vec![]),
        "merge" => {
            let value = typed(inv.single(Slot::Two, "-2 VALUE")?);
            (
                "merge",
                vec![key(inv)?, value, merge_op(inv, Slot::Three, "-3 OP")?.into()],
            )
        }
        "mergeAll" => {
            let pairs = inv.values(Slot::One);
            if pairs.is_empty() {
                return Err(Exit::Usage("mergeAll needs -1 KEY=VALUE (repeat it for more)".into()));
            }
            let mut entries = Vec::with_capacity(pairs.len());
            for pair in pairs {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| Exit::Usage(format!("mergeAll takes -1 KEY=VALUE, got '{pair}'")))?;
                entries.push(Value::Array(vec![typed(k), typed(v)]));
            }
            (
                "merge_many",
                vec![Value::Array(entries), merge_op(inv, Slot::Two, "-2 OP")?.into()],
            )
        }
        "clear" => ("clear", vec![]),
        "first" => ("first", vec![]),
        "last" => ("last", vec![]),
        "range" => {
            let low = inv.optional(Slot::One, "-1 LOW")?.map_or(Value::Nil, typed);
            let high = inv.optional(Slot::Two, "-2 HIGH")?.map_or(Value::Nil, typed);
            ("range", vec![low, high])
        }
        other => unreachable!("map operation {other}"),
    };
    map.ensure(vec![])?;
    let reply = match map.call(method, args) {
        Ok(reply) => reply,
        // A missing key (get) or an empty map (first, last): nothing to print.
        Err(e) if Object::is(&e, "KeyError") => return Err(Exit::Silent(1)),
        Err(e) => return Err(map.error(e)),
    };
    match inv.op {
        "get" | "merge" | "values" | "keySet" => out.lines(&reply),
        "remove" | "containsKey" | "size" => match reply {
            Value::Nil => Ok(()),
            reply => out.line(&reply),
        },
        "isEmpty" => out.line(&Value::Boolean(reply.as_u64() == Some(0))),
        "entrySet" | "range" => out.entries(&reply),
        "first" | "last" => out.entries(&Value::Array(vec![reply])),
        _ => Ok(()),
    }
}

pub(crate) static LIST: Spec = Spec {
    name: "list",
    spindle: "List",
    about: "a shared list",
    ops: &[
        Op {
            name: "add",
            aliases: &[],
            usage: "-1 VALUE [-1 VALUE ...]",
            help: "append the values; prints true",
        },
        Op {
            name: "get",
            aliases: &[],
            usage: "-1 INDEX",
            help: "print the item at INDEX (negative from the end)",
        },
        Op {
            name: "set",
            aliases: &[],
            usage: "-1 INDEX -2 VALUE",
            help: "replace the item at INDEX",
        },
        Op {
            name: "size",
            aliases: &[],
            usage: "",
            help: "print the number of items",
        },
        Op {
            name: "isEmpty",
            aliases: &[],
            usage: "",
            help: "print true or false",
        },
        Op {
            name: "list",
            aliases: &["all", "toArray"],
            usage: "",
            help: "print every item, one per line",
        },
        Op {
            name: "contains",
            aliases: &[],
            usage: "-1 VALUE",
            help: "print true or false",
        },
        Op {
            name: "indexOf",
            aliases: &[],
            usage: "-1 VALUE",
            help: "print the first index of VALUE, or -1",
        },
        Op {
            name: "remove",
            aliases: &[],
            usage: "-1 VALUE",
            help: "remove the first VALUE; prints true or false",
        },
        Op {
            name: "pop",
            aliases: &[],
            usage: "",
            help: "remove the last item and print it (status 1 when empty)",
        },
        Op {
            name: "clear",
            aliases: &[],
            usage: "",
            help: "remove every item",
        },
        DELETE,
    ],
    flags: &[FIRST_ARG, SECOND_ARG],
    notes: "Example: list -n urls add -1 a -1 b; for u in $(list -n urls list); do ...; done",
    run: run_list,
};

fn run_list(inv: &Invocation, list: &mut Object, out: &mut Out) -> Outcome {
    let index = || int_arg(inv.single(Slot::One, "-1 INDEX")?, "INDEX");
    let value = || inv.single(Slot::One, "-1 VALUE").map(typed);
    let (method, args) = match inv.op {
        "add" => match inv.values(Slot::One) {
            [] => return Err(Exit::Usage("add needs -1 VALUE".into())),
            [one] => ("append", vec![typed(one)]),
            many => ("extend", vec![Value::Array(many.iter().map(|v| typed(v)).collect())]),
        },
        "get" => ("getitem", vec![index()?.into()]),
        "set" => (
            "setitem",
            vec![index()?.into(), typed(inv.single(Slot::Two, "-2 VALUE")?)],
        ),
        "size" | "isEmpty" => ("len", vec![]),
        "list" => ("items", vec![]),
        "contains" => ("contains", vec![value()?]),
        "indexOf" => ("index", vec![value()?]),
        "remove" => ("remove", vec![value()?]),
        "pop" => ("pop", vec![]),
        "clear" => ("clear", vec![]),
        other => unreachable!("list operation {other}"),
    };
    list.ensure(vec![])?;
    let reply = list.call(method, args);
    let missing = |e: &Failure| Object::is(e, "ValueError");
    let reply = match (inv.op, reply) {
        ("indexOf", Err(e)) if missing(&e) => Value::from(-1),
        ("remove", Err(e)) if missing(&e) => Value::Boolean(false),
        ("remove", Ok(_)) | ("add", Ok(_)) => Value::Boolean(true),
        ("get" | "set", Err(e)) if Object::is(&e, "IndexError") => {
            return Err(Exit::Error(format!("'{}' has no index {}", list.key, index()?)))
        }
        ("pop", Err(e)) if Object::is(&e, "IndexError") => return Err(Exit::Error(format!("'{}' is empty", list.key))),
        (_, Err(e)) => return Err(list.error(e)),
        (_, Ok(reply)) => reply,
    };
    match inv.op {
        "set" | "clear" => Ok(()),
        "isEmpty" => out.line(&Value::Boolean(reply.as_u64() == Some(0))),
        "list" => out.lines(&reply),
        _ => out.line(&reply),
    }
}
